"""Pure computations of the per-file pass: a feature column as numpy, and per-episode summaries
(moments, steps, frozen runs, clipping, timing) by segment reductions over episode boundaries."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from episodekit.validate.quality.thresholds import (
    MAD_TO_SIGMA,
)


def feature_matrix(col: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray | None:
    """(rows, dim) float32 of a fixed-size/variable list (or scalar) column; None if ragged."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_fixed_size_list(t):
            if t.list_size != dim:
                return None
            values = col.values.slice(col.offset * dim, len(col) * dim)
        else:
            lengths = col.value_lengths().to_numpy(zero_copy_only=False)
            if not np.all(lengths == dim):
                return None
            values = col.flatten()
        x = values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(-1, dim)
        if col.null_count:
            x = x.copy()
            x[~col.is_valid().to_numpy(zero_copy_only=False)] = np.nan
        return x
    if dim != 1:
        return None
    return col.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(-1, 1)


def fill_nonfinite(x: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """Forward-fill NaN/inf per column (reported by ``data.nan``; here they must not look like
    jumps), leading ones become 0; ``prev``: the last finite values before ``x`` (a batch of a
    file continues from the one before it)."""
    if prev is not None:
        return fill_nonfinite(np.concatenate([prev[None, :].astype(x.dtype), x]))[1:]
    ok = np.isfinite(x)
    if ok.all():
        return x
    idx = np.where(ok, np.arange(len(x))[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    x = np.take_along_axis(x, idx, axis=0)
    return np.where(np.isfinite(x), x, 0.0).astype(np.float32)


@dataclass
class FeatureStats:
    """Per-episode summaries of one feature (rows: episodes of the file, columns: dimensions).
    Kept in the narrowest exact dtype (float32 as computed, int32 frame counts): the driver holds
    these for every episode of the dataset; the checks widen them to float64 where they divide
    (exact), so nothing they decide depends on it."""

    mins: np.ndarray
    maxs: np.ndarray
    sums: np.ndarray  # float32 per episode
    sumsq: np.ndarray
    maxstep: np.ndarray
    clip: np.ndarray  # int32: frames at the episode's min/max outside its edge runs (larger side)
    frozen_longest: np.ndarray  # (E,) int32: longest run of identical vectors
    frozen_mid: np.ndarray  # (E,) int32: longest such run touching neither the first nor last frame
    sample_values: np.ndarray  # strided rows (k, d)
    sample_steps: np.ndarray  # strided |steps| (k, d), NaN where zero or across episodes


@dataclass
class FileStats:
    file: str
    episodes: np.ndarray
    rows: np.ndarray
    ts_drops: np.ndarray | None = None  # number of steps > drop_factor / fps
    ts_missing: np.ndarray | None = None  # frames missing in those steps (round(dt*fps) - 1)
    ts_maxstep: np.ndarray | None = None  # largest step, in frames
    ts_interval: np.ndarray | None = None  # mean step x fps (NaN for single frames)
    features: dict[str, FeatureStats] = field(default_factory=dict)
    error: str | None = None


def episode_segments(ep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Episode ids, start offsets and lengths of the contiguous runs of ``ep``."""
    starts = np.flatnonzero(np.concatenate([[True], ep[1:] != ep[:-1]]))
    lengths = np.diff(np.append(starts, len(ep)))
    return ep[starts], starts, lengths


def feature_stats(
    x: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    stride: int,
    th: dict,
    first: int = 0,
    prev: np.ndarray | None = None,
) -> FeatureStats:
    """Per-episode summaries of one (frames, d) feature. Works on the transposed (d, frames)
    copy: every reduction then runs over contiguous memory (``reduceat`` along the last axis
    is several times faster than along the first). ``first``: the first row of the stride
    sample; ``prev``: what non-finite values at the start are filled from."""
    n, d = x.shape
    xt = np.ascontiguousarray(x.T)
    sums = np.add.reduceat(xt, starts, axis=1)
    if not np.isfinite(sums).all():
        xt = np.ascontiguousarray(fill_nonfinite(x, prev).T)
        sums = np.add.reduceat(xt, starts, axis=1)
    ends = starts + lengths - 1
    mins = np.minimum.reduceat(xt, starts, axis=1)
    maxs = np.maximum.reduceat(xt, starts, axis=1)
    sq = np.square(xt)
    sumsq = np.add.reduceat(sq, starts, axis=1)
    # Steps |x[t+1] - x[t]|, zero on the last frame of every episode (none across episodes).
    step = sq  # reuse the buffer
    np.subtract(xt[:, 1:], xt[:, :-1], out=step[:, :-1])
    step[:, ends] = 0
    np.abs(step, out=step)
    maxstep = np.maximum.reduceat(step, starts, axis=1)
    # Runs of identical vectors: a run ends where the vector changes or the episode ends.
    run_end = step.any(axis=0)
    run_end[ends] = True
    re_ = np.flatnonzero(run_end)
    rs = np.concatenate([[0], re_[:-1] + 1])
    rl = re_ - rs + 1
    long_ = rl >= 2
    rs, re_, rl = rs[long_], re_[long_], rl[long_]
    e_of = np.searchsorted(starts, rs, side="right") - 1
    frozen_longest = np.zeros(len(starts), np.int64)
    frozen_mid = np.zeros(len(starts), np.int64)
    np.maximum.at(frozen_longest, e_of, rl)
    mid = (rs > starts[e_of]) & (re_ < ends[e_of])
    np.maximum.at(frozen_mid, e_of[mid], rl[mid])
    # Saturation needs at least `need` equal frames, hence `need - 1` zero steps: only those
    # (dimension, episode) candidates are counted exactly, one by one.
    need = np.maximum(th["clip_min_frames"], np.ceil(th["clip_share"] * lengths))[None, :]
    zero_steps = np.add.reduceat(step == 0, starts, axis=1)  # (+1: the episode's last frame)
    clip = np.zeros((len(starts), d), np.int32)
    moving = maxs > mins
    for j, e in zip(*np.nonzero((zero_steps >= np.maximum(1, need // 2)) & moving)):
        clip[e, j] = clipped_frames(xt[j, starts[e] : ends[e] + 1], mins[j, e], maxs[j, e])
    sample_steps = step[:, first::stride].T.copy()
    sample_steps[sample_steps == 0] = np.nan
    return FeatureStats(
        mins.T,
        maxs.T,
        sums.T,
        sumsq.T,
        maxstep.T,
        clip,
        frozen_longest.astype(np.int32),
        frozen_mid.astype(np.int32),
        x[first::stride].copy(),
        sample_steps,
    )


def clipped_frames(v: np.ndarray, lo: float, hi: float) -> int:
    """Frames of one episode's dimension at its min or max, outside the constant runs at the
    start and the end (a robot at rest there is not saturation); the larger side."""
    change = np.flatnonzero(v[1:] != v[:-1])
    first, last = change[0] + 1, change[-1]  # v[first:last + 1] excludes the edge runs
    inner = v[first : last + 1]
    return int(max((inner == lo).sum(), (inner == hi).sum()))


TS_FILL = {"ts_drops": 0, "ts_missing": 0, "ts_maxstep": np.nan, "ts_interval": np.nan}


def last_finite(x: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
    """Per dimension, the last finite value of ``x`` (``prev``'s where ``x`` has none)."""
    ok = np.isfinite(x)
    last = np.where(
        ok.any(axis=0), x[len(x) - 1 - np.argmax(ok[::-1], axis=0), np.arange(x.shape[1])], np.nan
    )
    if prev is not None:
        last = np.where(np.isnan(last), prev, last)
    return last.astype(np.float32)


def robust_scales(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    vals = cols["sample_values"]
    steps = cols["sample_steps"]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: no scale, NaN
        if len(vals):
            lo, hi = np.nanquantile(vals, [0.01, 0.99], axis=0)
        else:
            lo = hi = np.full(vals.shape[1], np.nan)
        step_sigma = (
            MAD_TO_SIGMA * np.nanmedian(steps, axis=0)
            if len(steps) and np.isfinite(steps).any()
            else np.full(vals.shape[1], np.nan)
        )
    return {"lo": lo, "hi": hi, "span": hi - lo, "step_sigma": step_sigma}
