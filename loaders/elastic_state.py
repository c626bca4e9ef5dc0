"""Elastic loader states (see :mod:`episodekit.loaders.elastic`): a rank's state, merging every
rank's states into one global position (:func:`merge_states`), and where a run of any size
resumes from one (:func:`resume_point`). Arithmetic on positions and intervals only."""

from __future__ import annotations

import bisect
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.loaders.elastic_order import GlobalOrder, RunLayout, union

STATE_FORMAT = "episodekit.elastic_state"
STATE_VERSION = 1
IDENTITY = ("plan", "seed", "canonical_bins", "samples_per_bin", "micro_batch", "pool_rows")


class ElasticStateError(ValueError):
    """A state that cannot be resumed here (another plan or seed, missing ranks, malformed)."""


def merge_ranges(value: Any) -> list[tuple[int, int]]:
    """Validated, sorted, merged [lo, hi) ranges (of a rank's stream indices)."""
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise ElasticStateError(f"state 'consumed' must be a list of [lo, hi], got {value!r}")
    try:
        iv = np.asarray(value, dtype=np.int64).reshape(-1, 2)
    except (TypeError, ValueError) as exc:
        raise ElasticStateError(f"state 'consumed' must be a list of [lo, hi] ({exc})") from exc
    if len(iv) and (iv.min() < 0 or (iv[:, 1] < iv[:, 0]).any()):
        raise ElasticStateError("state 'consumed' has a negative or reversed range")
    return [(int(a), int(b)) for a, b in union(iv)]


def _check_state(state: Any) -> dict:
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ElasticStateError(
            "not an elastic loader state (pass what ElasticLoader.state_dict() returned)"
        )
    if state.get("version") != STATE_VERSION:
        raise ElasticStateError(
            f"elastic state version {state.get('version')}, expected {STATE_VERSION}"
        )
    missing = [
        k for k in (*IDENTITY, "epoch", "frontier", "ahead", "world_size", "rank") if k not in state
    ]
    if missing:
        raise ElasticStateError(f"elastic state is missing {', '.join(missing)}")
    return dict(state)


