"""Normalization statistics: exact per-episode and dataset stats in LeRobot v3.0's layout.

For every numeric feature (per dimension) the LeRobot keys ``min, max, mean, std, count, q01, q10,
q50, q90, q99``: per episode in the ``stats/{feature}/{key}`` columns of ``meta/episodes/*.parquet``
(``list<double>``, count ``list<int64>``) and for the dataset in ``meta/stats.json`` (lists of
floats, count ``[N]``), so LeRobot's ``load_stats`` / episode reader take them unchanged.

How (one streaming pass per data file, files in parallel through the executor):

- data is decoded in blocks of about 64 MiB of feature values (``block_rows``): consecutive
  whole row groups (faster than record batches; prepare's 32 MiB groups are one block each), a
  larger group cut into record batches; an episode that continues into the next block is carried
  over, so every episode is reduced whole;
- per block and feature, one C-order ``(D, rows)`` copy; per episode: mean/M2 by segment
  reductions (``np.add.reduceat``, one dimension at a time), min/max/quantiles exact from a padded
  per-episode sort (episodes grouped by length so padding stays small), numpy's "linear" rule
  (``np.quantile``'s default) reproduced to the bit. One comparison pass finds dimensions
  already ascending inside every episode (index, frame_index, timestamp, constants): their order
  statistics are read in place, unsorted; dimensions ascending over the whole block skip the
  block sort too;
- dataset mean/std: counts-weighted parallel merge of the per-episode (count, mean, M2) (Chan et
  al.), min/max of the episodes' min/max;
- dataset quantiles: every block contributes a mergeable rank summary (``m`` order statistics
  of its sorted columns, each weighted by the ranks it stands for; a summary's rank error is its
  largest weight - 1, and errors of merged summaries add). ``quantiles="exact"``: each scan job
  appends its blocks' sorted columns to one spill file (run-length encoded where values repeat,
  with every 512th value kept in memory as a fence); the merged summary brackets every wanted
  order statistic, and a selection reads only the windows the searches need and the few values
  inside the brackets (``pread``, no memory map), which gives exactly what ``np.quantile`` over
  the whole column gives, as long as the columns fit ``memory_mb``; beyond it, or with
  ``quantiles="sketch"``, the quantiles come from the summary and their rank-error bound is
  recorded. Never from an envelope of per-episode quantiles.

Provenance lives in ``meta/episodekit_stats.parquet`` (never in stats.json, which LeRobot reads as
features): one row per (feature, dimension) with the dataset's compacted rank summary (what a
mixture merges, see :func:`merge_stats`), and JSON key-value metadata: version, fingerprint, the
data files' state (size, parquet footer), mode and rank-error bounds per feature, and what
was written.
Writes are atomic and rank-gated (only the global main process writes); a read-only or remote root
gets the in-memory result and one warning.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import posixpath
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from episodekit.core.atomic import atomic_path, atomic_write_bytes
from episodekit.core.dataset import V3, Dataset, DatasetError, as_dataset, is_local, resolve_root
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.executor import imap_files, map_files
from episodekit.core.logs import log_once
from episodekit.core.memory import release_memory
from episodekit.core.world import rank_info
from episodekit.metadata.episode_stats import QUANTILE_KEYS, EpisodeFold, EpisodeStats
from episodekit.metadata.image_stats import (
    ImageStats,
    compute_image_stats,
    image_features,
    require_decoders,
)

log = logging.getLogger(__name__)

STATS_FILE = "meta/stats.json"
SUMMARY_FILE = "meta/episodekit_stats.parquet"
SUMMARY_KEY = b"episodekit_stats"
STATS_VERSION = 1
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILE_KEYS)
ORDERED_KEYS = ("min", *QUANTILE_KEYS, "max")  # must be ascending
NON_NUMERIC_DTYPES = ("image", "video", "string", "language")
QUANTILE_MODES = ("exact", "sketch")
DEFAULT_SKETCH_POINTS = 1024  # order statistics kept per batch of rows (per dimension)
STORED_SKETCH_POINTS = 2048  # points per dimension kept in the summary file
DEFAULT_MEMORY_MB = 4096.0  # budget for the sorted columns the exact selection holds
BLOCK_BYTES = 64 * 2**20  # decoded feature bytes per block: prepare's 32 MiB row groups fit whole
READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


# --------------------------------------------------------------------------------------------
# Features


def numeric_features(info: dict, only: list[str] | None = None) -> dict[str, int]:
    """``{name: dims}`` of the features stats are computed for: every non-image/video/string
    feature of one-dimensional shape (``[D]``), in info.json order; ``only`` selects some."""
    feats = info.get("features") or {}
    out: dict[str, int] = {}
    for name, f in feats.items():
        if not isinstance(f, dict) or f.get("dtype") in NON_NUMERIC_DTYPES:
            continue
        shape = f.get("shape") or [1]
        if len(shape) != 1:
            continue  # multi-dimensional tensors: not normalized per dimension by LeRobot either
        out[name] = int(shape[0])
    return pick_features(out, only, "this dataset")


def pick_features(found: dict, only: Sequence[str] | None, of: str) -> dict:
    """``found`` restricted to the ``--features`` names in ``only`` (all when None); a name that
    is not in ``found`` is a ValueError listing the choices (``of``: whose features, for it)."""
    if not only:
        return found
    unknown = [n for n in only if n not in found]
    if unknown:
        raise ValueError(
            f"--features {unknown}: not numeric one-dimensional features of {of} "
            f"(choose from {sorted(found)})"
        )
    return {n: d for n, d in found.items() if n in only}


# --------------------------------------------------------------------------------------------
# Quantiles: numpy's "linear" rule, and the mergeable rank summary


def lerp_quantile(a: np.ndarray, b: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """numpy's ``_lerp``: the same arithmetic as ``np.quantile(method="linear")``, bit for bit."""
    diff = b - a
    out = a + diff * gamma
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), out)


