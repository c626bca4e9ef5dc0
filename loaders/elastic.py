"""Elastic resume: stop a run on W ranks, resume it on W', every sample of the epoch exactly once.

The epoch's order does not depend on the world size. It is built from a canonical plan
(:mod:`episodekit.metadata.plans.canonical`: ``C`` bins, ``S`` samples each after the plan's
policy):

- **Bin streams.** Bin ``c``'s stream is the locality-aware pool order of
  :class:`~episodekit.loaders.sharded.BinOrder`, a pure function of (seed, epoch, c, pool rows):
  whichever rank reads the bin, its ``j``-th sample is the same frame.
- **Global sequence** (:class:`GlobalOrder`). Round ``t`` takes ``m`` (``micro_batch``) samples
  of every bin, bin 0 first: global position ``g = t * C * m + c * m + i`` is sample
  ``t * m + i`` of bin ``c``. A round (``C * m`` samples) is the **step window**: one training
  step of the whole job (global batch ``C * m``). ``S`` is rounded to a multiple of ``m``
  (``trim`` down, ``wrap`` up).
- **A run's share** (:class:`RunLayout`). A run of ``W`` ranks cuts each step window into ``W``
  contiguous chunks; rank ``r`` yields chunk ``r`` of every window as one batch (one step). When
  ``W`` divides ``C``, rank ``r`` reads bins ``[r C / W, (r + 1) C / W)`` (file order, so the
  row-group locality of the plan is kept). Fallback when ``W`` does not divide ``C * m``: a
  step spans ``g = W / gcd(W, C m)`` rounds (the smallest whole number of rounds ``W`` divides),
  taken bin by bin (bin 0's samples of the g rounds, then bin 1's...) and cut into ``W``
  chunks, so a rank still reads ``C / W + 1`` bins at most; an epoch's last partial group is
  padded to equal counts. Every rank yields the same number of samples. DataLoader workers of
  a rank take its steps in turn (worker ``w`` yields steps ``w, w + K, ...``), which is the
  order ``DataLoader`` hands batches out in, so the worker count never changes a step.
- **Global position** (the state). What the whole job consumed is the set of global positions
  below ``frontier`` plus intervals ``ahead`` of it (ranks stopped at different points; one
  interval per step a rank is ahead, never one entry per sample). Each rank's
  :meth:`ElasticLoader.state_dict` says what it consumed of its own stream (ranges of its stream
  indices) and where its run started (``frontier``/``ahead``, the same on every rank);
  :func:`merge_states` turns the per-rank states into one global state.
- **Resume on any world size.** :meth:`ElasticLoader.load_state_dict` rebuilds the run from the
  global state: the rest of a partly consumed step window (the *head*) is cut into ``W'`` chunks
  as evenly as possible, then whole windows follow as above. A stop on a step boundary (what DDP
  gives: every rank consumed the same number of steps) leaves no head, so the union over the
  ranks of before and after is exactly the epoch, with equal samples per rank. A head that
  ``W'`` does not divide is padded to equal counts by repeating samples of the head (reported by
  :attr:`RunLayout.repeats`; at most ``W' - 1`` per resume): DDP needs equal counts more than it
  needs the last few samples unique.

Resuming is arithmetic on positions (O(window + ranks)); no data is read to find the place, and
bin orders are built only for the bins a rank reads.
"""

from __future__ import annotations

import bisect
import math
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.core.world import fill_rank
from episodekit.loaders.frames import DEFAULT_TOLERANCE_S, FrameDataset
from episodekit.loaders.reader import DEFAULT_CACHE_MB
from episodekit.loaders.sampler import feistel_permute
from episodekit.loaders.sharded import BinLayout, BinOrder, row_bytes_estimate, torch_worker

STATE_FORMAT = "episodekit.elastic_state"
STATE_VERSION = 1
LOOKAHEAD = 1024  # samples of a bin's stream computed at once (see ElasticLoader.frames_of)
DEFAULT_POOL_ROWS = 262_144  # rows per pool of a canonical bin (a few prepared row groups)
IDENTITY = ("plan", "seed", "canonical_bins", "samples_per_bin", "micro_batch", "pool_rows")


