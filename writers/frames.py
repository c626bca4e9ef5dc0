"""Which frames of which episodes an edit keeps: ``--drop-frames``, ``--keep-frames`` and
``--trim-idle`` turned into one kept-frame mask per episode cut inside.

Frame ranges are given as ``SPEC`` (``3:11-20,7:0-4``: episode, colon, frames; ranges inclusive
as in ``--drop-episodes``, one frame as ``3:5``) or as a file in the format ``--exclude-frames``
reads (JSON or jsonl ``{"episode": e, "start": s, "end": t}`` rows, end exclusive). Either way,
a range naming an episode the dataset lacks or a frame past an episode's end is an error (a
typo, never clipped). ``--keep-frames`` keeps only the named frames of the episodes it names;
other episodes stay whole (``--keep-episodes`` chooses episodes).

``--trim-idle`` drops each episode's still head and tail: frame ``t`` moves when, for some
dimension of ``action`` or ``observation.state``, ``|x[t] - x[t-1]|`` exceeds ``threshold``
times that dimension's spread (its standard deviation over the dataset; a dimension that never
varies is ignored). Frames before the frame preceding the first move, and frames after the last
move, go; an episode that never moves is kept whole (and reported).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from episodekit.core.dataset import Dataset, read_parquet
from episodekit.core.paths import DEFAULT_IDLE_THRESHOLD
from episodekit.metadata.plans.exclude import MAX_INDEX, merge_ranges, read_frame_ranges

IDLE_FEATURES = ("action", "observation.state")

_PART = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_frame_spec(text: str, option: str = "--drop-frames") -> np.ndarray:
    """``"3:11-20,7:0-4"`` or a JSON/jsonl file -> (m, 3) int64 rows (episode, start, end),
    end exclusive; ValueError naming ``option`` and the bad part."""
    text = str(text or "").strip()
    if not text:
        raise ValueError(f"{option}: no frames given (e.g. 3:11-20,7:0-4)")
    if not _PART.match(text.split(",")[0]):
        path = Path(text)
        if not path.is_file():
            raise ValueError(
                f"{option} {text!r}: neither EPISODE:FRAMES ranges (e.g. 3:11-20) nor a file"
            )
        try:
            return read_frame_ranges(path)
        except ValueError as exc:
            raise ValueError(f"{option}: {exc}") from None
    rows = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _PART.match(part)
        if not m:
            raise ValueError(
                f"{option} {text!r}: {part.strip()!r} is not EPISODE:FRAME or EPISODE:FIRST-LAST"
            )
        e, a = int(m.group(1)), int(m.group(2))
        b = int(m.group(3)) if m.group(3) is not None else a
        if max(e, a, b) > MAX_INDEX or b < a:
            raise ValueError(f"{option} {text!r}: {part.strip()!r} is not a valid range")
        rows.append((e, a, b + 1))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def _episode_positions(ds: Dataset, ranges: np.ndarray, option: str) -> np.ndarray:
    """Each range's row in ``ds.episodes``; ValueError for an unknown episode or a frame past
    an episode's end."""
    ep, length = ds.column("episode_index"), ds.column("length")
    pos = np.searchsorted(ep, ranges[:, 0])
    known = (pos < len(ep)) & (ep[np.minimum(pos, len(ep) - 1)] == ranges[:, 0])
    if not known.all():
        bad = ranges[~known, 0][:5].tolist()
        raise ValueError(
            f"{option}: no episode {bad} in {ds.root} "
            f"(it has {len(ep)} episodes, {int(ep.min())}..{int(ep.max())})"
        )
    over = ranges[:, 2] > length[pos]
    if over.any():
        i = int(np.flatnonzero(over)[0])
        e, a, b = (int(v) for v in ranges[i])
        raise ValueError(
            f"{option}: frames {a}..{b - 1} of episode {e} are out of range "
            f"(it has {int(length[pos[i]])} frames, 0..{int(length[pos[i]]) - 1})"
        )
    return pos


def range_masks(ds: Dataset, ranges: np.ndarray, keep: bool, option: str) -> dict[int, np.ndarray]:
    """``{episode_index: kept-frame mask}`` for the episodes ``ranges`` name: the named frames
    dropped (``keep=False``) or the only ones kept (``keep=True``)."""
    ranges = merge_ranges(ranges)
    pos = _episode_positions(ds, ranges, option)
    length = ds.column("length")
    out: dict[int, np.ndarray] = {}
    for (e, a, b), p in zip(ranges.tolist(), pos.tolist()):
        if e not in out:
            out[e] = np.full(int(length[p]), not keep, dtype=bool)
        out[e][a:b] = keep
    return out


@dataclass
class IdleTrim:
    """What ``--trim-idle`` found: frames dropped at each episode's head and tail."""

    threshold: float
    head: dict[int, int] = field(default_factory=dict)
    tail: dict[int, int] = field(default_factory=dict)
    still: list[int] = field(default_factory=list)  # episodes that never move: kept whole

    def masks(self, lengths: dict[int, int]) -> dict[int, np.ndarray]:
        out = {}
        for e in sorted(set(self.head) | set(self.tail)):
            mask = np.ones(lengths[e], dtype=bool)
            mask[: self.head.get(e, 0)] = False
            mask[lengths[e] - self.tail.get(e, 0) :] = False
            out[e] = mask
        return out