def order_indices(n: np.ndarray | int, q: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``n`` values and quantile ``q``: the two 0-based order statistics numpy interpolates
    between and the weight (``virtual index = (n - 1) * q``)."""
    n = np.asarray(n, dtype=np.int64)
    h = (n - 1) * q
    k0 = np.floor(h).astype(np.int64)
    k1 = np.minimum(k0 + 1, np.maximum(n - 1, 0))
    return k0, k1, h - k0


@dataclass
class Sketch:
    """A mergeable rank summary of one dimension: sorted ``values`` with ``weights`` (how many
    data ranks each stands for). Estimated count(x <= v) = sum of weights of values <= v; the true
    count is in ``[estimate, estimate + rank_error]``. A summary with all weights 1 is the data."""

    values: np.ndarray
    weights: np.ndarray
    rank_error: float

    @property
    def total(self) -> float:
        return float(self.weights.sum())

    def compact(self, points: int) -> Sketch:
        """At most ``points`` values; the rank error grows by the largest new weight - 1."""
        if len(self.values) <= points:
            return self
        cum = np.cumsum(self.weights)
        targets = cum[-1] * np.arange(1, points + 1) / points
        idx = np.unique(np.minimum(np.searchsorted(cum, targets - 1e-9), len(cum) - 1))
        new_cum = cum[idx]
        weights = np.diff(new_cum, prepend=0.0)
        return Sketch(self.values[idx], weights, self.rank_error + float(weights.max()) - 1)

    def order_statistic(self, k: np.ndarray) -> np.ndarray:
        """Estimated value of the 0-based order statistics ``k``: its true rank is within
        ``rank_error`` of ``k`` (centred: within half of it where the summary allows)."""
        cum = np.cumsum(self.weights)
        target = np.asarray(k, dtype=np.float64) + 1 - self.rank_error / 2
        idx = np.minimum(np.searchsorted(cum, target - 1e-9), len(cum) - 1)
        return self.values[idx]


def merge_sketches(sketches: list[Sketch], scales: list[float] | None = None) -> Sketch:
    """One summary of the union (weights multiplied by ``scales`` for a weighted mixture)."""
    scales = scales or [1.0] * len(sketches)
    values = np.concatenate([s.values for s in sketches])
    weights = np.concatenate([s.weights * c for s, c in zip(sketches, scales)])
    order = np.argsort(values, kind="stable")
    error = sum(s.rank_error * c for s, c in zip(sketches, scales))
    return Sketch(values[order], weights[order], error)


def _part_summary(sorted_cols: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank summary of one batch: ``(values (m, D), weights (m,))`` from its sorted columns
    ``(D, n)``; ranks ``ceil(j n / m)``, so every weight is at most ``ceil(n / m)``."""
    n = sorted_cols.shape[1]
    if n <= points:
        ranks = np.arange(1, n + 1, dtype=np.int64)
    else:
        j = np.arange(1, points + 1, dtype=np.int64)
        ranks = np.unique((j * n + points - 1) // points)
    return sorted_cols[:, ranks - 1].T.astype(np.float64), np.diff(ranks, prepend=0)


# --------------------------------------------------------------------------------------------
# Stats of one feature, and merging them


@dataclass
class FeatureStats:
    """Stats of one feature over a set of frames, with the summary its quantiles merge through.

    ``count`` frames (a mixture's merge keeps the true frame count), per-dimension ``mean``,
    ``m2`` (sum of squared deviations, in units of ``mass``: frames, or mixture weight),
    ``min``, ``max``, ``quantiles`` (5 x D, exact when ``quantile_error`` is 0) and per-dimension
    ``sketches``."""

    count: int
    mass: float
    mean: np.ndarray
    m2: np.ndarray
    min: np.ndarray
    max: np.ndarray
    quantiles: np.ndarray
    sketches: list[Sketch]
    quantile_error: float = 0.0  # rank-error bound of ``quantiles`` (in units of mass)

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.m2 / self.mass, 0.0))

    def sketch_quantiles(self) -> np.ndarray:
        """Quantiles (5 x D) read from the summaries."""
        out = np.empty((len(QUANTILES), len(self.sketches)))
        for d, s in enumerate(self.sketches):
            n = int(round(s.total))
            for i, q in enumerate(QUANTILES):
                k0, k1, g = order_indices(n, q)
                a, b = s.order_statistic(np.array([k0, k1]))
                out[i, d] = lerp_quantile(a, b, g)
        return out

    def to_lerobot(self) -> dict[str, list]:
        """The LeRobot stats dict of this feature (JSON-ready lists; count ``[N]``)."""
        out: dict[str, list] = {
            "min": self.min.tolist(),
            "max": self.max.tolist(),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "count": [int(self.count)],
        }
        for i, key in enumerate(QUANTILE_KEYS):
            out[key] = self.quantiles[i].tolist()
        return out


def merge_stats(
    parts: list[dict[str, FeatureStats]], weights: list[float] | None = None
) -> dict[str, FeatureStats]:
    """Merge the stats of several datasets (or halves of one) feature by feature.

    Without ``weights`` every frame counts once: mean and std by the counts-weighted parallel
    merge (Chan et al.), min/max of the parts, quantiles from the merged summaries (exact when
    every part's summary is its full data, else within the summed rank-error bound). With
    ``weights`` (a mixture, weights as sampled) part ``i`` contributes probability mass
    ``weights[i] / sum(weights)``: mean, std and quantiles are those of the mixture distribution;
    ``count`` stays the total number of frames. Only features present in every part are merged.
    """
    if not parts:
        raise ValueError("merge_stats needs at least one part")
    if weights is not None:
        if len(weights) != len(parts) or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights must be {len(parts)} non-negative numbers, not all 0")
    names = [n for n in parts[0] if all(n in p for p in parts[1:])]
    out: dict[str, FeatureStats] = {}
    for name in names:
        fs = [p[name] for p in parts]
        frames = float(sum(f.count for f in fs))
        if weights is None:
            mass = np.array([f.mass for f in fs], dtype=np.float64)
        else:  # mixture mass in frame units: quantile ranks stay comparable with a dataset's
            total_w = float(sum(weights))
            mass = np.array([frames * w / total_w for w in weights], dtype=np.float64)
        scale = mass / np.array([f.mass for f in fs], dtype=np.float64)  # per-part mass factor
        total = mass.sum()
        means = np.stack([f.mean for f in fs])
        mean = (means * mass[:, None]).sum(0) / total
        m2 = sum(f.m2 * c for f, c in zip(fs, scale)) + ((means - mean) ** 2 * mass[:, None]).sum(0)
        dims = len(fs[0].sketches)
        sketches = [
            merge_sketches(
                [f.sketches[d] for f in fs],
                [c * f.mass / f.sketches[d].total for f, c in zip(fs, scale)],
            )
            for d in range(dims)
        ]
        merged = FeatureStats(
            count=int(sum(f.count for f in fs)),
            mass=float(total),
            mean=mean,
            m2=m2,
            min=np.min(np.stack([f.min for f in fs]), 0),
            max=np.max(np.stack([f.max for f in fs]), 0),
            quantiles=np.zeros((len(QUANTILES), dims)),
            sketches=sketches,
            quantile_error=max(s.rank_error for s in sketches),
        )
        merged.quantiles = merged.sketch_quantiles()
        out[name] = merged
    return out


# --------------------------------------------------------------------------------------------
# Reading feature values


def feature_values(col: pa.Array | pa.ChunkedArray, dims: int, name: str) -> np.ndarray:
    """A feature column as ``(rows, dims)`` numpy (its own numeric dtype; bool as uint8)."""
    if isinstance(col, pa.ChunkedArray):  # combine_chunks copies even a single chunk
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    t = col.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        if not pa.types.is_fixed_size_list(t):
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            if len(lengths) and not np.all(lengths == dims):
                raise DatasetError(f"feature {name!r}: list lengths differ from its shape [{dims}]")
        elif t.list_size != dims:
            raise DatasetError(f"feature {name!r} has {t.list_size} values, info.json says {dims}")
        flat = pc.list_flatten(col)
    else:
        if dims != 1:
            raise DatasetError(f"feature {name!r} is a scalar column, info.json says [{dims}]")
        flat = col
    if pa.types.is_boolean(flat.type):
        flat = flat.cast(pa.uint8())
    return flat.to_numpy(zero_copy_only=False).reshape(-1, dims)


def _pad_value(dtype: np.dtype):
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def _segments(ep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]]) if len(ep) else np.zeros(0, np.int64)
    return starts, np.diff(np.r_[starts, len(ep)])


