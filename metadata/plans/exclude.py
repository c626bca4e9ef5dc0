"""Frames a plan must never draw: whole episodes or frame ranges, each with the reason.

Dropping frozen or duplicated episodes, or idle stretches, need not rewrite the dataset: a plan
built with an :class:`Exclusion` partitions only the frames that are left (each episode becomes
the pieces between its excluded ranges), so every rank still gets the same number of samples, and
the plan records what it left out and why (``excluded`` in the plan file). A loader reading that
plan never yields an excluded frame as a sample (a delta window around a kept frame may still
reach into an excluded neighbour, as it may reach an episode's edge).

The ranges come from the caller: ``--exclude-episodes 3,7,10-12``, ``--exclude-frames FILE`` (a
JSON list of ``{"episode": e, "start": s, "end": t}`` or ``[e, s, t]``, end exclusive, or a
jsonl file of those), or the episodes a ``quality.*`` check flagged (the app layer turns findings
into episodes; this module knows nothing of validation).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_RANGE = 10_000_000  # a range wider than this is a typo, not a selection
MAX_INDEX = 2**62  # an episode index beyond this is a typo (and overflows int64)


def parse_episode_list(text: str, option: str = "--exclude-episodes") -> np.ndarray:
    """``"3,7,10-12"`` -> ``[3, 7, 10, 11, 12]`` (sorted, unique); ValueError naming ``option``
    and the bad part (letters, a negative or backwards range, one wider than ``MAX_RANGE``)."""
    out: list[np.ndarray] = []
    for part in (p.strip() for p in str(text or "").split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(
                f"{option} {text!r}: {part!r} is not an episode index or a range such as 10-12"
            ) from None
        if max(a, b) > MAX_INDEX:
            raise ValueError(f"{option} {text!r}: {part!r} is larger than any episode index")
        if a < 0 or b < a or b - a > MAX_RANGE:
            raise ValueError(f"{option} {text!r}: {part!r} is not a valid range (low-high)")
        out.append(np.arange(a, b + 1, dtype=np.int64))
    if not out:
        raise ValueError(f"{option} {text!r}: no episodes given")
    return np.unique(np.concatenate(out))


def _range_rows(doc: object, where: str) -> list[tuple[int, int, int]]:
    rows = doc.get("ranges", doc.get("frames")) if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        raise ValueError(f"{where}: expected a list of frame ranges")
    out = []
    for i, r in enumerate(rows):
        if isinstance(r, dict):
            r = [r.get("episode", r.get("episode_index")), r.get("start"), r.get("end")]
        if not (isinstance(r, list | tuple) and len(r) == 3):
            raise ValueError(f"{where}: range {i} is not [episode, start, end]")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in r):
            raise ValueError(f"{where}: range {i} has a value that is not an integer: {r}")
        if max(r) > MAX_INDEX:  # JSON integers have no bound; int64 has
            raise ValueError(f"{where}: range {i} has a number larger than any index: {r}")
        if r[1] < 0 or r[2] <= r[1]:
            raise ValueError(f"{where}: range {i} [{r[1]}, {r[2]}) is empty or negative")
        out.append((int(r[0]), int(r[1]), int(r[2])))
    return out


def read_frame_ranges(path: str | Path) -> np.ndarray:
    """Frame ranges from a JSON file (a list, or ``{"ranges": [...]}``) or a jsonl file (one
    range per line): (m, 3) int64 rows (episode, start, end), end exclusive."""
    p = Path(path)
    text = p.read_text()
    try:
        if p.suffix == ".jsonl":
            doc: object = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{p}: not valid JSON ({exc})") from exc
    rows = _range_rows(doc, str(p))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def merge_ranges(ranges: np.ndarray) -> np.ndarray:
    """Sorted, non-overlapping (episode, start, end) rows covering the same frames."""
    r = np.asarray(ranges, dtype=np.int64).reshape(-1, 3)
    if not len(r):
        return r
    r = r[np.lexsort((r[:, 1], r[:, 0]))]
    group = np.cumsum(np.r_[True, r[1:, 0] != r[:-1, 0]])
    big = int(r[:, 2].max()) + 1
    # Grouped running max of the ends: offset each episode's ends above the previous one's.
    run_end = np.maximum.accumulate(group * big + r[:, 2]) - group * big
    new = np.r_[True, (group[1:] != group[:-1]) | (r[1:, 1] > run_end[:-1])]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], len(r)] - 1
    return np.stack([r[first, 0], r[first, 1], run_end[last]], axis=1)


@dataclass(frozen=True)
class Exclusion:
    """Excluded frames as merged (episode, start, end) rows, with frames per reason."""

    ranges: np.ndarray
    reasons: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(
        cls, parts: list[tuple[str, np.ndarray]], episode_index: np.ndarray, lengths: np.ndarray
    ) -> Exclusion:
        """Combine ``(reason, ranges)`` parts, clipped to the episodes' lengths. A range naming an
        episode the dataset does not have, or starting past its end, is a ValueError."""
        ep = np.asarray(episode_index, dtype=np.int64)
        length = np.asarray(lengths, dtype=np.int64)
        reasons: dict[str, int] = {}
        kept = []
        for reason, ranges in parts:
            r = np.asarray(ranges, dtype=np.int64).reshape(-1, 3)
            pos = np.searchsorted(ep, r[:, 0])
            known = (pos < len(ep)) & (ep[np.minimum(pos, len(ep) - 1)] == r[:, 0])
            if not known.all():
                bad = r[~known, 0][:5].tolist()
                raise ValueError(f"{reason}: the dataset has no episode {bad}")
            n = length[pos]
            if np.any(r[:, 1] >= np.maximum(n, 1)):
                i = int(np.flatnonzero(r[:, 1] >= np.maximum(n, 1))[0])
                raise ValueError(
                    f"{reason}: range starts at frame {r[i, 1]} of episode {r[i, 0]}, "
                    f"which has {n[i]} frames"
                )
            r = np.stack([r[:, 0], r[:, 1], np.minimum(r[:, 2], n)], axis=1)
            r = merge_ranges(r)
            reasons[reason] = reasons.get(reason, 0) + int((r[:, 2] - r[:, 1]).sum())
            kept.append(r)
        all_ranges = merge_ranges(np.concatenate(kept) if kept else np.empty((0, 3), np.int64))
        return cls(all_ranges, reasons)

    @property
    def frames(self) -> int:
        return int((self.ranges[:, 2] - self.ranges[:, 1]).sum())

    @property
    def digest(self) -> str:
        """What decides the plan: the ranges (the reasons are a record, not an input)."""
        data = np.ascontiguousarray(self.ranges, dtype="<i8").tobytes()
        return hashlib.sha256(b"episodekit-exclusion-v1\0" + data).hexdigest()[:16]

    def __bool__(self) -> bool:
        return len(self.ranges) > 0


def whole_episodes(episodes: np.ndarray, episode_index: np.ndarray, lengths: np.ndarray):
    """(episode, 0, length) rows for ``episodes`` (unknown ones raise in :meth:`Exclusion.of`)."""
    e = np.asarray(episodes, dtype=np.int64)
    pos = np.clip(np.searchsorted(episode_index, e), 0, max(len(episode_index) - 1, 0))
    n = (
        np.where(episode_index[pos] == e, lengths[pos], 1)
        if len(episode_index)
        else np.ones_like(e)
    )
    return np.stack([e, np.zeros_like(e), np.maximum(n, 1)], axis=1)


def keep_pieces(
    episode_index: np.ndarray, lengths: np.ndarray, excluded: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The frames left: (episode, start, end, position of the episode) per piece, the gaps
    between each episode's merged excluded ranges (episodes in the given order, pieces by start).
    An episode with nothing excluded is one piece [0, length)."""
    ep = np.asarray(episode_index, dtype=np.int64)
    n = np.asarray(lengths, dtype=np.int64)
    x = merge_ranges(excluded)
    order = np.argsort(ep, kind="stable")
    pos = order[np.searchsorted(ep[order], x[:, 0])] if len(x) else np.zeros(0, np.int64)
    # Candidate pieces: [0, first start), [end_i, start_{i+1}), [last end, length) per episode.
    bounds_ep = np.concatenate([np.arange(len(ep)), pos])
    bounds_lo = np.concatenate([np.zeros(len(ep), np.int64), x[:, 2]])
    order_b = np.lexsort((bounds_lo, bounds_ep))
    be, blo = bounds_ep[order_b], bounds_lo[order_b]
    x_start_by_ep = np.concatenate([x[:, 1], n])  # next excluded start, or the length
    x_ep = np.concatenate([pos, np.arange(len(ep))])
    order_x = np.lexsort((x_start_by_ep, x_ep))
    hi = x_start_by_ep[order_x]
    keep = hi > blo
    p = be[keep]
    return ep[p], blo[keep], hi[keep], p