def idle_features(ds: Dataset) -> list[str]:
    """The features ``--trim-idle`` watches (ValueError when the dataset has neither)."""
    feats = [f for f in IDLE_FEATURES if f in ds.features]
    if not feats:
        raise ValueError(f"--trim-idle: {ds.root} has neither {' nor '.join(IDLE_FEATURES)}")
    return feats


def _matrix(col) -> np.ndarray:
    """A fixed-size-list (or list) column as a (rows, dims) float64 array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    if pa.types.is_fixed_size_list(arr.type) or pa.types.is_list(arr.type):
        flat = pc.list_flatten(arr).to_numpy(zero_copy_only=False)
        return flat.astype(np.float64).reshape(len(arr), -1)
    return arr.to_numpy(zero_copy_only=False).astype(np.float64).reshape(len(arr), 1)


def find_idle(ds: Dataset, threshold: float = DEFAULT_IDLE_THRESHOLD) -> IdleTrim:
    """The still head and tail of every episode of ``ds`` (see the module docstring): two
    passes over the data files, reading only ``episode_index``, ``frame_index`` and the watched
    features (the first for their spread)."""
    if not threshold > 0:
        raise ValueError(f"--idle-threshold {threshold:g}: expected a number > 0")
    feats = idle_features(ds)
    cols = ["episode_index", "frame_index", *feats]
    files = np.unique(ds.column("file_id")).tolist()
    # pass 1: the spread (population std) of every dimension, from sums over the files
    sums: dict[str, np.ndarray] = {}
    n = 0
    for f in files:
        t = read_parquet(ds.fs, ds.data_path(f), feats)
        for name in feats:
            x = _matrix(t[name])
            s = np.stack([x.sum(axis=0), (x * x).sum(axis=0)])
            sums[name] = sums.get(name, 0) + s
        n += t.num_rows
    spread = {}
    for name, (s1, s2) in sums.items():
        mean = s1 / max(n, 1)
        spread[name] = np.sqrt(np.maximum(s2 / max(n, 1) - mean * mean, 0.0))
    # pass 2: per episode, the first and last frame that moves
    out = IdleTrim(threshold)
    for f in files:
        t = read_parquet(ds.fs, ds.data_path(f), cols)
        ep = t["episode_index"].to_numpy()
        order = np.lexsort((t["frame_index"].to_numpy(), ep))
        ep = ep[order]
        moves = np.zeros(len(ep), dtype=bool)  # row r moves from row r-1 (same episode)
        for name in feats:
            x = _matrix(t[name])[order]
            live = spread[name] > 0
            if not live.any() or len(x) < 2:
                continue
            step = np.abs(np.diff(x[:, live], axis=0)) > threshold * spread[name][live]
            moves[1:] |= step.any(axis=1)
        starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
        ends = np.r_[starts[1:], len(ep)]
        moves[starts] = False  # no move into an episode's first frame
        for a, b in zip(starts.tolist(), ends.tolist()):
            e = int(ep[a])
            hit = np.flatnonzero(moves[a:b])
            if not len(hit):
                out.still.append(e)
                continue
            first, last = int(hit[0]), int(hit[-1])
            if first > 1:
                out.head[e] = first - 1  # keep the frame the first move starts from
            if last < b - a - 1:
                out.tail[e] = b - a - 1 - last
    return out


def combine(masks: list[dict[int, np.ndarray]]) -> dict[int, np.ndarray]:
    """One kept-frame mask per episode: a frame is kept when every mask keeps it."""
    out: dict[int, np.ndarray] = {}
    for m in masks:
        for e, mask in m.items():
            out[e] = out[e] & mask if e in out else mask.copy()
    return out


def dropped_ranges(mask: np.ndarray) -> list[list[int]]:
    """The dropped frames of ``mask`` as ``[first, last]`` (inclusive) ranges."""
    d = np.r_[False, ~mask, False].astype(np.int8)
    edges = np.flatnonzero(np.diff(d))
    return [[int(a), int(b) - 1] for a, b in zip(edges[::2], edges[1::2])]


def selection_digest(masks: dict[int, np.ndarray]) -> str:
    """What the cut decides (for the rerun key): each cut episode and its mask."""
    import hashlib

    h = hashlib.sha256(b"episodekit-frames-v1\0")
    for e in sorted(masks):
        h.update(np.int64(e).tobytes())
        h.update(np.packbits(masks[e]).tobytes() + np.int64(len(masks[e])).tobytes())
    return h.hexdigest()[:16]


def kept_ranges(mask: np.ndarray) -> tuple[tuple[int, int], ...]:
    """The kept frames of ``mask`` as ``(start, end)`` ranges, end exclusive."""
    d = np.r_[False, np.asarray(mask, dtype=bool), False].astype(np.int8)
    edges = np.flatnonzero(np.diff(d))
    return tuple((int(a), int(b)) for a, b in zip(edges[::2], edges[1::2]))