def _episode_quantiles(
    xt: np.ndarray, starts: np.ndarray, lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact per-episode quantiles ``(5, episodes, D)``, min and max ``(episodes, D)`` of the
    columns ``xt`` (D, rows): episodes of similar length (quarter octaves) share a padded matrix
    (all classes laid out in one buffer, filled by one scatter) sorted row-wise, so nothing loops
    per frame."""
    n, dims = len(starts), xt.shape[0]
    out = np.empty((len(QUANTILES), n, dims))
    lo = np.empty((n, dims))
    hi = np.empty((n, dims))
    cls = np.ceil(np.log2(np.maximum(lens, 1)) * 4).astype(np.int64)
    classes, inverse, counts = np.unique(cls, return_inverse=True, return_counts=True)
    width = np.zeros(len(classes), np.int64)
    np.maximum.at(width, inverse, lens)
    base = np.concatenate([[0], np.cumsum(counts * width)])
    order = np.argsort(inverse, kind="stable")
    slot = np.empty(n, np.int64)  # position of each episode inside its class
    slot[order] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
    offset = base[inverse] + slot * width[inverse]
    dst = np.arange(int(lens.sum())) + np.repeat(offset - starts, lens)
    buf = np.full((dims, int(base[-1])), _pad_value(xt.dtype), dtype=xt.dtype)
    buf[:, dst] = xt
    qs = np.asarray(QUANTILES)[:, None]
    ends = np.cumsum(counts)
    for c in range(len(classes)):
        sel = order[ends[c] - counts[c] : ends[c]]
        length = lens[sel]
        mat = buf[:, base[c] : base[c + 1]].reshape(dims, len(sel), int(width[c]))
        mat.sort(axis=-1)
        rows = np.arange(len(sel))
        lo[sel] = mat[:, rows, 0].T
        hi[sel] = mat[:, rows, length - 1].T
        k0, k1, g = order_indices(length[None, :], qs)  # (5, episodes)
        a = mat[:, rows[None, :], k0].astype(np.float64)  # (D, 5, episodes)
        b = mat[:, rows[None, :], k1].astype(np.float64)
        out[:, sel] = lerp_quantile(a, b, g[None]).transpose(1, 2, 0)
    return out, lo, hi


def _episode_order_stats(
    xt: np.ndarray, starts: np.ndarray, lens: np.ndarray, ep_sorted: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-episode quantiles ``(5, episodes, D)``, min and max ``(episodes, D)`` of ``xt``
    (D, rows). Dimensions already ascending inside every episode (``ep_sorted``: index,
    frame_index, timestamp, constant columns) are read in place; the others are sorted per
    episode (:func:`_episode_quantiles`)."""
    n, dims = len(starts), xt.shape[0]
    if not ep_sorted.any():
        return _episode_quantiles(xt, starts, lens)
    out = np.empty((len(QUANTILES), n, dims))
    lo = np.empty((n, dims))
    hi = np.empty((n, dims))
    done = np.flatnonzero(ep_sorted)
    k0, k1, g = order_indices(lens[None, :], np.asarray(QUANTILES)[:, None])  # (5, episodes)
    sub = xt[done]
    lo[:, done] = sub[:, starts].T
    hi[:, done] = sub[:, starts + lens - 1].T
    a = sub[:, starts + k0].astype(np.float64)  # (d, 5, episodes)
    b = sub[:, starts + k1].astype(np.float64)
    out[:, :, done] = lerp_quantile(a, b, g[None]).transpose(1, 2, 0)
    rest = np.flatnonzero(~ep_sorted)
    if len(rest):
        q, lo[:, rest], hi[:, rest] = _episode_quantiles(xt[rest], starts, lens)
        out[:, :, rest] = q
    return out, lo, hi


FENCE = 512  # every FENCE-th value of a spilled run stays in memory: its searches read one window


class _Run(NamedTuple):
    """One spilled sorted column of one block: ``length`` values of ``dtype`` at ``offset`` of
    ``path``; run-length encoded when ``counts_offset >= 0`` (distinct values, then their int64
    counts there), else raw with ``fence`` (``values[::FENCE]``)."""

    path: str
    dim: int
    dtype: str
    offset: int
    length: int
    counts_offset: int
    fence: np.ndarray | None


class _Spill:
    """One scan job's spill file: every block's sorted columns, one record per dimension,
    appended with large sequential writes. A column with many repeats (integer ids, timestamps)
    is stored run-length encoded (distinct values + counts), the rest as raw values."""

    def __init__(self, path: str):
        self.path = path
        self.fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.offset = 0

    def _write(self, arr: np.ndarray) -> int:
        """Append ``arr``; returns its offset."""
        at = self.offset
        self.fh.write(np.ascontiguousarray(arr).data)
        self.offset += arr.nbytes
        return at

    def add(self, sorted_cols: np.ndarray) -> list[_Run]:
        """The records of one block's sorted columns ``(D, rows)``."""
        out = []
        rows = sorted_cols.shape[1]
        for j, col in enumerate(sorted_cols):
            distinct = int(np.count_nonzero(col[1:] != col[:-1])) + 1
            dt = col.dtype.str
            if distinct * (col.itemsize + 8) * 2 <= col.nbytes:
                first = np.r_[0, np.flatnonzero(col[1:] != col[:-1]) + 1]
                counts = np.diff(np.r_[first, rows]).astype(np.int64)
                at = self._write(col[first])
                out.append(_Run(self.path, j, dt, at, len(first), self._write(counts), None))
            else:
                fence = col[::FENCE].copy()
                out.append(_Run(self.path, j, dt, self._write(col), rows, -1, fence))
        return out

    def close(self) -> None:
        self.fh.close()


class _RunReader:
    """Reads slices of spilled runs with ``pread`` (no memory map: a mapped page-cache file
    counts fully towards RSS once the kernel maps its large folios)."""

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def read(self, run: _Run, start: int, stop: int, counts: bool = False) -> np.ndarray:
        dt = np.dtype(np.int64) if counts else np.dtype(run.dtype)
        base = run.counts_offset if counts else run.offset
        if run.path not in self.fds:
            self.fds[run.path] = os.open(run.path, os.O_RDONLY)
        want = (stop - start) * dt.itemsize
        buf = bytearray()
        while len(buf) < want:
            got = os.pread(
                self.fds[run.path], want - len(buf), base + start * dt.itemsize + len(buf)
            )
            if not got:
                raise DatasetError(f"spilled run truncated ({run.path})")
            buf += got
        return np.frombuffer(buf, dt)

    def count(self, run: _Run, keys: np.ndarray, side: str) -> np.ndarray:
        """``np.searchsorted(values, keys, side)`` over a raw run, one window read per key."""
        ts = np.searchsorted(run.fence, keys, side=side)
        out = np.empty(len(keys), np.int64)
        for i, (key, t) in enumerate(zip(keys, ts.tolist())):
            start, stop = max(0, (t - 1) * FENCE), min(run.length, t * FENCE)
            window = self.read(run, start, stop) if stop > start else run.fence[:0]
            out[i] = start + int(np.searchsorted(window, key, side=side))
        return out

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _block(
    pieces: list[np.ndarray],
    starts: np.ndarray,
    lens: np.ndarray,
    points: int,
    spill: _Spill | None,
) -> dict:
    """Per-episode stats of complete episodes (rows of ``pieces`` concatenated) plus the block's
    rank summary; with ``spill`` the block's sorted columns are appended there (``runs``)."""
    rows = sum(len(p) for p in pieces)
    xt = np.empty((pieces[0].shape[1], rows), pieces[0].dtype)  # (D, rows), C order
    np.concatenate([p.T for p in pieces], axis=1, out=xt)
    mean = np.empty((xt.shape[0], len(starts)))
    m2 = np.empty_like(mean)
    for j, row in enumerate(xt):  # one dimension at a time: float64 temporaries stay small
        xf = row.astype(np.float64)
        mean[j] = np.add.reduceat(xf, starts) / lens
        xf -= np.repeat(mean[j], lens)
        xf *= xf
        m2[j] = np.add.reduceat(xf, starts)
    # one comparison pass tells which dimensions need sorting (NaN counts as out of order)
    ascending = xt[:, 1:] >= xt[:, :-1]
    block_sorted = ascending.all(axis=1)
    ascending[:, starts[1:] - 1] = True  # pairs across an episode boundary do not matter
    ep_sorted = ascending.all(axis=1)
    del ascending
    q, lo, hi = _episode_order_stats(xt, starts, lens, ep_sorted)
    for j in np.flatnonzero(~block_sorted):
        xt[j].sort()
    values, weights = _part_summary(xt, points)
    runs = spill.add(xt) if spill is not None else []
    return {
        "min": lo,
        "max": hi,
        "mean": mean.T,
        "m2": m2.T,
        "q": q,
        "sketch": (values, weights),
        "runs": runs,
    }


def _open_parquet(root: str, rel: str) -> pq.ParquetFile:
    fs, path = resolve_root(root)
    full = posixpath.join(path, rel)
    try:
        if is_local(fs):
            return pq.ParquetFile(full)
        return pq.ParquetFile(fs.open(full, "rb"))
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"unreadable parquet ({exc})", full) from exc