class ElasticStateError(ValueError):
    """A state that cannot be resumed here (another plan or seed, missing ranks, malformed)."""


class GlobalOrder:
    """The epoch's global sequence over ``num_bins`` canonical bins: pure arithmetic."""

    def __init__(
        self, num_bins: int, samples_per_bin: int, micro_batch: int = 1, policy: str = "trim"
    ):
        c, m, s = int(num_bins), int(micro_batch), int(samples_per_bin)
        if c < 1 or m < 1:
            raise ValueError(f"need >= 1 bin and micro_batch >= 1, got {c} and {m}")
        s = (s // m) * m if policy == "trim" else -(-s // m) * m
        if s < m:
            raise ValueError(
                f"micro_batch {m} is larger than the {samples_per_bin} samples per bin"
            )
        self.num_bins, self.micro_batch, self.samples_per_bin = c, m, s
        self.window = c * m  # one step window (a round)
        self.rounds = s // m
        self.total = c * s

    def locate(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bin, sample of that bin's stream) of global positions ``g``."""
        g = np.asarray(g, dtype=np.int64)
        t, r = np.divmod(g, self.window)
        return r // self.micro_batch, t * self.micro_batch + r % self.micro_batch


def union(intervals: Any) -> np.ndarray:
    """Disjoint, sorted, non-adjacent [lo, hi) intervals covering the same positions; (k, 2)."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    iv = iv[iv[:, 1] > iv[:, 0]]
    if not len(iv):
        return np.zeros((0, 2), np.int64)
    iv = iv[np.lexsort((iv[:, 1], iv[:, 0]))]
    reach = np.maximum.accumulate(iv[:, 1])
    new = np.r_[True, iv[1:, 0] > reach[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(iv) - 1]
    return np.stack([iv[first, 0], reach[last]], axis=1)


class RunLayout:
    """How a run of ``world_size`` ranks, started at (``frontier``, ``ahead``: intervals of
    positions consumed beyond it), shares the rest of the epoch: every rank's stream as units
    (one batch per step). ``per_rank`` samples per rank, ``repeats`` padding samples over all
    ranks. Everything is O(intervals), never O(samples)."""

    def __init__(
        self,
        order: GlobalOrder,
        world_size: int,
        frontier: int = 0,
        ahead: Any = None,
    ):
        w = int(world_size)
        if w < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        n = order.total
        ahead = union(np.zeros((0, 2)) if ahead is None else ahead)
        self.order, self.world_size = order, w
        self.frontier, self.ahead = int(frontier), ahead
        self.group = w // math.gcd(w, order.window)  # rounds per step
        self.span = self.group * order.window  # samples per step, all ranks
        self.share = self.span // w  # samples per step and rank
        top = max(self.frontier, int(ahead[-1, 1]) if len(ahead) else 0)
        self.h = min(-(-top // self.span) * self.span, n)  # first whole step of this run
        # the head: what is left of [frontier, h), as intervals
        lo = np.r_[self.frontier, ahead[:, 1]].astype(np.int64)
        hi = np.r_[ahead[:, 0], self.h].astype(np.int64)
        keep = hi > lo
        self.head_lo, self.head_len = lo[keep], (hi - lo)[keep]
        self.head_cum = np.concatenate([[0], np.cumsum(self.head_len)]).astype(np.int64)
        self.head_n = int(self.head_cum[-1])
        self.head_size = -(-self.head_n // w)
        self.full = (n - self.h) // self.span
        self.tail_lo = self.h + self.full * self.span
        self.tail = n - self.tail_lo
        self.tail_size = -(-self.tail // w)
        self.body_end = self.head_size + self.full * self.share
        # the head in steps of at most ``share`` (a far-ahead rank leaves a long head)
        sizes = [self.share] * (self.head_size // self.share)
        sizes += [self.head_size % self.share] if self.head_size % self.share else []
        sizes += [self.share] * self.full + ([self.tail_size] if self.tail_size else [])
        self.unit_sizes = np.asarray(sizes, dtype=np.int64)
        self.unit_start = np.concatenate([[0], np.cumsum(self.unit_sizes)]).astype(np.int64)
        self.per_rank = int(self.unit_start[-1])
        self.repeats = w * (self.head_size + self.tail_size) - self.head_n - self.tail

    @property
    def num_units(self) -> int:
        return len(self.unit_sizes)

    def _chunk(self, n: int, rank: int) -> tuple[int, int]:
        lo = rank * n // self.world_size
        return lo, (rank + 1) * n // self.world_size - lo

    def _head_at(self, idx: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.head_cum, idx, side="right") - 1
        return self.head_lo[k] + (idx - self.head_cum[k])

    def positions(self, rank: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Global positions of ``rank``'s stream indices [start, stop) (padding repeats a sample
        of the same chunk, else of the head or tail)."""
        stop = self.per_rank if stop is None else min(int(stop), self.per_rank)
        k = np.arange(int(start), stop, dtype=np.int64)
        out = np.empty(len(k), dtype=np.int64)
        hs, tb = self.head_size, self.body_end
        sel = k < hs
        if sel.any():
            lo, cnt = self._chunk(self.head_n, rank)
            idx = lo + np.minimum(k[sel], max(cnt - 1, 0))
            out[sel] = self._head_at(np.minimum(idx, self.head_n - 1))
        sel = (k >= hs) & (k < tb)
        if sel.any():
            step, off = np.divmod(k[sel] - hs, self.share)
            out[sel] = self.h + step * self.span + self._in_step(rank * self.share + off)
        sel = k >= tb
        if sel.any():
            lo, cnt = self._chunk(self.tail, rank)
            idx = lo + np.minimum(k[sel] - tb, max(cnt - 1, 0))
            out[sel] = self.tail_lo + np.minimum(idx, self.tail - 1)
        return out

    def _in_step(self, offset: np.ndarray) -> np.ndarray:
        """Offset inside a step (its ``group`` rounds taken bin by bin: bin 0's samples of every
        round, then bin 1's...) -> offset from the step's first position. With one round per
        step this is the identity; with several, a rank's chunk still covers C / W (+ 1) bins."""
        if self.group == 1:
            return offset
        m = self.order.micro_batch
        c, q = np.divmod(offset, self.group * m)
        t, i = np.divmod(q, m)
        return t * self.order.window + c * m + i

    def unit_positions(self, rank: int, unit: int) -> np.ndarray:
        """Global positions of one unit (step) of ``rank``."""
        return self.positions(rank, int(self.unit_start[unit]), int(self.unit_start[unit + 1]))

    def intervals(self, rank: int, start: int, stop: int) -> np.ndarray:
        """The global positions of ``rank``'s stream indices [start, stop) as (k, 2) intervals
        (padding left out: it repeats positions of the same range); O(steps), not O(samples)."""
        out = [np.zeros((0, 2), np.int64)]
        hs, tb = self.head_size, self.body_end
        a, b = max(start, 0), min(stop, hs)
        if a < b:
            lo, cnt = self._chunk(self.head_n, rank)
            i0, i1 = lo + a, lo + min(b, cnt)
            if i0 < i1:
                k0 = np.searchsorted(self.head_cum, i0, side="right") - 1
                k1 = np.searchsorted(self.head_cum, i1 - 1, side="right") - 1
                ks = np.arange(k0, k1 + 1)
                base = self.head_lo[ks] - self.head_cum[ks]
                lo_k = np.maximum(self.head_cum[ks], i0) + base
                hi_k = np.minimum(self.head_cum[ks + 1], i1) + base
                out.append(np.stack([lo_k, hi_k], axis=1))
        a, b = max(start, hs), min(stop, tb)
        if a < b and self.group > 1:  # bin-major steps: runs of consecutive positions
            p = np.sort(self.positions(rank, a, b))
            cut = np.flatnonzero(np.diff(p) != 1) + 1
            out.append(np.stack([p[np.r_[0, cut]], p[np.r_[cut - 1, len(p) - 1]] + 1], axis=1))
        elif a < b:
            steps = np.arange((a - hs) // self.share, (b - 1 - hs) // self.share + 1)
            first = hs + steps * self.share  # stream index where each step starts
            base = self.h + steps * self.span + rank * self.share
            lo_s = base + np.maximum(a - first, 0)
            hi_s = base + np.minimum(b - first, self.share)
            out.append(np.stack([lo_s, hi_s], axis=1))
        a, b = max(start, tb), min(stop, self.per_rank)
        if a < b:
            lo, cnt = self._chunk(self.tail, rank)
            i0, i1 = lo + (a - tb), lo + min(b - tb, cnt)
            if i0 < i1:
                out.append(np.array([[self.tail_lo + i0, self.tail_lo + i1]], np.int64))
        return np.concatenate(out)


# ---------------------------------------------------------------------------------------------
# States


def _ranges(value: Any) -> list[tuple[int, int]]:
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
    ranges = {r: _ranges(np.concatenate([f(run) for f in v])) for r, v in per_rank.items()}
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
    ranges = np.asarray(_ranges(state.get("consumed") or []), np.int64).reshape(-1, 2)
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


def bin_frames(order: BinOrder, samples: np.ndarray) -> np.ndarray:
    """Global frames of samples ``samples`` of one bin's stream (pointwise :meth:`BinOrder.parts`:
    samples from ``order.total`` on repeat the last pool's order)."""
    j = np.asarray(samples, dtype=np.int64)
    last = order.num_pools - 1
    g_last = int(order.pool_cum[last])
    n_last = order.total - g_last
    q = np.where(j >= order.total, g_last + (j - order.total) % max(n_last, 1), j)
    pool = np.searchsorted(order.pool_cum, q, side="right") - 1
    pool = np.minimum(pool, last)
    out = np.empty(len(q), dtype=np.int64)
    for p in np.unique(pool).tolist():
        sel = pool == p
        g0 = int(order.pool_cum[p])
        n = int(order.pool_cum[p + 1]) - g0
        out[sel] = feistel_permute(q[sel] - g0, n, order.keys[p]) + g0
    slot = np.searchsorted(order.item_cum, out, side="right") - 1
    return order.base[slot] + (out - order.item_cum[slot])


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
            return epoch, frontier, ahead, _ranges(state.get("consumed") or []), _steps(state)
        if w != 1:
            raise ElasticStateError(
                f"this is rank {r}'s state of a {w}-rank run: resume from every rank's "
                "state (a list, or merge_states(states))"
            )
        state = merge_states([state])
        frontier, ahead = int(state["frontier"]), _ahead(state, order.total)
    return epoch, frontier, ahead, [], None


# ---------------------------------------------------------------------------------------------
# The loader


class ElasticLoader:
    """Stream one rank's share of the epoch of a canonical plan; resumable on any world size.

    ``plan``: a canonical plan (None: ``load_canonical_plan(root)``). ``rank``/``world_size``
    default to torch.distributed, else RANK/WORLD_SIZE. Each iteration yields one batch (a dict
    like ``FrameDataset.get_batch``) per step: the rank's chunk of the step window, ``C * m /
    world_size`` samples (``micro_batch`` = ``m``). In a torch DataLoader worker (or with
    ``worker``/``num_workers``) only steps ``worker, worker + num_workers, ...`` are yielded.
    ``pool_rows`` sets each canonical bin's pool (it is part of the order: keep it across
    resumes). Reads go through the frame store when one is fresh (recommended: a rank reads
    ``m`` samples of each of its bins per step).
    """

    def __init__(
        self,
        root: str | os.PathLike | Dataset,
        plan: Any | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        micro_batch: int = 1,
        seed: int = 0,
        worker: int | None = None,
        num_workers: int | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        pool_rows: int = DEFAULT_POOL_ROWS,
        speed: bool = True,
        video_backend: Any = None,
        store: Any = "auto",
    ):
        from episodekit.metadata.plans.canonical import is_canonical, load_canonical_plan

        ds = as_dataset(root)
        rank, world_size = fill_rank(rank, world_size)
        if plan is None:
            plan = load_canonical_plan(ds)
        if not is_canonical(plan):
            raise ValueError(
                f"ElasticLoader needs a canonical plan (episodekit metadata plan {ds.root} "
                "--canonical-bins auto; load it with load_canonical_plan)"
            )
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        if int(pool_rows) < 1:
            raise ValueError(f"pool_rows must be >= 1, got {pool_rows}")
        if num_workers is not None and int(num_workers) < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if worker is not None and not 0 <= int(worker) < int(num_workers or 1):
            raise ValueError(f"worker {worker} is not in [0, num_workers={num_workers or 1})")
        self.plan, self.rank, self.world_size = plan, int(rank), int(world_size)
        self.seed, self.pool_rows = int(seed), int(pool_rows)
        self.worker, self.num_workers = worker, num_workers
        self.order = GlobalOrder(plan.num_bins, plan.samples_per_worker, micro_batch, plan.policy)
        self.frames = FrameDataset(
            ds,
            delta_timestamps=delta_timestamps,
            tolerance_s=tolerance_s,
            cache_mb=cache_mb,
            speed=speed,
            video_backend=video_backend,
            store=store,
        )
        self._ds = ds
        if self.frames.store is None:
            self._warn_cache(plan, cache_mb)
        self._layouts: dict[int, BinLayout] = {}
        self._orders: dict[tuple[int, int], BinOrder] = {}
        self._tables: dict[tuple[int, int], list] = {}  # (epoch, block) -> [rows, table]
        self.epoch = 0
        self._start(0, 0, None)

    def _warn_cache(self, plan: Any, cache_mb: float) -> None:
        """Without a frame store every step reads all of this rank's bins: their row groups
        must stay resident, or each step decodes them again. Warn once when they cannot."""
        c, w, r = plan.num_bins, self.world_size, self.rank
        lo, hi = r * c // w, min(c, -(-(r + 1) * c // w) + 1)
        rows = int(plan.bin_frames()[lo:hi].sum())
        need = rows * row_bytes_estimate(self._ds, self.frames.reader.columns) / 2**20
        if need > cache_mb:
            warnings.warn(
                f"ElasticLoader rank {r}: a step reads all of its ~{need:,.0f} MiB of decoded "
                f"rows and cache_mb={cache_mb:g} is smaller, so steps would decode row groups "
                f"again; build the frame store (episodekit prep frames {self._ds.root}) or "
                f"pass cache_mb >= {need * 1.25:,.0f}",
                stacklevel=3,
            )

    # -- identity and position ----------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What a state must match to be resumed here."""
        return {
            "plan": self.plan.digest,
            "seed": self.seed,
            "canonical_bins": self.order.num_bins,
            "samples_per_bin": self.order.samples_per_bin,
            "micro_batch": self.order.micro_batch,
            "pool_rows": self.pool_rows,
        }

    def _start(self, epoch: int, frontier: int, ahead: Any) -> None:
        self.epoch = int(epoch)
        self.run = RunLayout(self.order, self.world_size, frontier, ahead)
        self.consumed: list[tuple[int, int]] = []
        self.steps_done: list[int] | None = None  # [first, stride, count] of units yielded
        self._restored: tuple[list, list[int] | None] = ([], None)  # the record at load time

    def __len__(self) -> int:
        """Samples this rank yields in the current run of the epoch (equal on every rank)."""
        return self.run.per_rank

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (a no-op when already in it, e.g. after resume)."""
        if int(epoch) != self.epoch:
            self._start(epoch, 0, None)

    def units(self) -> list[int]:
        """The steps (units of this rank's stream) this process yields, in order."""
        n = self.run.num_units
        if self.worker is not None:
            return list(range(int(self.worker), n, int(self.num_workers or 1)))
        tw = torch_worker()
        if tw is not None:
            return list(range(tw[0], n, tw[1]))
        return list(range(n))

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: the plan identity, the epoch, where this run started (the whole
        job's position then: ``frontier`` and ``ahead``, global positions), the run's world size
        and this rank, ``consumed``: ranges of this rank's stream yielded so far, and ``steps``:
        [first, stride, count], the units (steps) this process yielded in order (a DataLoader
        worker's are strided: O(1) however long the epoch). Merge
        the states of all ranks with :func:`merge_states` (or pass them all to
        :meth:`load_state_dict`)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            **self.identity(),
            "epoch": self.epoch,
            "frontier": self.run.frontier,
            "ahead": self.run.ahead.tolist(),
            "world_size": self.world_size,
            "rank": self.rank,
            "consumed": [list(r) for r in self.consumed],
            "steps": list(self.steps_done) if self.steps_done else [],
        }

    def state_at(self, steps: int) -> dict[str, Any]:
        """This rank's state after ``steps`` batches were consumed since the loader started or
        was last loaded (what a training loop counts; prefetching DataLoaders read ahead of
        it): the next ``steps`` steps not done at that point, in order."""
        consumed, done = self._restored
        state = self.state_dict()
        todo = [u for u in range(self.run.num_units) if not _unit_done(self.run, u, consumed, done)]
        take = np.asarray(todo[: max(int(steps), 0)], dtype=np.int64)
        units = np.stack([self.run.unit_start[take], self.run.unit_start[take + 1]], axis=1)
        state["consumed"] = [
            list(r) for r in _ranges(np.concatenate([np.reshape(consumed, (-1, 2)), units]))
        ]
        state["steps"] = list(done) if done else []
        return state

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume from a global state (:func:`merge_states`), a list of every rank's states, or
        this rank's own state of a run of the same world size (that run continues as it was).
        Raises :class:`ElasticStateError` for a state of another plan, seed, pool size or
        micro-batch, and for one rank's state of a run of another size."""
        epoch, frontier, ahead, consumed, steps = resume_point(
            state, self.identity(), self.order, self.world_size, self.rank
        )
        if frontier >= self.order.total:  # the epoch was finished: the next one starts
            epoch, frontier, ahead, consumed, steps = epoch + 1, 0, None, [], None
        self._start(epoch, frontier, ahead)
        self.consumed, self.steps_done = consumed, steps
        self._restored = (list(consumed), list(steps) if steps else None)

    # -- the order ----------------------------------------------------------------------------

    def _bin_order(self, epoch: int, c: int) -> BinOrder:
        key = (epoch, c)
        order = self._orders.get(key)
        if order is None:
            if len(self._orders) > 4 * self.order.num_bins:
                self._orders.clear()
            layout = self._layouts.get(c)
            if layout is None:
                ds, reader = self._ds, self.frames.reader
                layout = BinLayout(
                    self.plan.bin_items(c, 0),
                    ds.column("episode_index"),
                    ds.column("length"),
                    ds.column("dataset_from_index"),
                    reader.rg_start,
                    reader.rg_rows,
                )
                self._layouts[c] = layout
            order = self._orders[key] = BinOrder(layout, self.seed, epoch, c, self.pool_rows)
        return order

    def frames_of(self, positions: np.ndarray, epoch: int | None = None) -> np.ndarray:
        """Global frame indices of global positions of ``epoch`` (default: the current one).

        A step takes ``m`` consecutive samples of each of its bins, so bin streams are computed
        ``LOOKAHEAD`` samples at a time into a table (a row per bin read, 8 bytes a sample) and
        a step is one vectorized gather from it."""
        epoch = self.epoch if epoch is None else int(epoch)
        c, j = self.order.locate(positions)
        block = j // LOOKAHEAD
        blocks = np.unique(block)
        if len(blocks) > 2:  # a wide request (a head): evaluate bin by bin, no table
            out = np.empty(len(c), dtype=np.int64)
            by_bin = np.argsort(c, kind="stable")
            bins, starts = np.unique(c[by_bin], return_index=True)
            for b, idx in zip(bins.tolist(), np.split(by_bin, starts[1:])):
                out[idx] = bin_frames(self._bin_order(epoch, b), j[idx])
            return out
        out = np.empty(len(c), dtype=np.int64)
        for blk in blocks.tolist():
            sel = block == blk
            rows, table = self._table(epoch, blk, np.unique(c[sel]))
            out[sel] = table[rows[c[sel]], j[sel] - blk * LOOKAHEAD]
        return out

    def _table(self, epoch: int, block: int, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each bin, table) of samples [block * LOOKAHEAD, ...) of ``bins``' streams;
        the two most recent blocks are kept."""
        key = (epoch, block)
        entry = self._tables.get(key)
        if entry is None:
            if len(self._tables) >= 2:
                self._tables.pop(next(iter(self._tables)))
            rows = np.full(self.order.num_bins, -1, dtype=np.int64)
            entry = self._tables[key] = [rows, np.zeros((0, LOOKAHEAD), np.int64)]
        rows, table = entry
        missing = bins[rows[bins] < 0]
        if len(missing):
            lo = block * LOOKAHEAD
            js = np.arange(lo, min(lo + LOOKAHEAD, self.order.samples_per_bin))
            new = np.zeros((len(missing), LOOKAHEAD), np.int64)
            for k, b in enumerate(missing.tolist()):
                new[k, : len(js)] = bin_frames(self._bin_order(epoch, b), js)
            rows[missing] = len(table) + np.arange(len(missing))
            table = entry[1] = np.concatenate([table, new])
        return rows, table

    def epoch_positions(self) -> np.ndarray:
        """Every global position this process yields in the current run, in order (tests)."""
        parts = [self.run.unit_positions(self.rank, u) for u in self.units()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        run = self.run
        if all(self._done(u) for u in range(run.num_units)):  # the run was finished
            self._start(self.epoch + 1, 0, None)
            run = self.run
        epoch = self.epoch
        units = self.units()
        stride = units[1] - units[0] if len(units) > 1 else 1
        for u in units:
            if self._done(u):
                continue
            lo, hi = int(run.unit_start[u]), int(run.unit_start[u + 1])
            batch = self.frames.get_frames(self.frames_of(run.positions(self.rank, lo, hi), epoch))
            sd = self.steps_done
            if sd is None:
                self.steps_done = [u, stride, 1]
            elif u == sd[0] + sd[1] * sd[2]:
                sd[2] += 1
            else:
                self.consumed = _ranges([*self.consumed, (lo, hi)])
            yield batch
            if self.run is not run:  # load_state_dict/set_epoch while iterating
                return

    def _done(self, unit: int) -> bool:
        """Whether ``unit`` of the current run was consumed (by this process's record)."""
        return _unit_done(self.run, unit, self.consumed, self.steps_done)


def _unit_done(run: RunLayout, unit: int, consumed: list, steps: list[int] | None) -> bool:
    """Whether ``unit`` is in a record: strided ``steps`` [first, stride, count] or a sorted,
    merged list of ``consumed`` stream ranges."""
    if steps is not None and unit >= steps[0] and (unit - steps[0]) % steps[1] == 0:
        if (unit - steps[0]) // steps[1] < steps[2]:
            return True
    lo, hi = int(run.unit_start[unit]), int(run.unit_start[unit + 1])
    k = bisect.bisect_right(consumed, (lo, 1 << 62)) - 1
    return k >= 0 and consumed[k][0] <= lo and hi <= consumed[k][1]