def _normalize(frontier: int, intervals: np.ndarray, total: int) -> tuple[int, np.ndarray]:
    """(frontier, ahead) of the set [0, frontier) | intervals."""
    iv = union(np.clip(intervals, frontier, total))
    if len(iv) and iv[0, 0] <= frontier:
        frontier, iv = int(iv[0, 1]), iv[1:]
    return frontier, iv


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict:
    """One global state from the states of every rank of a run (several per rank, e.g. one per
    DataLoader worker, are joined). The result has ``rank`` and ``world_size`` None and nothing
    consumed: it is where a new run of any size starts. Raises :class:`ElasticStateError` when
    the states belong to different plans, seeds, epochs or runs, or a rank is missing."""
    states = [_check_state(s) for s in states]
    if not states:
        raise ElasticStateError("merge_states needs at least one state")
    first = states[0]
    same = (*IDENTITY, "epoch", "frontier", "ahead", "world_size")
    for s in states[1:]:
        for key in same:
            if s[key] != first[key]:
                raise ElasticStateError(
                    f"states differ in {key!r} ({first[key]!r} vs {s[key]!r}): they are not "
                    "from the same run"
                )
    order = GlobalOrder(first["canonical_bins"], first["samples_per_bin"], first["micro_batch"])
    frontier = int(first["frontier"])
    ahead = _ahead(first, order.total)
    if first["world_size"] is None:  # already global
        return _global(first, frontier, ahead)
    world = int(first["world_size"])
    per_rank: dict[int, list] = {}
    for s in states:
        r = int(s["rank"])
        if not 0 <= r < world:
            raise ElasticStateError(f"state rank {r} is outside world size {world}")
        per_rank.setdefault(r, []).append(_consumed(s))
    missing = sorted(set(range(world)) - set(per_rank))
    if missing:
        raise ElasticStateError(
            f"states of ranks {missing[:10]} of {world} are missing: merge every rank's state"
        )
    run = RunLayout(order, world, frontier, ahead)
    ranges = {r: merge_ranges(np.concatenate([f(run) for f in v])) for r, v in per_rank.items()}
    # Steps every rank finished: everything before them is consumed (no need to list it).
    common = min(rg[0][1] if rg and rg[0][0] == 0 else 0 for rg in ranges.values())
    skip = 0
    if common >= run.head_size:
        steps = min((common - run.head_size) // run.share, run.full)
        skip = run.head_size + steps * run.share
        frontier, ahead = run.h + steps * run.span, np.zeros((0, 2), np.int64)
    parts = [ahead]
    for r, rg in ranges.items():
        parts += [run.intervals(r, max(lo, skip), hi) for lo, hi in rg if hi > skip]
    frontier, ahead = _normalize(frontier, np.concatenate(parts), order.total)
    return _global(first, frontier, ahead)


def _steps(state: Mapping[str, Any]) -> list[int] | None:
    """A state's ``steps``: [first, stride, count] (units first, first + stride, ... of the
    run's stream: what one DataLoader worker yields in order), or None."""
    v = state.get("steps") or None
    if v is None:
        return None
    if not (isinstance(v, (list, tuple)) and len(v) == 3 and all(isinstance(x, int) for x in v)):
        raise ElasticStateError(f"state 'steps' must be [first, stride, count], got {v!r}")
    if v[0] < 0 or v[1] < 1 or v[2] < 0:
        raise ElasticStateError(f"state 'steps' has a bad value {v!r}")
    return list(v)


def _consumed(state: Mapping[str, Any]):
    """A function of the run layout giving the state's consumed stream ranges, (k, 2)."""
    ranges = np.asarray(merge_ranges(state.get("consumed") or []), np.int64).reshape(-1, 2)
    steps = _steps(state)

    def at(run: RunLayout) -> np.ndarray:
        if steps is None:
            return ranges
        u = steps[0] + steps[1] * np.arange(steps[2])
        u = u[u < run.num_units]
        units = np.stack([run.unit_start[u], run.unit_start[u + 1]], axis=1)
        return np.concatenate([ranges, units])

    return at


def _ahead(state: Mapping[str, Any], total: int) -> np.ndarray:
    f = int(state["frontier"])
    try:
        a = np.asarray(state["ahead"], dtype=np.int64).reshape(-1, 2)
    except (TypeError, ValueError) as exc:
        raise ElasticStateError(f"state 'ahead' must be a list of [lo, hi] ({exc})") from exc
    if not 0 <= f <= total or (
        len(a) and (a.min() < f or a.max() > total or (a[:, 1] < a[:, 0]).any())
    ):
        raise ElasticStateError(f"state position outside the epoch (frontier {f}, {total} samples)")
    return union(a)


def _global(base: Mapping[str, Any], frontier: int, ahead: np.ndarray) -> dict:
    out = {k: base[k] for k in ("format", "version", *IDENTITY, "epoch")}
    out.update(
        frontier=int(frontier),
        ahead=ahead.tolist(),
        world_size=None,
        rank=None,
        consumed=[],
    )
    return out


def all_gather_states(state: Mapping[str, Any]) -> list[dict]:
    """Every rank's state (torch.distributed ``all_gather_object`` when initialized, else just
    this one); merge the result with :func:`merge_states`. Never imports torch itself."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return [dict(state)]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, dict(state))
    return out


IDENTITY_NAMES = {
    "plan": "another canonical plan",
    "seed": "another seed",
    "canonical_bins": "another number of canonical bins",
    "samples_per_bin": "another samples-per-bin count (plan policy or micro_batch)",
    "micro_batch": "another micro_batch",
    "pool_rows": "another pool_rows",
}


def check_identity(state: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    """Raise :class:`ElasticStateError` naming the first identity field that differs."""
    for key, what in IDENTITY_NAMES.items():
        if key in state and state[key] != identity[key]:
            raise ElasticStateError(
                f"state was taken with {what}: {key}={state[key]!r}, this loader has "
                f"{key}={identity[key]!r}; resuming would yield other samples"
            )


def resume_point(
    state: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    identity: Mapping[str, Any],
    order: GlobalOrder,
    world_size: int,
    rank: int,
) -> tuple[int, int, np.ndarray, list[tuple[int, int]]]:
    """(epoch, frontier, ahead, consumed, steps) a loader of ``world_size`` ranks (this one
    ``rank``) starts from: a list of states is merged first; a rank's own state of a run of the
    same size continues that run (``consumed``/``steps`` kept); anything else starts a new run
    at the global position. What :meth:`ElasticLoader.load_state_dict` does, without a dataset."""
    if isinstance(state, Sequence) and not isinstance(state, Mapping):
        states = [_check_state(s) for s in state]
        for s in states:
            check_identity(s, identity)
        state = merge_states(states)
    state = _check_state(state)
    check_identity(state, identity)
    ahead = _ahead(state, order.total)
    frontier, epoch = int(state["frontier"]), int(state["epoch"])
    if state["world_size"] is not None:
        w, r = int(state["world_size"]), int(state["rank"])
        if w == int(world_size) and r == int(rank):  # the same run continues
            return epoch, frontier, ahead, merge_ranges(state.get("consumed") or []), _steps(state)
        if w != 1:
            raise ElasticStateError(
                f"this is rank {r}'s state of a {w}-rank run: resume from every rank's "
                "state (a list, or merge_states(states))"
            )
        state = merge_states([state])
        frontier, ahead = int(state["frontier"]), _ahead(state, order.total)
    return epoch, frontier, ahead, [], None


def unit_done(run: RunLayout, unit: int, consumed: list, steps: list[int] | None) -> bool:
    """Whether ``unit`` is in a record: strided ``steps`` [first, stride, count] or a sorted,
    merged list of ``consumed`` stream ranges."""
    if steps is not None and unit >= steps[0] and (unit - steps[0]) % steps[1] == 0:
        if (unit - steps[0]) // steps[1] < steps[2]:
            return True
    lo, hi = int(run.unit_start[unit]), int(run.unit_start[unit + 1])
    k = bisect.bisect_right(consumed, (lo, 1 << 62)) - 1
    return k >= 0 and consumed[k][0] <= lo and hi <= consumed[k][1]