def _batches(pf: pq.ParquetFile, columns: list[str], rows: int):
    """The file's rows in blocks of at most ``rows`` rows: consecutive row groups that fit are
    decoded together (whole row groups decode faster than record batches, and LeRobot's
    one-group-per-episode files do not become one block per episode); a larger row group is
    cut into record batches."""
    missing = [c for c in columns if c not in pf.schema_arrow.names]
    if missing:
        raise DatasetError(f"data file lacks columns {missing}")
    groups: list[int] = []
    held = 0
    for i in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(i).num_rows
        if groups and held + n > rows:
            yield pf.read_row_groups(groups, columns=columns, use_threads=False)
            groups, held = [], 0
        if n > rows:
            yield from pf.iter_batches(
                batch_size=rows, row_groups=[i], columns=columns, use_threads=False
            )
            continue
        groups.append(i)
        held += n
    if groups:
        yield pf.read_row_groups(groups, columns=columns, use_threads=False)


def scan_file(job: dict) -> dict:
    """Pass 1 over one data file (executor job): per-episode stats and rank summaries.

    ``job``: root, rel, features ``{name: dims}``, points, batch_rows, and optionally spill (a
    folder) and file_id: every block's sorted columns are appended to one file there (``runs``:
    per feature, records of :class:`_Spill`). Returns ``episodes`` (episode_index in file
    order), ``count`` per episode and per feature ``min, max, mean, m2, q`` (5 x episodes x D)
    and ``sketch`` parts [(values, weights)]."""
    feats: dict[str, int] = job["features"]
    pf = _open_parquet(job["root"], job["rel"])
    columns = list(dict.fromkeys(["episode_index", *feats]))
    parts: list[dict] = []
    eps: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    carry_ep = np.zeros(0, np.int64)
    carry: dict[str, np.ndarray] = {}
    spill = None
    if job.get("spill") is not None:
        spill = _Spill(os.path.join(job["spill"], f"{job['file_id']}.bin"))

    def flush(ep: np.ndarray, pieces: dict[str, list[np.ndarray]]) -> None:
        starts, lens = _segments(ep)
        eps.append(ep[starts])
        counts.append(lens)
        parts.append({n: _block(p, starts, lens, job["points"], spill) for n, p in pieces.items()})

    try:
        for batch in _batches(pf, columns, job["batch_rows"]):
            ep = batch.column("episode_index").to_numpy().astype(np.int64, copy=False)
            if not len(ep):
                continue
            vals = {n: feature_values(batch.column(n), d, n) for n, d in feats.items()}
            last = int(_segments(ep)[0][-1])  # the last episode may go on in the next block
            if last == 0 and len(carry_ep) and carry_ep[-1] == ep[0]:  # it still goes on
                carry_ep = np.concatenate([carry_ep, ep])
                carry = {n: np.concatenate([carry[n], v]) for n, v in vals.items()}
                continue
            head = np.concatenate([carry_ep, ep[:last]])
            if len(head):
                held = {n: [carry[n]] if carry else [] for n in feats}
                flush(head, {n: [*held[n], v[:last]] for n, v in vals.items()})
            carry_ep = ep[last:].copy()
            carry = {n: v[last:].copy() for n, v in vals.items()}  # frees the decoded block
            del batch, vals
            pa.default_memory_pool().release_unused()  # keeps a worker's RSS at one block
        if len(carry_ep):
            flush(carry_ep, {n: [c] for n, c in carry.items()})
    except DatasetError as exc:
        raise DatasetError(str(exc), posixpath.join(job["root"], job["rel"])) from exc
    finally:
        if spill is not None:
            spill.close()
    out: dict[str, Any] = {
        "runs": {n: [r for p in parts for r in p[n]["runs"]] for n in feats},
        "episodes": np.concatenate(eps) if eps else np.zeros(0, np.int64),
        "count": np.concatenate(counts) if counts else np.zeros(0, np.int64),
        "features": {},
    }
    for n, d in feats.items():
        f = {
            k: np.concatenate([p[n][k] for p in parts]) if parts else np.zeros((0, d))
            for k in ("min", "max", "mean", "m2")
        }
        f["q"] = (
            np.concatenate([p[n]["q"] for p in parts], axis=1) if parts else np.zeros((5, 0, d))
        )
        f["sketch"] = [p[n]["sketch"] for p in parts]
        out["features"][n] = f
    return out


def refine_file(job: dict) -> dict:
    """Pass 2 over one data file (exact quantiles): per feature and bracket ``(lo, hi)`` (5 x D
    each), how many values are ``<= lo`` and the values strictly inside ``(lo, hi)``."""
    feats: dict[str, int] = job["features"]
    pf = _open_parquet(job["root"], job["rel"])
    below = {n: np.zeros((len(QUANTILES), d), np.int64) for n, d in feats.items()}
    found: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {n: [] for n in feats}
    for batch in _batches(pf, list(feats), job["batch_rows"]):
        for n, d in feats.items():
            x = feature_values(batch.column(n), d, n).astype(np.float64)
            for i in range(len(QUANTILES)):
                above = x > job["lo"][n][i]
                below[n][i] += len(x) - above.sum(0)
                flat = np.flatnonzero(above & (x < job["hi"][n][i]))
                qi = np.full(len(flat), i, dtype=np.int8)
                found[n].append((qi, (flat % d).astype(np.int32), x.reshape(-1)[flat]))
    return {
        "below": below,
        "inside": {
            n: _run_length(*(np.concatenate([f[i] for f in parts]) for i in range(3)))
            if parts
            else (np.zeros(0, np.int8), np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int64))
            for n, parts in found.items()
        },
    }


def _run_length(qi: np.ndarray, dim: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, ...]:
    """Candidates as distinct (quantile, dimension, value) with their counts: a tie (a constant
    or few-valued dimension) travels as one entry, not as every frame that holds it."""
    if not len(val):
        return qi, dim, val, np.zeros(0, np.int64)
    order = np.lexsort((val, dim, qi))
    qi, dim, val = qi[order], dim[order], val[order]
    new = np.concatenate(
        [[True], (qi[1:] != qi[:-1]) | (dim[1:] != dim[:-1]) | (val[1:] != val[:-1])]
    )
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(val)))
    return qi[starts], dim[starts], val[starts], counts.astype(np.int64)


# --------------------------------------------------------------------------------------------
# The whole dataset


@dataclass
class StatsResult:
    """Everything one computation produced (what is written, plus how)."""

    features: dict[str, int]
    episode_index: np.ndarray  # sorted
    episode_count: np.ndarray
    episode: EpisodeStats  # name -> key -> (episodes, D) (count excluded), on local disk
    dataset: dict[str, FeatureStats]
    mode: dict[str, str]  # name -> "exact" | "sketch"
    rank_error: dict[str, float]  # name -> bound of the dataset quantiles, as a fraction of N
    fingerprint: str = ""
    state: str = ""
    info: dict = field(default_factory=dict)
    images: ImageStats | None = None  # image/video stats (``images=True``), else kept as they are

    def lerobot_stats(self) -> dict[str, dict[str, list]]:
        out = {n: self.dataset[n].to_lerobot() for n in self.features}
        if self.images is not None:
            out.update(self.images.lerobot_stats())
        return out


def _footer_bytes(fs, full: str) -> tuple[int, bytes]:
    """(size, footer bytes) of a parquet file: its content's fingerprint, without data pages."""
    with fs.open(full, "rb") as fh:
        size = fh.seek(0, 2)
        if size < 12:
            return size, b""
        fh.seek(size - 8)
        n = int.from_bytes(fh.read(4), "little")
        fh.seek(max(0, size - 8 - n))
        return size, fh.read(n)


def data_state(ds: Dataset) -> str:
    """Digest of the data files' state (relative path, size and parquet footer): changed data
    makes the stats stale; a byte-identical copy elsewhere (other mtimes) keeps them fresh."""
    h = hashlib.sha256(b"episodekit-stats-data-v1\0")
    for rel in ds.data_files:
        try:
            size, footer = _footer_bytes(ds.fs, ds.join(rel))
        except FileNotFoundError:
            h.update(f"{rel}\0missing\0".encode())
            continue
        h.update(f"{rel}\0{size}\0".encode())
        h.update(hashlib.sha256(footer).digest())
    return h.hexdigest()[:32]


SKETCH_CAP = 65_536  # points per dimension a dataset's merged summary keeps at most


MOMENT_CHUNK = 16_384  # episodes whose stats are merged at a time (memory: a chunk's, not all)


def _moments(per: EpisodeStats, n: str, w: np.ndarray, total: int) -> tuple[np.ndarray, ...]:
    """Dataset mean, m2 (Chan: the episodes' m2 plus their means' spread), min and max of one
    feature from its episodes' stats, :data:`MOMENT_CHUNK` episodes at a time."""
    mean = None
    for rows, c in per.chunks(n, ("mean",), MOMENT_CHUNK):
        part = (c["mean"] * w[rows]).sum(0)
        mean = part if mean is None else mean + part
    if mean is None:  # no episodes: nothing to merge
        raise DatasetError("no episodes to compute stats over")
    mean = mean / total
    m2 = lo = hi = None
    for rows, c in per.chunks(n, ("m2", "mean", "min", "max"), MOMENT_CHUNK):
        part = c["m2"].sum(0) + (w[rows] * (c["mean"] - mean) ** 2).sum(0)
        m2 = part if m2 is None else m2 + part
        lo = c["min"].min(0) if lo is None else np.minimum(lo, c["min"].min(0))
        hi = c["max"].max(0) if hi is None else np.maximum(hi, c["max"].max(0))
    return mean, m2, lo, hi


def _dataset_stats(feats, per: EpisodeStats, fold: EpisodeFold) -> dict[str, FeatureStats]:
    """Chan's merge of the episodes' moments; min/max; the merged rank summaries (one
    dimension at a time, at most :data:`SKETCH_CAP` points each: 64 blocks' worth, ~16M
    frames, kept whole; beyond, compacted with its rank error recorded)."""
    out = {}
    total = int(per.count.sum())
    w = per.count.astype(np.float64)[:, None]
    for n, d in feats.items():
        mean, m2, lo, hi = _moments(per, n, w, total)
        sketches = []
        for j in range(d):
            values, weights, error = fold.summary(n, j)
            order = np.argsort(values, kind="stable")
            sketches.append(Sketch(values[order], weights[order], error).compact(SKETCH_CAP))
        error = max(s.rank_error for s in sketches)
        fs = FeatureStats(
            count=total,
            mass=float(total),
            mean=mean,
            m2=m2,
            min=lo,
            max=hi,
            quantiles=np.zeros((len(QUANTILES), d)),
            sketches=sketches,
            quantile_error=error,
        )
        fs.quantiles = fs.sketch_quantiles()
        out[n] = fs
    return out


def _brackets(fs: FeatureStats) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Per quantile and dimension, values ``lo < x_(k0) <= x_(k1) <= hi`` from the summary, the
    order statistics k0, k1 and an upper bound on the candidates inside the brackets."""
    dims = len(fs.sketches)
    lo = np.empty((len(QUANTILES), dims))
    hi = np.empty((len(QUANTILES), dims))
    k0s, k1s, _ = order_indices(fs.count, np.asarray(QUANTILES))
    bound = 0.0
    for d, s in enumerate(fs.sketches):
        # est(v) counts every point <= v: a run of equal values gets its last cumsum
        cum = np.cumsum(s.weights)[np.searchsorted(s.values, s.values, side="right") - 1]
        e = s.rank_error
        for i, (k0, k1) in enumerate(zip(k0s.tolist(), k1s.tolist())):
            j_lo = int(np.searchsorted(cum, k0 - e, side="right")) - 1
            j_hi = min(int(np.searchsorted(cum, k1 + 1, side="left")), len(cum) - 1)
            lo[i, d] = s.values[j_lo] if j_lo >= 0 else -np.inf
            hi[i, d] = s.values[j_hi]
            bound += (cum[j_hi - 1] if j_hi > 0 else 0) + e - (cum[j_lo] if j_lo >= 0 else 0)
    return lo, hi, np.array(k0s), np.array(k1s), bound


def _select(
    fs: FeatureStats, brackets: tuple, below: np.ndarray, inside: tuple[np.ndarray, ...]
) -> None:
    """Exact quantiles from the bracket counts and the sorted candidates (in place).
    ``inside``: (quantile, dimension, value) or, run-length encoded, (..., value, count)."""
    lo, hi, k0s, k1s, _ = brackets
    d = len(fs.sketches)
    qi, dim, val = inside[:3]
    cnt = inside[3] if len(inside) > 3 else np.ones(len(val), np.int64)
    order = np.lexsort((val, dim, qi))
    key = qi[order].astype(np.int64) * d + dim[order]
    val, cnt = val[order], cnt[order]
    for i, q in enumerate(QUANTILES):
        _, _, g = order_indices(fs.count, q)
        for j in range(d):
            a, b = np.searchsorted(key, [i * d + j, i * d + j + 1])
            ranks = np.cumsum(cnt[a:b])  # values up to and including each candidate
            picks = []
            for k in (int(k0s[i]), int(k1s[i])):
                r = k - int(below[i, j])
                if r < 0:
                    raise AssertionError("exact quantile bracket missed (bad summary)")
                at = int(np.searchsorted(ranks, r, side="right"))
                picks.append(float(val[a + at]) if at < b - a else float(hi[i, j]))
            fs.quantiles[i, j] = lerp_quantile(
                np.float64(picks[0]), np.float64(picks[1]), np.float64(g)
            )
    fs.quantile_error = 0.0


def _exact_from_runs(runs: list[_Run], fs: FeatureStats) -> None:
    """Exact quantiles by selection over the spilled sorted runs: per run and bracket, two
    searches (one window read each) and the values inside the bracket."""
    br = _brackets(fs)
    lo, hi = br[0], br[1]
    below = np.zeros(lo.shape, np.int64)
    found = []
    reader = _RunReader()
    try:
        for run in runs:
            j = run.dim
            kind = np.dtype(run.dtype).kind
            keys_lo = lo[:, j].astype(run.dtype) if kind == "f" else lo[:, j]
            keys_hi = hi[:, j].astype(run.dtype) if kind == "f" else hi[:, j]
            if run.counts_offset >= 0:  # run-length encoded: distinct values and their counts
                values = reader.read(run, 0, run.length)
                counts = reader.read(run, 0, run.length, counts=True)
                a = np.searchsorted(values, keys_lo, side="right")
                b = np.searchsorted(values, keys_hi, side="left")
                below[:, j] += np.concatenate([[0], np.cumsum(counts)])[a]
                for i in np.flatnonzero(b > a):
                    v = np.repeat(values[a[i] : b[i]].astype(np.float64), counts[a[i] : b[i]])
                    found.append((np.full(len(v), i, np.int8), np.full(len(v), j, np.int32), v))
                continue
            a = reader.count(run, keys_lo, "right")
            b = reader.count(run, keys_hi, "left")
            below[:, j] += a
            for i in np.flatnonzero(b > a):
                v = reader.read(run, int(a[i]), int(b[i])).astype(np.float64)
                found.append((np.full(len(v), i, np.int8), np.full(len(v), j, np.int32), v))
    finally:
        reader.close()
    inside = tuple(
        np.concatenate([f[k] for f in found]) if found else np.zeros(0, t)
        for k, t in enumerate((np.int8, np.int32, np.float64))
    )
    _select(fs, br, below, inside)


def _exact_quantiles(
    root: str,
    rels: list[str],
    feats: dict[str, int],
    dataset: dict[str, FeatureStats],
    executor: str,
    jobs: int | None,
    batch_rows: int,
) -> None:
    """Second pass over the data files (no spilled runs, e.g. on ray): exact quantiles.

    The candidates inside the summary's brackets travel to this process; their number grows
    with the frames (a summary's rank error does), so while it is over
    :data:`REFINE_CANDIDATES` the brackets are first narrowed by counting rounds (each task
    returns a histogram of its values inside each bracket, :data:`REFINE_BINS` bins: a few KiB)
    until it fits or stops shrinking (ties), and the candidates travel run-length encoded.
    Still exact: only where the wanted order statistics lie is narrowed down."""
    brackets = {n: _brackets(dataset[n]) for n in feats}
    for _ in range(REFINE_ROUNDS):
        bound = sum(b[4] for b in brackets.values())
        if bound <= REFINE_CANDIDATES:
            break
        brackets = _narrow(root, rels, feats, dataset, brackets, executor, jobs, batch_rows)
        if sum(b[4] for b in brackets.values()) > bound / 2:
            break  # what is left are ties: they travel run-length encoded
    todo = [
        {
            "root": root,
            "rel": rel,
            "features": feats,
            "batch_rows": batch_rows,
            "lo": {n: b[0] for n, b in brackets.items()},
            "hi": {n: b[1] for n, b in brackets.items()},
        }
        for rel in rels
    ]
    results = map_files(refine_file, todo, executor=executor, workers=jobs)
    for n in feats:
        below = sum(r["below"][n] for r in results)
        inside = tuple(np.concatenate([r["inside"][n][k] for r in results]) for k in range(4))
        _select(dataset[n], brackets[n], below, inside)


REFINE_CANDIDATES = 2_000_000  # candidate values gathered at most (~26 MB), else narrow first
REFINE_BINS = 256  # histogram bins of a narrowing round
REFINE_ROUNDS = 4  # narrowing rounds at most (each one pass over the feature columns)


def _narrow(root, rels, feats, dataset, brackets, executor, jobs, batch_rows):
    """One counting round: per feature, quantile and dimension, a histogram of the values
    inside ``(lo, hi]`` over :data:`REFINE_BINS` equal bins; the new bracket is the bins that
    hold the order statistics ``k0`` and ``k1``. Returns the new brackets (same shape as
    :func:`_brackets`' with the bound now an exact count)."""
    edges = {}
    for n, (lo, hi, _k0, _k1, _) in brackets.items():
        base = np.where(np.isfinite(lo), lo, np.nextafter(dataset[n].min[None, :], -np.inf))
        edges[n] = base[..., None] + (hi - base)[..., None] * np.linspace(0, 1, REFINE_BINS + 1)
        edges[n][..., 0], edges[n][..., -1] = lo, hi  # exactly the old bracket's ends
    todo = [
        {"root": root, "rel": rel, "features": feats, "batch_rows": batch_rows, "edges": edges}
        for rel in rels
    ]
    results = map_files(count_file, todo, executor=executor, workers=jobs)
    out = {}
    for n, (lo, hi, k0s, k1s, _) in brackets.items():
        e = edges[n]
        # cum[i, d, b] = values <= e[i, d, b]
        cum = sum(r["cum"][n] for r in results)
        new_lo, new_hi = lo.copy(), hi.copy()
        bound = 0.0
        for i in range(lo.shape[0]):
            for d in range(lo.shape[1]):
                c = cum[i, d]
                b0 = int(np.searchsorted(c, k0s[i], side="right")) - 1  # last edge <= k0 values
                b1 = int(np.searchsorted(c, k1s[i] + 1, side="left"))  # first edge >= k1+1
                b0, b1 = max(b0, 0), min(b1, len(c) - 1)
                new_lo[i, d], new_hi[i, d] = e[i, d, b0], e[i, d, b1]
                bound += float(c[b1] - c[b0])
        out[n] = (new_lo, new_hi, k0s, k1s, bound)
    return out


def count_file(job: dict) -> dict:
    """A narrowing round over one data file: per feature, quantile, dimension and edge of
    ``job["edges"]`` (5 x D x B+1), how many values are ``<=`` it, NaN counted as
    :func:`refine_file` counts it (a few KiB back)."""
    feats: dict[str, int] = job["features"]
    pf = _open_parquet(job["root"], job["rel"])
    cum = {n: np.zeros(job["edges"][n].shape, np.int64) for n in feats}
    for batch in _batches(pf, list(feats), job["batch_rows"]):
        for n, d in feats.items():
            x = np.sort(feature_values(batch.column(n), d, n).astype(np.float64), axis=0)
            nan = np.isnan(x).sum(axis=0)
            e = job["edges"][n]
            for j in range(d):
                cum[n][:, j, :] += np.searchsorted(x[:, j], e[:, j, :], side="right") + nan[j]
    return {"cum": cum}


def column_bytes(info: dict, feats: dict[str, int], frames: int) -> int:
    """Bytes of the feature columns over ``frames`` frames (what the exact selection holds)."""
    total = 0
    for n, d in feats.items():
        try:
            size = np.dtype(str(info["features"][n].get("dtype"))).itemsize
        except TypeError:
            size = 8
        total += frames * d * size
    return total


def block_rows(info: dict, feats: dict[str, int]) -> int:
    """Rows per decoded block: about :data:`BLOCK_BYTES` of feature values (plus episode_index)."""
    return max(1024, BLOCK_BYTES // (8 + column_bytes(info, feats, 1)))


def compute_stats(
    root: Dataset | str | os.PathLike,
    features: list[str] | None = None,
    quantiles: str = "exact",
    memory_mb: float = DEFAULT_MEMORY_MB,
    sketch_points: int = DEFAULT_SKETCH_POINTS,
    executor: str = "local",
    jobs: int | None = None,
    batch_rows: int | None = None,
    episodes: np.ndarray | None = None,
    spill_dir: str | None = None,
    images: bool = False,
) -> StatsResult:
    """Compute (do not write) the stats of ``root``; see the module docstring.

    ``quantiles="exact"``: while the feature columns fit ``memory_mb``, every block's sorted
    columns are kept (one spill file per data file in a temporary folder under ``spill_dir``,
    removed at the end; with ``executor="ray"`` a second pass over the data instead) and the
    dataset quantiles are selected exactly from them; beyond the budget, and with ``"sketch"``,
    they come from the merged rank summary (bound in ``rank_error``).
    ``batch_rows``: rows per decoded block (default :func:`block_rows`, about 64 MiB).
    ``episodes``: restrict to these episode indices; they must fill whole data files (used to
    show that merging halves gives the whole).
    ``images``: also the image/video features' stats (see :mod:`episodekit.metadata.image_stats`);
    without it they are not computed and :func:`write_stats` keeps the existing ones.
    """
    if quantiles not in QUANTILE_MODES:
        raise ValueError(f"quantiles must be one of {QUANTILE_MODES}, got {quantiles!r}")
    ds = as_dataset(root)
    if ds.version != V3:
        raise DatasetError(
            f"stats are written for v3.0 roots only (this one is {ds.version}); convert it first"
        )
    feats = numeric_features(ds.info, features)
    if not feats:
        raise DatasetError("no numeric one-dimensional features to compute stats for")
    if images:
        if episodes is not None:
            raise ValueError("images=True computes whole datasets (episodes= must be None)")
        require_decoders(ds.info)  # before the numeric pass: a missing decoder fails at once
    file_ids = ds.column("file_id")
    if episodes is not None:
        file_ids = file_ids[np.isin(ds.column("episode_index"), np.asarray(episodes))]
    ids = sorted(set(file_ids.tolist()))
    rels = [ds.data_files[i] for i in ids]
    exact = quantiles == "exact"
    need = column_bytes(ds.info, feats, ds.num_frames)
    batch_rows = batch_rows or block_rows(ds.info, feats)
    if exact and need > memory_mb * 2**20:
        log.warning(
            "%s: the columns (%.0f MiB) exceed --memory-mb %g: dataset quantiles come from the "
            "rank summary (bound recorded)",
            ds.root,
            need / 2**20,
            memory_mb,
        )
        exact = False
    with tempfile.TemporaryDirectory(prefix="episodekit-stats-", dir=spill_dir) as tmp:
        spill = tmp if exact and executor == "local" else None
        common = {
            "root": ds.root,
            "features": feats,
            "points": int(sketch_points),
            "batch_rows": int(batch_rows),
            "spill": spill,
        }
        todo = [{**common, "rel": r, "file_id": i} for r, i in zip(rels, ids)]
        if episodes is not None:
            ds = _subset(ds, np.asarray(episodes))
        fold = EpisodeFold(ds.column("episode_index"), feats, len(todo), spill_dir)
        for i, r in imap_files(scan_file, todo, executor, jobs):
            if episodes is not None:
                r = _keep_episodes(r, np.asarray(episodes))
            fold.add(i, r)
            del r  # folded: its memory (in Ray's object store) can go
        per = fold.finish()
        dataset = _dataset_stats(feats, per, fold)
        if exact and spill is not None:
            for n in feats:
                _exact_from_runs([p for r in fold.runs for p in r[n]], dataset[n])
        elif exact:
            _exact_quantiles(ds.root, rels, feats, dataset, executor, jobs, batch_rows)
        del fold
    mode = {n: "exact" if exact else "sketch" for n in feats}
    return StatsResult(
        features=feats,
        episode_index=per.episode_index,
        episode_count=per.count,
        episode=per,
        dataset=dataset,
        mode=mode,
        rank_error={n: dataset[n].quantile_error / max(dataset[n].count, 1) for n in feats},
        fingerprint=ds.fingerprint,
        state=data_state(ds),
        info=ds.info,
        images=compute_image_stats(ds, executor, jobs) if images else None,
    )


def _keep_episodes(r: dict, keep: np.ndarray) -> dict:
    """A scan result restricted to some episodes (summaries rebuilt from per-episode data is not
    possible, so the subset path only supports whole files; see compute_stats)."""
    sel = np.isin(r["episodes"], keep)
    if sel.all():
        return r
    raise DatasetError("episodes= must select whole data files (the bench splits by file)")


def _subset(ds: Dataset, keep: np.ndarray) -> Dataset:
    sel = np.isin(ds.column("episode_index"), keep)
    return Dataset(
        ds.root, ds.fs, ds.path, ds.info, ds.tasks, ds.episodes.filter(pa.array(sel)), ds.data_files
    )


def refine_quantiles(
    root: Dataset | str | os.PathLike,
    dataset: dict[str, FeatureStats],
    executor: str = "local",
    jobs: int | None = None,
    batch_rows: int | None = None,
) -> dict[str, FeatureStats]:
    """Exact quantiles for stats whose summaries cover exactly the frames of ``root`` (e.g. the
    :func:`merge_stats` of its halves): one pass over its data files, in place; returns ``dataset``.
    """
    ds = as_dataset(root)
    feats = {n: len(fs.sketches) for n, fs in dataset.items()}
    rows = batch_rows or block_rows(ds.info, feats)
    _exact_quantiles(ds.root, list(ds.data_files), feats, dataset, executor, jobs, rows)
    return dataset


# --------------------------------------------------------------------------------------------
# Writing: episodes columns, stats.json, the summary file


def _list_column(values: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """``(rows, D)`` -> ``list<dtype>`` with D values per row (LeRobot's per-episode layout)."""
    rows, dims = values.shape
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * dims)
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), type=dtype))


def episode_columns(res: StatsResult, episode_index: np.ndarray) -> dict[str, pa.Array]:
    """The ``stats/{feature}/{key}`` columns for the given episodes (in that order)."""
    pos = np.searchsorted(res.episode_index, episode_index)
    pos = np.minimum(pos, len(res.episode_index) - 1)
    if not np.array_equal(res.episode_index[pos], episode_index):
        raise DatasetError("episodes file lists episodes the stats were not computed for")
    cols: dict[str, pa.Array] = {}
    rows = res.episode.rows(pos)
    for n in res.features:
        f = rows[n]
        for key in STAT_KEYS:
            if key == "count":
                cols[f"stats/{n}/count"] = _list_column(
                    res.episode_count[pos][:, None].astype(np.int64), pa.int64()
                )
            else:
                cols[f"stats/{n}/{key}"] = _list_column(f[key], pa.float64())
    if res.images is not None:
        img_pos = np.searchsorted(res.images.episode_index, episode_index)
        cols.update(res.images.episode_columns(img_pos))
    return cols


EPISODES_PER_ROW_GROUP = 2048  # rows of an episodes file built and written at a time


def _rewrite_episodes_file(path: str, res: StatsResult, replaced: set[str]) -> None:
    """One episodes file with its stats columns from ``res``, atomically, verified (rows and
    columns) before it replaces the original. The columns being replaced are not read (they
    are most of the file); the others keep their place, new ones go last. Written
    :data:`EPISODES_PER_ROW_GROUP` rows at a time: memory holds a slice's stats, not a file's."""
    names = pq.read_schema(path).names
    table = pq.read_table(path, columns=[c for c in names if c not in replaced])
    ep = table.column("episode_index").to_numpy().astype(np.int64)
    with atomic_path(path) as tmp:
        writer = None
        try:
            for start in range(0, max(table.num_rows, 1), EPISODES_PER_ROW_GROUP):
                part = table.slice(start, EPISODES_PER_ROW_GROUP)
                out = _with_stats(part, names, episode_columns(res, ep[start : start + len(part)]))
                if writer is None:
                    writer = pq.ParquetWriter(tmp, out.schema)
                writer.write_table(out)
        finally:
            if writer is not None:
                writer.close()
        back = pq.ParquetFile(tmp)
        if back.metadata.num_rows != table.num_rows or back.schema_arrow.names != out.column_names:
            raise DatasetError("rewritten episodes file does not read back the same", path)


def _with_stats(table: pa.Table, names: list[str], cols: dict[str, pa.Array]) -> pa.Table:
    """``table`` (the kept columns) with the stats columns ``cols`` in the file's column order
    ``names`` (new ones last); the schema's metadata kept."""
    fields, arrays = [], []
    for name in names:
        if name in cols:
            fields.append(pa.field(name, cols[name].type))
            arrays.append(cols[name])
        elif name in table.column_names:
            fields.append(table.schema.field(name))
            arrays.append(table.column(name))
    fields += [pa.field(n, a.type) for n, a in cols.items() if n not in names]
    arrays += [a for n, a in cols.items() if n not in names]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=table.schema.metadata))


def _file_state(path: str) -> str:
    """Content digest of a small output file (episodes table): a copy stays recognisable."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _summary_table(res: StatsResult) -> pa.Table:
    rows: dict[str, list] = {
        "feature": [],
        "dim": [],
        "values": [],
        "weights": [],
        "rank_error": [],
    }
    for n in res.features:
        for d, s in enumerate(res.dataset[n].sketches):
            c = s.compact(STORED_SKETCH_POINTS)
            rows["feature"].append(n)
            rows["dim"].append(d)
            rows["values"].append(c.values.tolist())
            rows["weights"].append(c.weights.astype(np.float64).tolist())
            rows["rank_error"].append(float(c.rank_error))
    return pa.table(
        {
            "feature": pa.array(rows["feature"], pa.string()),
            "dim": pa.array(rows["dim"], pa.int32()),
            "values": pa.array(rows["values"], pa.list_(pa.float64())),
            "weights": pa.array(rows["weights"], pa.list_(pa.float64())),
            "rank_error": pa.array(rows["rank_error"], pa.float64()),
        }
    )


def _images_meta(res: StatsResult, ds: Dataset) -> dict | None:
    """The image/video stats record: new ones, else the previous record (those stats are kept)."""
    if res.images is not None:
        return res.images.meta()
    return (read_summary_meta(ds) or {}).get("images")


def write_stats(res: StatsResult, root: Dataset | str | os.PathLike) -> bool:
    """Write the per-episode columns, ``meta/stats.json`` and the summary file; return whether
    they were written. Only the global main process writes; a remote or read-only root keeps the
    result in memory (one warning). Other I/O errors propagate."""
    if not rank_info().is_main:
        return False
    ds = as_dataset(root)
    if not ds.is_local:
        log_once(
            log,
            ("stats", "readonly", ds.root),
            f"{ds.root}: remote root, stats kept in memory only",
        )
        return False
    base = Path(ds.path)
    try:
        outputs: dict[str, Any] = {"episodes": {}}
        numeric = {f"stats/{n}/{k}" for n in res.features for k in STAT_KEYS}
        for f in sorted(base.glob("meta/episodes/*/*.parquet")):
            _rewrite_episodes_file(str(f), res, numeric)
            outputs["episodes"][str(f.relative_to(base))] = _file_state(str(f))
            release_memory()  # one episodes file's columns at a time, not the high-water mark
        stats_path = base / STATS_FILE
        old: dict = {}
        if stats_path.exists():
            try:
                old = json.loads(stats_path.read_text())
            except ValueError:
                old = {}
        stats = {k: v for k, v in (old if isinstance(old, dict) else {}).items()}
        stats.update(res.lerobot_stats())
        text = json.dumps(stats, indent=4)
        atomic_write_bytes(stats_path, text.encode())
        outputs["stats_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        meta = {
            "version": STATS_VERSION,
            "fingerprint": res.fingerprint,
            "data_state": res.state,
            "features": res.features,
            "quantiles": res.mode,
            "rank_error": res.rank_error,
            "rank_error_meaning": (
                "each dataset quantile lies between the exact order statistics at ranks "
                "(N-1)q -/+ rank_error*N (0: exact, np.quantile's linear rule)"
            ),
            "sketch_points": STORED_SKETCH_POINTS,
            "outputs": outputs,
            "images": _images_meta(res, ds),
        }
        table = _summary_table(res).replace_schema_metadata({SUMMARY_KEY: json.dumps(meta)})
        with atomic_path(base / SUMMARY_FILE) as tmp:
            pq.write_table(table, tmp)
    except (OSError, EnvironmentProblem) as exc:  # atomic writes raise EnvironmentProblem
        if getattr(exc, "errno", None) not in READ_ONLY_ERRNOS:
            raise
        reason = getattr(exc, "strerror", None) or "read-only"
        log_once(
            log,
            ("stats", "readonly", ds.root),
            f"{ds.root}: read-only root ({reason}), stats not written",
        )
        return False
    return True


# --------------------------------------------------------------------------------------------
# Reading back and freshness


def read_summary_meta(root: Dataset | str | os.PathLike) -> dict | None:
    """The summary file's metadata (None when absent or unreadable)."""
    fs, path = (root.fs, root.path) if isinstance(root, Dataset) else resolve_root(str(root))
    full = posixpath.join(path, SUMMARY_FILE)
    try:
        if is_local(fs):
            schema = pq.read_schema(full)
        else:
            with fs.open(full, "rb") as fh:
                schema = pq.read_schema(fh)
        return json.loads((schema.metadata or {}).get(SUMMARY_KEY, b"null"))
    except (FileNotFoundError, pa.ArrowInvalid, OSError, ValueError):
        return None


def read_sketches(root: Dataset | str | os.PathLike) -> dict[str, list[Sketch]]:
    """The stored rank summaries per feature (what :func:`merge_stats` merges for a mixture)."""
    fs, path = (root.fs, root.path) if isinstance(root, Dataset) else resolve_root(str(root))
    full = posixpath.join(path, SUMMARY_FILE)
    try:
        t = pq.read_table(full) if is_local(fs) else pq.read_table(full, filesystem=fs)
    except (FileNotFoundError, pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(f"no readable stats summary ({exc})", full) from exc
    out: dict[str, list[Sketch]] = {}
    for r in t.to_pylist():
        out.setdefault(r["feature"], []).append(
            Sketch(np.array(r["values"]), np.array(r["weights"]), r["rank_error"])
        )
    return out


def stale_reason(ds: Dataset, meta: dict | None, features: dict[str, int] | None = None) -> str:
    """Why the written stats are not fresh for ``ds`` ("" when fresh)."""
    if meta is None:
        return f"no {SUMMARY_FILE}"
    if meta.get("version") != STATS_VERSION:
        return f"summary version {meta.get('version')!r}"
    if meta.get("fingerprint") != ds.fingerprint:
        return "episodes changed since the stats were computed (fingerprint)"
    if meta.get("data_state") != data_state(ds):
        return "data files changed since the stats were computed (size or parquet footer)"
    if features and not set(features) <= set(meta.get("features") or {}):
        return "features missing from the stats"
    return ""


def _outputs_intact(ds: Dataset, meta: dict) -> bool:
    out = meta.get("outputs") or {}
    base = Path(ds.path)
    try:
        text = (base / STATS_FILE).read_bytes()
    except FileNotFoundError:
        return False
    if hashlib.sha256(text).hexdigest() != out.get("stats_sha256"):
        return False
    now = {str(f.relative_to(base)) for f in base.glob("meta/episodes/*/*.parquet")}
    if now != set(out.get("episodes") or {}):
        return False
    return all(_file_state(str(base / rel)) == st for rel, st in out["episodes"].items())


def ensure_stats(
    root: Dataset | str | os.PathLike,
    force: bool = False,
    features: list[str] | None = None,
    quantiles: str = "exact",
    memory_mb: float = DEFAULT_MEMORY_MB,
    executor: str = "local",
    jobs: int | None = None,
    images: bool = False,
) -> tuple[StatsResult | None, str]:
    """Batch path (CLI, prepare): ``(result, status)``, status "fresh" (result None: nothing was
    computed), "written" or "not written" (other rank, read-only or remote root). ``images``:
    image/video stats too (fresh only when recorded for the same episodes fingerprint)."""
    ds = as_dataset(root)
    if ds.version != V3:
        raise DatasetError(
            f"stats are written for v3.0 roots only (this one is {ds.version}); convert it first"
        )
    feats = numeric_features(ds.info, features)
    if not force and ds.is_local:
        meta = read_summary_meta(ds)
        if (
            not stale_reason(ds, meta, feats)
            and _outputs_intact(ds, meta)
            and all((meta.get("quantiles") or {}).get(n) == quantiles for n in feats)
            and (not images or _images_fresh(ds, meta))
        ):
            return None, "fresh"
    res = compute_stats(
        ds, features, quantiles, memory_mb, executor=executor, jobs=jobs, images=images
    )
    return res, "written" if write_stats(res, ds) else "not written"


def _images_fresh(ds: Dataset, meta: dict) -> bool:
    rec = meta.get("images") or {}
    want = set(image_features(ds.info))
    return rec.get("fingerprint") == ds.fingerprint and want <= set(rec.get("features") or {})


def stats_report(root: Dataset | str | os.PathLike, **kwargs) -> dict:
    """Ensure fresh stats and describe them: status, per feature dims, mode and rank error."""
    ds = as_dataset(root)
    res, status = ensure_stats(ds, **kwargs)
    meta = read_summary_meta(ds) if res is None else None
    if res is not None:
        feats = {
            n: {"dims": d, "quantiles": res.mode[n], "rank_error": res.rank_error[n]}
            for n, d in res.features.items()
        }
    else:
        feats = {
            n: {"dims": d, "quantiles": meta["quantiles"][n], "rank_error": meta["rank_error"][n]}
            for n, d in meta["features"].items()
        }
    rec = res.images.meta() if res is not None and res.images is not None else None
    if rec is None:
        rec = (meta if meta is not None else read_summary_meta(ds) or {}).get("images")
    return {
        "root": ds.root,
        "file": STATS_FILE,
        "status": status,
        "images": rec,
        "fingerprint": ds.fingerprint,
        "frames": ds.num_frames,
        "episodes": ds.num_episodes,
        "features": feats,
    }


def load_lerobot_stats(root: Dataset | str | os.PathLike) -> dict | None:
    """``meta/stats.json`` as LeRobot's ``load_stats`` sees it: ``{feature: {key: ndarray}}``."""
    fs, path = (root.fs, root.path) if isinstance(root, Dataset) else resolve_root(str(root))
    full = posixpath.join(path, STATS_FILE)
    if not fs.exists(full):
        return None
    with fs.open(full, "rb") as fh:
        raw = json.loads(fh.read())
    return {
        n: {k: np.atleast_1d(np.array(v)) for k, v in d.items()}
        for n, d in raw.items()
        if isinstance(d, dict)
    }


__all__ = [
    "STATS_FILE",
    "SUMMARY_FILE",
    "FeatureStats",
    "Sketch",
    "StatsResult",
    "compute_stats",
    "ensure_stats",
    "merge_stats",
    "refine_quantiles",
    "stats_report",
    "write_stats",
]
