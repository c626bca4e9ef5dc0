"""Data-quality checks (``quality.*``): what silently ruins training although the files are sound.

Actions and states (every float feature named ``action*`` or ``observation.state*``), timing,
episode lengths, duplicates and dataset-level task / distribution problems. Every check is a
warning with a documented threshold (:data:`DEFAULTS`, overridable from a JSON/TOML file).

How it reads: one pass over the data files, one file at a time (a thread per core), reading only
``episode_index``, ``index``, ``timestamp`` and the checked features with pyarrow into numpy.
Everything per frame is a column operation (``ufunc.reduceat`` over episode boundaries); Python
loops only over episodes or flagged candidates. The pass yields per-episode summaries plus a
strided sample of values and steps; the dataset-level thresholds (robust scales) are computed from
those, then every decision is vectorized over (episode, dimension). Only flagged episodes are read
again, to confirm near-duplicates exactly and to attach the offending signal to findings.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from episodekit.core import interrupt
from episodekit.core.executor import imap_files, imap_threads
from episodekit.core.memory import release_memory
from episodekit.core.words import noun_for, plural
from episodekit.validate import drift
from episodekit.validate.raw import WARNING, Finding, RawRoot

MAX_PER_CHECK = 50  # findings of one check beyond this are summarized in one line
SAMPLE_ROWS = 200_000  # rows of the strided sample the dataset-level robust scales come from
SIGNAL_POINTS = 48  # points of the offending signal attached to a finding (sparkline / plot)
FEATURE_PREFIXES = ("action", "observation.state")

# Every threshold, with what it means. Units in the name; "share" is a fraction in [0, 1].
DEFAULTS: dict[str, float] = {
    # quality.frozen: one identical vector over >= this share of an episode ...
    "frozen_share": 0.5,
    # ... and at least this many frames (short episodes can be legitimately still).
    "frozen_min_frames": 10,
    # quality.frozen_run: an identical vector held mid-episode (not touching its first or last
    # frame, where a robot at rest is normal) for >= this many seconds.
    "frozen_run_seconds": 3.0,
    # quality.jump: a step |x[t+1] - x[t]| above this many robust step deviations of the
    # dimension (1.4826 x median |nonzero step| over the dataset, i.e. MAD) ...
    "jump_sigmas": 20.0,
    # ... and above this share of the dimension's robust range (q99 - q1 over the dataset),
    # so heavy-tailed but real motions (a fast gripper) do not fire.
    "jump_range_share": 0.3,
    # quality.out_of_range: a value beyond [q1 - k s, q99 + k s] of the dataset, where
    # s = (q99 - q1) / 4.653 is the robust standard deviation (dimensions with q1 == q99 are
    # not judged).
    "range_sigmas": 5.0,
    # quality.clipping: frames sitting exactly at the episode's min (or max) of a dimension,
    # outside the constant runs at its start and end, >= this share of the episode ...
    "clip_share": 0.1,
    # ... and at least this many frames.
    "clip_min_frames": 5,
    # quality.action_range: an action beyond the state's dataset [min, max] of the same joint by
    # more than this share of the state's range.
    "action_state_margin": 0.5,
    # quality.dropped_frames: a timestamp step > this / fps.
    "drop_factor": 1.5,
    # quality.frame_interval: |mean timestamp step x fps - 1| above this (episodes without drops).
    "interval_tolerance": 0.05,
    # quality.short_episode: fewer frames than this (0 = off; --min-length).
    "min_length": 0,
    # quality.length_outlier: |log(length) - task median| above this many robust deviations
    # (1.4826 x MAD of log lengths, at least length_log_floor) ...
    "length_sigmas": 5.0,
    "length_log_floor": 0.25,
    # ... in tasks with at least this many episodes.
    "length_min_episodes": 10,
    # quality.duplicate: another episode of the same length within this share of each
    # dimension's robust range at every frame (0 = identical).
    "duplicate_tolerance": 1e-3,
    # quality.task_rare: a task with fewer episodes than this while the median task has at
    # least task_rare_factor times as many.
    "min_task_episodes": 2,
    "task_rare_factor": 10,
    # quality.shift: first vs last quarter of the episodes (by episode_index), episodes as
    # samples, medians and MADs: the median episode mean moves with z > shift_sigmas and by
    # > shift_effect standard deviations, or the median within-episode standard deviation
    # changes by > shift_std_ratio with z > shift_sigmas (on log std); >= shift_min_episodes.
    "shift_sigmas": 6.0,
    "shift_effect": 0.5,
    "shift_std_ratio": 2.0,
    "shift_min_episodes": 40,
    **drift.DEFAULTS,  # quality.drift (validate/drift.py)
}

CHECKS: dict[str, str] = {
    "quality.frozen": "identical action/state vector over >= frozen_share of an episode (warning)",
    "quality.frozen_run": "identical vector held mid-episode >= frozen_run_seconds (warning)",
    "quality.jump": "a step beyond jump_sigmas robust step deviations and jump_range_share of the "
    "range (warning)",
    "quality.out_of_range": "a value beyond range_sigmas robust deviations of the dataset "
    "(warning)",
    "quality.clipping": "a dimension stuck at its episode min/max (saturation) (warning)",
    "quality.dead_dimension": "a dimension constant over the whole dataset (warning)",
    "quality.action_range": "action far outside the state's range of the same joint (warning)",
    "quality.dropped_frames": "timestamp steps > drop_factor / fps: frames missing (warning)",
    "quality.frame_interval": "mean timestamp step differs from 1 / fps (warning)",
    "quality.empty_episode": "an episode with no frames (warning)",
    "quality.single_frame": "an episode of one frame (warning)",
    "quality.short_episode": "an episode shorter than --min-length (warning)",
    "quality.length_outlier": "episode length far from its task's typical length (warning)",
    "quality.duplicate": "an episode (near-)identical to an earlier one (warning)",
    "quality.task_placeholder": "empty or placeholder task string (warning)",
    "quality.task_rare": "a task with too few episodes (warning)",
    "quality.shift": "distribution shift between the first and last quarter of episodes (warning)",
    **drift.CHECKS,
}

PLACEHOLDER_TASKS = {
    "",
    "task",
    "tasks",
    "default",
    "default task",
    "none",
    "null",
    "nan",
    "n/a",
    "na",
    "todo",
    "tbd",
    "placeholder",
    "test",
    "example",
    "unknown",
    "dummy",
    "xxx",
    "...",
    "-",
}
PLACEHOLDER_PATTERN = re.compile(r"^(task|episode|demo)[ _-]?\d+$|^<.*>$|^\{.*\}$")

# A normal distribution's standard deviation over its median absolute deviation (MAD): the
# robust scales below are MAD_TO_SIGMA x MAD.
MAD_TO_SIGMA = 1.4826


class ThresholdsError(ValueError):
    """A thresholds file is unreadable or names an unknown threshold."""


def load_thresholds(path: str | Path | None = None, **overrides: Any) -> dict[str, float]:
    """:data:`DEFAULTS` updated from a JSON or TOML file (``.toml`` by suffix; a top-level
    ``[quality]`` table is accepted too) and from ``overrides`` (None values are ignored)."""
    out = dict(DEFAULTS)
    given: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
            if p.suffix.lower() == ".toml":
                import tomllib

                given = tomllib.loads(text)
            else:
                given = json.loads(text)
        except (OSError, ValueError) as exc:
            raise ThresholdsError(f"cannot read thresholds file {p}: {exc}") from exc
        if isinstance(given, dict) and isinstance(given.get("quality"), dict):
            given = given["quality"]
        if not isinstance(given, dict):
            raise ThresholdsError(f"thresholds file {p} must hold an object of name: number")
    given = {**given, **{k: v for k, v in overrides.items() if v is not None}}
    for k, v in given.items():
        if k not in DEFAULTS:
            raise ThresholdsError(
                f"unknown quality threshold {k!r}; known: {', '.join(sorted(DEFAULTS))}"
            )
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ThresholdsError(f"quality threshold {k!r} must be a number >= 0, got {v!r}")
        out[k] = float(v)
    return out


# ---------------------------------------------------------------------------------------------
# Features and reading.


def quality_features(raw: RawRoot) -> dict[str, int]:
    """Checked features -> dimension: float ``action*`` / ``observation.state*``, 1-D shape."""
    out = {}
    for name, f in raw.features.items():
        if not isinstance(f, dict) or not name.startswith(FEATURE_PREFIXES):
            continue
        shape = f.get("shape")
        if str(f.get("dtype", "")).startswith("float") and isinstance(shape, list):
            if len(shape) == 1 and isinstance(shape[0], int) and shape[0] >= 1:
                out[name] = shape[0]
    return out


def _matrix(col: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray | None:
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


def _fill_nonfinite(x: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """Forward-fill NaN/inf per column (reported by ``data.nan``; here they must not look like
    jumps), leading ones become 0; ``prev``: the last finite values before ``x`` (a batch of a
    file continues from the one before it)."""
    if prev is not None:
        return _fill_nonfinite(np.concatenate([prev[None, :].astype(x.dtype), x]))[1:]
    ok = np.isfinite(x)
    if ok.all():
        return x
    idx = np.where(ok, np.arange(len(x))[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    x = np.take_along_axis(x, idx, axis=0)
    return np.where(np.isfinite(x), x, 0.0).astype(np.float32)


def _ordered(table: pa.Table) -> tuple[np.ndarray, np.ndarray | None]:
    """Episode index per row and the permutation putting rows in (episode, index) order (None
    when they already are, the normal case)."""
    ep = table["episode_index"].to_numpy(zero_copy_only=False)
    if len(ep) < 2:
        return ep, None
    if "index" in table.column_names:
        idx = table["index"].to_numpy(zero_copy_only=False)
        if np.all(ep[1:] >= ep[:-1]) and np.all((ep[1:] != ep[:-1]) | (idx[1:] > idx[:-1])):
            return ep, None
        order = np.lexsort((idx, ep))
    else:
        if np.all(ep[1:] >= ep[:-1]):
            return ep, None
        order = np.argsort(ep, kind="stable")
    return ep[order], order


# ---------------------------------------------------------------------------------------------
# The per-file pass.


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


def _segments(ep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Episode ids, start offsets and lengths of the contiguous runs of ``ep``."""
    starts = np.flatnonzero(np.concatenate([[True], ep[1:] != ep[:-1]]))
    lengths = np.diff(np.append(starts, len(ep)))
    return ep[starts], starts, lengths


def _feature_stats(
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
        xt = np.ascontiguousarray(_fill_nonfinite(x, prev).T)
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
        clip[e, j] = _clipped_frames(xt[j, starts[e] : ends[e] + 1], mins[j, e], maxs[j, e])
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


def _clipped_frames(v: np.ndarray, lo: float, hi: float) -> int:
    """Frames of one episode's dimension at its min or max, outside the constant runs at the
    start and the end (a robot at rest there is not saturation); the larger side."""
    change = np.flatnonzero(v[1:] != v[:-1])
    first, last = change[0] + 1, change[-1]  # v[first:last + 1] excludes the edge runs
    inner = v[first : last + 1]
    return int(max((inner == lo).sum(), (inner == hi).sum()))


def scan_file(raw: RawRoot, rel: str, features: dict[str, int], stride: int, th: dict) -> FileStats:
    """Per-episode quality summaries of one data file (errors become ``FileStats.error``)."""
    return scan_path(raw.fs, raw.join(rel), rel, raw.fps, features, stride, th)


def scan_path(
    fs: Any,
    path: str,
    rel: str,
    fps: float | None,
    features: dict[str, int],
    stride: int,
    th: dict,
) -> FileStats:
    """:func:`scan_file` of the file at ``path`` on ``fs`` (what a worker or a Ray task needs).

    Streams record batches and summarizes whole episodes as soon as they end: memory is one
    batch plus the episode still open, whatever the file's size. A file whose rows are not in
    (episode, index) order is read whole and sorted (the same summaries, at file-sized memory).
    """
    empty = np.zeros(0, np.int64)
    try:
        parts = _stream_parts(fs, path, rel, fps, features, stride, th)
    except _Unordered:
        try:
            table = _read_path(fs, path, features)
        except Exception as exc:  # noqa: BLE001 - an unreadable file is reported, never raised
            interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
            return FileStats(rel, empty, empty, error=str(exc))
        return _scan_table(table, rel, fps, features, stride, th)
    except _NoEpisodes:
        return FileStats(rel, empty, empty, error="no episodes")
    except _ReadError as exc:
        return FileStats(rel, empty, empty, error=str(exc.__cause__ or exc))
    return _concat_parts(rel, parts, features)


class _Unordered(Exception):
    """The file's rows are not in (episode, index) order (or carry NaN episode indices)."""


class _NoEpisodes(Exception):
    """The file has no ``episode_index`` column."""


class _ReadError(Exception):
    """Reading the file failed (the cause is the reader's exception)."""


BATCH_ROWS = 16_384  # rows per streamed record batch (the reader holds ~4x a batch while decoding)
STREAM_BUFFER = 1 << 20  # bytes read at a time from a column chunk


def _read_path(fs: Any, path: str, features: dict[str, int]) -> pa.Table:
    with fs.open(path, "rb") as fh:
        pf = pq.ParquetFile(fh)
        names = set(pf.schema_arrow.names)
        cols = [c for c in ("episode_index", "index", "timestamp", *features) if c in names]
        return pf.read(columns=cols)


@contextlib.contextmanager
def _open(fs: Any, path: str) -> Iterator[pq.ParquetFile]:
    """A streaming parquet reader: pages are read as decoded (no pre-buffered row group), and a
    local file through arrow's own reader (a Python file object copies every read)."""
    opts = {"pre_buffer": False, "buffer_size": STREAM_BUFFER}
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        with pq.ParquetFile(path, **opts) as pf:
            yield pf
        return
    with fs.open(path, "rb") as fh, pq.ParquetFile(fh, **opts) as pf:
        yield pf


def _batches(fs: Any, path: str, features: dict[str, int]):
    """The file's record batches as tables (reader failures raise :class:`_ReadError`)."""
    try:
        with _open(fs, path) as pf:
            names = set(pf.schema_arrow.names)
            if "episode_index" not in names:
                raise _NoEpisodes
            cols = [c for c in ("episode_index", "index", "timestamp", *features) if c in names]
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=cols, use_threads=False):
                interrupt.check()  # (in a scan thread: Ctrl-C ends the scan within a batch)
                yield pa.Table.from_batches([batch])
    except (_NoEpisodes, _Unordered, GeneratorExit):
        raise
    except Exception as exc:  # noqa: BLE001 - an unreadable file is reported, never raised
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        raise _ReadError(str(exc)) from exc


def _in_order(table: pa.Table) -> bool:
    """True when the rows are in (episode, index) order (what :func:`_ordered` leaves alone)."""
    ep = table["episode_index"].to_numpy(zero_copy_only=False)
    if ep.dtype.kind == "f" and np.isnan(ep).any():
        return False
    if len(ep) < 2:
        return True
    if "index" in table.column_names:
        idx = table["index"].to_numpy(zero_copy_only=False)
        return bool(
            np.all(ep[1:] >= ep[:-1]) and np.all((ep[1:] != ep[:-1]) | (idx[1:] > idx[:-1]))
        )
    return bool(np.all(ep[1:] >= ep[:-1]))


class _Column:
    """One merged array, grown by appending copies along its first axis (the capacity doubles
    when short), so that what was appended (with Ray, a view of an object-store buffer) can be
    dropped at once. Appending a wider dtype widens the column, as ``np.concatenate`` would."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.buf: np.ndarray | None = None
        self.n = 0

    def append(self, a: np.ndarray) -> None:
        if self.buf is None:
            self.buf = np.empty((max(self.capacity, len(a)), *a.shape[1:]), a.dtype)
        dtype = np.result_type(self.buf, a)
        if dtype != self.buf.dtype or self.n + len(a) > len(self.buf):
            size = len(self.buf) if self.n + len(a) <= len(self.buf) else 2 * (self.n + len(a))
            grown = np.empty((size, *self.buf.shape[1:]), dtype)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : self.n + len(a)] = a
        self.n += len(a)

    def take(self, order: np.ndarray | None) -> np.ndarray:
        """The appended rows (in ``order``, when given), releasing the buffer."""
        buf, self.buf = self.buf, None
        assert buf is not None
        return buf[: self.n] if order is None else buf[order]


TS_FILL = {"ts_drops": 0, "ts_missing": 0, "ts_maxstep": np.nan, "ts_interval": np.nan}


def _stream_parts(
    fs: Any, path: str, rel: str, fps: float | None, features: dict[str, int], stride: int, th
) -> list[FileStats]:
    """Summaries of the file's complete episodes, batch by batch. The episode still open at the
    end of a batch is carried into the next; the stride sample keeps its file positions and a
    NaN is filled from the last finite value before it, as over the whole file."""
    parts: list[FileStats] = []
    pending: pa.Table | None = None
    carry: dict[str, np.ndarray] = {}  # per feature: the last finite value of each dimension
    offset = 0  # file position of the first row of ``pending`` (or of the next batch)
    for batch in _batches(fs, path, features):
        table = batch if pending is None else pa.concat_tables([pending, batch])
        if not _in_order(table):
            raise _Unordered
        ep = table["episode_index"].to_numpy(zero_copy_only=False)
        if len(ep) == 0:
            continue
        cut = int(np.flatnonzero(np.concatenate([[True], ep[1:] != ep[:-1]]))[-1])
        pending = table.slice(cut)
        if cut:
            done = table.slice(0, cut)
            parts.append(_scan_ordered(done, rel, fps, features, stride, th, offset, carry))
            offset += cut
    if pending is not None and pending.num_rows:
        parts.append(_scan_ordered(pending, rel, fps, features, stride, th, offset, carry))
    return parts


def _concat_parts(rel: str, parts: list[FileStats], features: dict[str, int]) -> FileStats:
    """One file's summaries from those of its consecutive batches of whole episodes. Column by
    column, each dropped from the parts once concatenated: memory is the file's summaries plus
    one column, not twice the summaries."""
    empty = np.zeros(0, np.int64)
    parts = [p for p in parts if len(p.episodes)]
    if not parts:
        return FileStats(rel, empty, empty)

    def cat(objs: list, key: str) -> np.ndarray:
        arrs = [getattr(o, key) for o in objs]
        for o in objs:
            setattr(o, key, None)
        return np.concatenate(arrs)

    out = FileStats(rel, cat(parts, "episodes"), cat(parts, "rows"))
    for key in TS_FILL:
        if all(getattr(p, key) is not None for p in parts):
            setattr(out, key, cat(parts, key))
    for name in features:  # a feature ragged in any batch is ragged in the file: left out
        if all(name in p.features for p in parts):
            objs = [p.features.pop(name) for p in parts]
            fields = FeatureStats.__dataclass_fields__
            out.features[name] = FeatureStats(**{k: cat(objs, k) for k in fields})
    return out


def _scan_table(
    table: pa.Table, rel: str, fps: float | None, features: dict[str, int], stride: int, th
) -> FileStats:
    """Summaries of a whole file's table in any row order (sorted here; NaN episodes dropped)."""
    ep, order = _ordered(table)
    keep = ~np.isnan(ep.astype(np.float64)) if ep.dtype.kind == "f" else None
    if order is not None:
        table = table.take(pa.array(order))
    if keep is not None and not keep.all():
        table = table.filter(pa.array(keep))
    return _scan_ordered(table, rel, fps, features, stride, th, 0, {})


def _scan_ordered(
    table: pa.Table,
    rel: str,
    fps: float | None,
    features: dict[str, int],
    stride: int,
    th: dict,
    offset: int,
    carry: dict[str, np.ndarray],
) -> FileStats:
    """Summaries of rows in (episode, index) order holding whole episodes; ``offset``: the file
    position of the first row (for the stride sample); ``carry``: per feature, the last finite
    value of each dimension before these rows (updated here)."""
    ep = table["episode_index"].to_numpy(zero_copy_only=False).astype(np.int64)
    if len(ep) == 0:
        return FileStats(rel, np.zeros(0, np.int64), np.zeros(0, np.int64))
    ids, starts, lengths = _segments(ep)
    out = FileStats(rel, ids, lengths)
    if "timestamp" in table.column_names and fps:
        ts = table["timestamp"].to_numpy(zero_copy_only=False).astype(np.float64)
        dt = np.zeros(len(ts))
        dt[:-1] = np.diff(ts) * fps
        dt[starts + lengths - 1] = 0
        dt = np.nan_to_num(dt)
        drop = dt > th["drop_factor"]
        out.ts_drops = np.add.reduceat(drop, starts)
        out.ts_missing = np.add.reduceat(np.where(drop, np.round(dt) - 1, 0), starts)
        out.ts_maxstep = np.maximum.reduceat(dt, starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.ts_interval = np.add.reduceat(dt, starts) / (lengths - 1)
    first = (-offset) % stride  # the first row here that is on the file's stride grid
    for name, dim in features.items():
        if name not in table.column_names:
            continue
        x = _matrix(table[name], dim)
        if x is not None:
            prev = carry.get(name)
            out.features[name] = _feature_stats(x, starts, lengths, stride, th, first, prev)
            carry[name] = _last_finite(x, prev)
    return out


def _last_finite(x: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
    """Per dimension, the last finite value of ``x`` (``prev``'s where ``x`` has none)."""
    ok = np.isfinite(x)
    last = np.where(
        ok.any(axis=0), x[len(x) - 1 - np.argmax(ok[::-1], axis=0), np.arange(x.shape[1])], np.nan
    )
    if prev is not None:
        last = np.where(np.isnan(last), prev, last)
    return last.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Dataset-level decisions.


@dataclass
class Merged:
    """Per-episode summaries of the whole dataset (one row per scanned episode, in the order of
    the data files), and per feature the dataset-level robust scales of its strided sample (the
    sample itself is dropped once they are computed)."""

    episodes: np.ndarray
    rows: np.ndarray
    file: np.ndarray  # int32: position in ``files`` of the episode's data file
    files: list[str]
    ts_drops: np.ndarray
    ts_missing: np.ndarray
    ts_maxstep: np.ndarray
    ts_interval: np.ndarray
    features: dict[str, dict[str, np.ndarray]]
    scales: dict[str, dict[str, np.ndarray]]
    failed: list[tuple[str, str]]
    scanned: set[str]  # files read without error

    def file_of(self, i: int) -> str:
        return self.files[int(self.file[i])]


class _Merger:
    """Folds the per-file :class:`FileStats` into one :class:`Merged` as they arrive, in any
    order: every part is copied into the merged columns and can be dropped at once, so the
    driver holds one copy of the per-episode summaries (not every part plus their merge).
    Episode rows are put in file order at the end (what the checks' tie-breaks see); the
    strided sample keeps the arrival order (only its quantiles and medians are used)."""

    def __init__(self, rels: list[str], features: dict[str, int], episodes: int, samples: int):
        self.rels, self.features = rels, features
        self.episodes, self.samples = episodes, samples  # capacities (grown when short)
        self.cols: dict[str, _Column] = {}
        self.feats: dict[str, dict[str, _Column]] = {}
        self.missing: dict[str, int] = dict.fromkeys(features, 0)  # rows before its first part
        self.spans: list[tuple[int, int, int]] = []  # (file position, first row, rows)
        self.n = 0
        self.failed: list[tuple[int, str, str]] = []  # (file position, file, error)
        self.scanned: set[str] = set()

    def _col(self, cols: dict[str, _Column], key: str, capacity: int) -> _Column:
        if key not in cols:
            cols[key] = _Column(capacity)
        return cols[key]

    def add(self, pos: int, p: FileStats) -> None:
        if p.error is not None:
            self.failed.append((pos, p.file, p.error))
            return
        self.scanned.add(p.file)
        n = len(p.episodes)
        if not n:
            return
        self.spans.append((pos, self.n, n))
        self._col(self.cols, "episodes", self.episodes).append(p.episodes)
        self._col(self.cols, "rows", self.episodes).append(p.rows)
        self._col(self.cols, "file", self.episodes).append(np.full(n, pos, np.int32))
        for key, fill in TS_FILL.items():
            got = getattr(p, key)
            self._col(self.cols, key, self.episodes).append(
                got if got is not None else np.full(n, fill)
            )
        for name, d in self.features.items():
            self._add_feature(name, d, p.features.get(name), n)
        self.n += n

    def _add_feature(self, name: str, d: int, fs: FeatureStats | None, n: int) -> None:
        """One file's summaries of one feature; NaN rows where the file has none (ragged)."""
        if fs is None and name not in self.feats:
            self.missing[name] += n  # filled in if a later file has the feature
            return
        if name not in self.feats:
            self.feats[name] = {}
            if self.missing[name]:
                self._add_feature(name, d, None, self.missing[name])
        cols = self.feats[name]
        for key in FeatureStats.__dataclass_fields__:
            if key.startswith("sample"):
                if fs is not None:
                    self._col(cols, key, self.samples).append(getattr(fs, key))
                continue
            if fs is not None:
                arr = getattr(fs, key)
            else:
                arr = np.full((n,) if key.startswith("frozen") else (n, d), np.nan)
            self._col(cols, key, self.episodes).append(arr)

    def finish(self) -> Merged:
        """The merged summaries in file order; the samples become the robust scales."""
        order = None
        by_file = sorted(self.spans)
        if by_file != self.spans:
            order = np.concatenate([np.arange(s, s + n) for _, s, n in by_file])

        def take(col: _Column | None, empty: np.ndarray) -> np.ndarray:
            return empty if col is None else col.take(order)

        none = np.zeros(0)
        cols = {k: take(self.cols.pop(k, None), none) for k in ("episodes", "rows", *TS_FILL)}
        file = take(self.cols.pop("file", None), np.zeros(0, np.int32))
        features, scales = {}, {}
        for name, fcols in self.feats.items():
            sample = {k: fcols.pop(k).take(None) for k in ("sample_values", "sample_steps")}
            scales[name] = _robust_scales(sample)
            del sample
            features[name] = {k: c.take(order) for k, c in fcols.items()}
        self.feats = {}
        return Merged(
            episodes=cols.pop("episodes").astype(np.int64, copy=False),
            rows=cols.pop("rows").astype(np.int64, copy=False),
            file=file,
            files=self.rels,
            features=features,
            scales=scales,
            failed=[(f, e) for _, f, e in sorted(self.failed)],
            scanned=self.scanned,
            **cols,
        )


@dataclass
class Candidate:
    """A flagged (episode, feature, dimension) before it becomes a :class:`Finding`."""

    check: str
    message: str
    episode: int | None = None
    file: str | None = None
    feature: str | None = None
    dimension: int | None = None
    value: float | None = None
    score: float = 0.0  # how far past the threshold (worst first)
    locate: str | None = None  # how to find the frame: "step", "max", "min", "extreme"
    details: dict = field(default_factory=dict)


def _robust_scales(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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


def _dim_label(raw: RawRoot, feature: str, j: int) -> str:
    names = raw.features.get(feature, {}).get("names")
    if isinstance(names, dict):  # older LeRobot: {"motors": [...]}
        names = next(iter(names.values()), None)
    if isinstance(names, list) and j < len(names) and isinstance(names[j], str):
        return f"{feature}[{j}] ({names[j]})"
    return f"{feature}[{j}]"


def _signal_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    """Per-feature signal checks over the merged per-episode summaries, then action range."""
    out: list[Candidate] = []
    for name, c in m.features.items():
        s = m.scales[name]
        for check in (_frozen, _jumps, _out_of_range, _clipping, _dead_dimensions):
            out += check(raw, m, th, name, c, s)
    out += _action_range(raw, m, th)
    return out


def _frozen(raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict) -> list[Candidate]:
    """``quality.frozen`` (one vector for most of an episode) and ``quality.frozen_run``."""
    out: list[Candidate] = []
    fps = raw.fps or 0.0
    L = m.rows
    # Frozen vectors.
    longest, midrun = c["frozen_longest"], c["frozen_mid"]
    with np.errstate(invalid="ignore"):
        frozen = (longest >= th["frozen_share"] * L) & (longest >= th["frozen_min_frames"])
        frozen &= L >= 2
    for i in np.flatnonzero(frozen):
        out.append(
            Candidate(
                "quality.frozen",
                f"{name} holds one vector for {int(longest[i])} of {plural(int(L[i]), 'frame')} "
                f"({longest[i] / L[i]:.0%}; threshold {th['frozen_share']:.0%})",
                feature=name,
                value=float(longest[i] / L[i]),
                score=float(longest[i] / L[i] / max(th["frozen_share"], 1e-9)),
                **_ep(m, i),
            )
        )
    need = max(2, math.ceil(th["frozen_run_seconds"] * fps)) if fps else math.inf
    for i in np.flatnonzero((midrun >= need) & ~frozen):
        out.append(
            Candidate(
                "quality.frozen_run",
                f"{name} holds one vector for {plural(int(midrun[i]), 'frame')} "
                f"({midrun[i] / fps:.1f} s) mid-episode "
                f"(threshold {th['frozen_run_seconds']} s)",
                feature=name,
                value=float(midrun[i]),
                score=float(midrun[i] / need),
                **_ep(m, i),
            )
        )
    return out


def _jumps(raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict) -> list[Candidate]:
    """``quality.jump``: one step far beyond the dimension's robust step deviation."""
    out: list[Candidate] = []
    with np.errstate(invalid="ignore"):
        limit = np.fmax(th["jump_sigmas"] * s["step_sigma"], th["jump_range_share"] * s["span"])
        limit[~(limit > 0)] = np.nan  # no scale to judge by (a near-constant dimension)
        jump = c["maxstep"] > limit[None, :]
    for i, j in zip(*np.nonzero(jump)):
        v = float(c["maxstep"][i, j])
        out.append(
            Candidate(
                "quality.jump",
                f"{_dim_label(raw, name, j)} jumps by {v:.4g} in one step "
                f"({v / s['step_sigma'][j]:.0f} robust step deviations, "
                f"{v / s['span'][j]:.2f} of its range)"
                if s["span"][j] > 0 and s["step_sigma"][j] > 0
                else f"{_dim_label(raw, name, j)} jumps by {v:.4g} in one step",
                feature=name,
                dimension=int(j),
                value=v,
                score=v / float(limit[j]) if limit[j] > 0 else math.inf,
                locate="step",
                **_ep(m, i),
            )
        )
    return out


def _out_of_range(
    raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict
) -> list[Candidate]:
    """``quality.out_of_range``: values far outside the dataset's q1..q99."""
    out: list[Candidate] = []
    rs = np.where(s["span"] > 0, s["span"] / 4.653 * th["range_sigmas"], np.nan)
    lo_lim, hi_lim = s["lo"] - rs, s["hi"] + rs
    with np.errstate(invalid="ignore"):
        over, under = c["maxs"] > hi_lim, c["mins"] < lo_lim
    for i, j in zip(*np.nonzero(over | under)):
        v = float(c["maxs"][i, j] if over[i, j] else c["mins"][i, j])
        sd = s["span"][j] / 4.653
        dev = (v - s["hi"][j] if over[i, j] else s["lo"][j] - v) / sd if sd > 0 else math.inf
        out.append(
            Candidate(
                "quality.out_of_range",
                f"{_dim_label(raw, name, j)} reaches {v:.4g}, dataset q1..q99 is "
                f"{s['lo'][j]:.4g}..{s['hi'][j]:.4g} ({dev:.0f} robust deviations beyond)",
                feature=name,
                dimension=int(j),
                value=v,
                score=dev / th["range_sigmas"] if th["range_sigmas"] else math.inf,
                locate="max" if over[i, j] else "min",
                **_ep(m, i),
            )
        )
    return out


def _clipping(raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict) -> list[Candidate]:
    """``quality.clipping``: a dimension saturated at its min/max mid-episode."""
    out: list[Candidate] = []
    L = m.rows
    # Clipping (candidates were counted in the pass).
    with np.errstate(invalid="ignore"):
        need_clip = np.maximum(th["clip_min_frames"], th["clip_share"] * L)[:, None]
        clipped = (c["clip"] >= need_clip) & (c["clip"] > 0)
    for i, j in zip(*np.nonzero(clipped)):
        k = int(c["clip"][i, j])
        out.append(
            Candidate(
                "quality.clipping",
                f"{_dim_label(raw, name, j)} sits exactly at its min/max for {k} of "
                f"{plural(int(L[i]), 'frame')} mid-episode (saturation?)",
                feature=name,
                dimension=int(j),
                value=k / float(L[i]),
                score=k / float(need_clip[i, 0]),
                locate="extreme",
                **_ep(m, i),
            )
        )
    return out


def _dead_dimensions(
    raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict
) -> list[Candidate]:
    """``quality.dead_dimension``: one value in every frame of the dataset."""
    out: list[Candidate] = []
    L = m.rows
    # Dead dimensions.
    dmin, dmax = np.nanmin(c["mins"], axis=0), np.nanmax(c["maxs"], axis=0)
    if L.sum() >= 2:
        for j in np.flatnonzero(dmin == dmax):
            out.append(
                Candidate(
                    "quality.dead_dimension",
                    f"{_dim_label(raw, name, j)} is {float(dmin[j]):.4g} in every frame",
                    feature=name,
                    dimension=int(j),
                    value=float(dmin[j]),
                    score=1.0,
                )
            )
    return out


def _ep(m: Merged, i: int) -> dict[str, Any]:
    return {"episode": int(m.episodes[i]), "file": m.file_of(i)}


def _names(raw: RawRoot, feature: str, d: int) -> list[str] | None:
    names = raw.features.get(feature, {}).get("names")
    if isinstance(names, dict):
        names = next(iter(names.values()), None)
    if isinstance(names, list) and len(names) == d and all(isinstance(n, str) for n in names):
        return names
    return None


def _action_range(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    """Action dimensions against the state dimension of the same joint: by name when the two
    features share names, else by position when their shapes are equal."""
    a, st = m.features.get("action"), m.features.get("observation.state")
    if a is None or st is None:
        return []
    da, ds = a["mins"].shape[1], st["mins"].shape[1]
    na, ns = _names(raw, "action", da), _names(raw, "observation.state", ds)
    if na and ns and set(na) & set(ns):
        pairs = [(j, ns.index(n)) for j, n in enumerate(na) if n in ns]
    elif da == ds:
        pairs = [(j, j) for j in range(da)]
    else:
        return []
    smin, smax = np.nanmin(st["mins"], axis=0), np.nanmax(st["maxs"], axis=0)
    out = []
    for ja, js in pairs:
        span = smax[js] - smin[js]
        if not span > 0:
            continue
        lo, hi = (
            smin[js] - th["action_state_margin"] * span,
            smax[js] + th["action_state_margin"] * span,
        )
        amax, amin = a["maxs"][:, ja], a["mins"][:, ja]
        with np.errstate(invalid="ignore"):
            bad = (amax > hi) | (amin < lo)
        for i in np.flatnonzero(bad):
            over = amax[i] > hi
            v = float(amax[i] if over else amin[i])
            beyond = (v - smax[js] if over else smin[js] - v) / span
            out.append(
                Candidate(
                    "quality.action_range",
                    f"{_dim_label(raw, 'action', ja)} reaches {v:.4g}, {beyond:.2f} state ranges "
                    f"outside observation.state[{js}] ({smin[js]:.4g}..{smax[js]:.4g})",
                    feature="action",
                    dimension=int(ja),
                    value=v,
                    score=beyond / th["action_state_margin"]
                    if th["action_state_margin"]
                    else math.inf,
                    locate="max" if over else "min",
                    **_ep(m, i),
                )
            )
    return out


def _timing_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    out = []
    fps = raw.fps
    if not fps:
        return out
    for i in np.flatnonzero(m.ts_drops > 0):
        out.append(
            Candidate(
                "quality.dropped_frames",
                f"{plural(int(m.ts_drops[i]), 'timestamp gap')}, "
                f"{plural(int(m.ts_missing[i]), 'frame')} missing; "
                f"largest step {m.ts_maxstep[i]:.2f} frames ({m.ts_maxstep[i] / fps:.3f} s at "
                f"{fps:g} fps)",
                feature="timestamp",
                value=float(m.ts_missing[i]),
                score=float(m.ts_maxstep[i] / th["drop_factor"]) if th["drop_factor"] else math.inf,
                **_ep(m, i),
            )
        )
    with np.errstate(invalid="ignore"):
        off = np.abs(m.ts_interval - 1) > th["interval_tolerance"]
    for i in np.flatnonzero(off & (m.ts_drops == 0)):
        out.append(
            Candidate(
                "quality.frame_interval",
                f"mean timestamp step is {m.ts_interval[i] / fps:.5f} s, 1/fps is {1 / fps:.5f} s "
                f"({m.ts_interval[i]:.3f} frames)",
                feature="timestamp",
                value=float(m.ts_interval[i] / fps),
                score=float(abs(m.ts_interval[i] - 1) / max(th["interval_tolerance"], 1e-9)),
                **_ep(m, i),
            )
        )
    return out


def _episode_table(raw: RawRoot) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.Array]:
    """episode_index, length, task_index, data_file of the episodes table (first row wins);
    data_file stays an Arrow array (a Python string per episode would cost ~90 bytes each)."""
    e = raw.episodes
    ep = e["episode_index"].to_numpy(zero_copy_only=False)
    length = e["length"].to_numpy(zero_copy_only=False) if "length" in e.column_names else None
    if length is None:
        length = np.full(len(ep), -1)
    task = e["task_index"].to_numpy(zero_copy_only=False)
    _, first = np.unique(ep, return_index=True)
    first.sort()
    return (
        ep[first],
        np.nan_to_num(length[first].astype(np.float64), nan=-1),
        task[first],
        e["data_file"].take(pa.array(first)).combine_chunks(),
    )


def _rows_per_episode(ep: np.ndarray, m: Merged) -> np.ndarray:
    """Rows scanned of each of the episodes ``ep`` (unique), summed over the files they are in."""
    rows = np.zeros(len(ep), np.int64)
    if len(ep) and len(m.episodes):
        by = np.argsort(ep, kind="stable")
        at = np.minimum(np.searchsorted(ep, m.episodes, sorter=by), len(ep) - 1)
        k = by[at]
        known = ep[k] == m.episodes
        np.add.at(rows, k[known], m.rows[known])
    return rows


def _episode_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    if raw.episodes is None or raw.episodes.num_rows == 0:
        return []
    ep, length, task, files = _episode_table(raw)
    rows = _rows_per_episode(ep, m)
    scanned = pa.array(sorted(m.scanned), pa.string())
    in_scanned = pc.fill_null(pc.is_in(files, value_set=scanned), False).to_numpy(
        zero_copy_only=False
    )
    out = []

    def add(check: str, mask: np.ndarray, msg: Callable[[int], str], value, score=None) -> None:
        for k in np.flatnonzero(mask):
            out.append(
                Candidate(
                    check,
                    msg(k),
                    episode=int(ep[k]),
                    file=str(files[int(k)].as_py()),
                    value=float(value[k]),
                    score=float(score[k]) if score is not None else 1.0,
                )
            )

    empty = (length == 0) | (in_scanned & (rows == 0))
    add(
        "quality.empty_episode",
        empty,
        lambda k: f"no frames (length {int(length[k])}, {plural(int(rows[k]), 'row')} in the data)",
        rows,
    )
    add("quality.single_frame", (length == 1) & ~empty, lambda k: "one frame only", length)
    if th["min_length"] > 0:
        short = (length > 1) & (length < th["min_length"])
        add(
            "quality.short_episode",
            short,
            lambda k: (
                f"{plural(int(length[k]), 'frame')}, fewer than "
                f"--min-length {int(th['min_length'])}"
            ),
            length,
            th["min_length"] / np.maximum(length, 1),
        )
    # Length outliers per task (robust z of log length).
    logl = np.log(np.maximum(length, 1))
    z = np.zeros(len(ep))
    med = np.zeros(len(ep))
    for t in np.unique(task):
        sel = (task == t) & (length > 0)
        if sel.sum() < th["length_min_episodes"]:
            continue
        mu = np.median(logl[sel])
        sd = max(MAD_TO_SIGMA * np.median(np.abs(logl[sel] - mu)), th["length_log_floor"])
        z[sel] = np.abs(logl[sel] - mu) / sd
        med[sel] = np.exp(mu)
    add(
        "quality.length_outlier",
        z > th["length_sigmas"],
        lambda k: (
            f"{plural(int(length[k]), 'frame')}; task {int(task[k])}'s median is {med[k]:.0f} "
            f"({z[k]:.1f} robust deviations of log length, threshold {th['length_sigmas']:g})"
        ),
        length,
        z / max(th["length_sigmas"], 1e-9),
    )
    return out


def _task_checks(raw: RawRoot, th: dict) -> list[Candidate]:
    if raw.tasks is None:
        return []
    names = [c for c in ("task", "__index_level_0__") if c in raw.tasks.column_names]
    if not names:
        return []
    strings = raw.tasks[names[0]].to_pylist()
    index = raw.tasks["task_index"].to_pylist()
    out = []
    for t, s in zip(index, strings):
        norm = (s or "").strip().casefold()
        if norm in PLACEHOLDER_TASKS or PLACEHOLDER_PATTERN.match(norm):
            out.append(
                Candidate(
                    "quality.task_placeholder",
                    f"task {t} is {s!r}: empty or a placeholder, not an instruction",
                    file="meta/tasks.parquet" if raw.version == "v3.0" else "meta/tasks.jsonl",
                    value=float(t),
                    details={"task_index": t, "task": s},
                )
            )
    if raw.episodes is not None and raw.episodes.num_rows:
        _, _, task, _ = _episode_table(raw)
        counts = {t: 0 for t in index}
        vals, n = np.unique(task[task >= 0], return_counts=True)
        counts.update(zip(vals.tolist(), n.tolist()))
        median = float(np.median(list(counts.values()))) if counts else 0.0
        need = th["min_task_episodes"]
        if need > 0 and median >= need * th["task_rare_factor"]:
            for t, c in counts.items():
                if c < need:
                    out.append(
                        Candidate(
                            "quality.task_rare",
                            f"task {t} has {plural(c, 'episode')} (the median task has "
                            f"{median:.0f})",
                            value=float(c),
                            score=need / max(c, 0.5),
                            details={"task_index": t},
                        )
                    )
    return out


def _quarter(c: dict[str, np.ndarray], L: np.ndarray, sel: np.ndarray) -> tuple:
    """Robust summary of a quarter of the episodes (merged rows ``sel``; ``L``: their lengths
    as a float column): median episode mean, spread of the episode means (1.4826 x MAD),
    median within-episode standard deviation, episode count, then the median and spread of the
    log standard deviations. Medians, so that one bad episode (a spike) moves nothing; only
    the quarter's rows are computed (not every episode's)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        Ls = L[sel]
        means = c["sums"][sel] / Ls
        stds = np.sqrt(np.maximum(c["sumsq"][sel] / Ls - means**2, 0))
        mu = np.nanmedian(means, 0)
        spread = MAD_TO_SIGMA * np.nanmedian(np.abs(means - mu), 0)
        del means
        sd = np.nanmedian(stds, 0)
        # the same on log within-episode standard deviations (they vary a lot between
        # episodes: a ratio of two medians alone is noise for small quarters)
        logs = np.log(np.maximum(stds, 1e-12))
        del stds
        log_mu = np.nanmedian(logs, 0)
        log_spread = MAD_TO_SIGMA * np.nanmedian(np.abs(logs - log_mu), 0)
    return mu, spread, sd, len(sel), log_mu, log_spread


def _shift_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    """First vs last quarter of the episodes: the median episode mean moves (z against the
    spread of episode means, and effect size in frame standard deviations), or the typical
    within-episode standard deviation changes by a factor."""
    n = len(m.episodes)
    if n < max(th["shift_min_episodes"], 8):
        return []
    order = np.argsort(m.episodes, kind="stable")
    q = n // 4
    first, last = order[:q], order[-q:]
    out = []
    L = np.maximum(m.rows.astype(np.float64), 1)[:, None]
    for name, c in m.features.items():
        mf, pf, sf, nf, lf, lpf = _quarter(c, L, first)
        ml, pl_, sl, nl, ll, lpl = _quarter(c, L, last)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # the median's standard error is ~1.25x the mean's
            z = np.abs(ml - mf) / (1.2533 * np.sqrt(pf**2 / nf + pl_**2 / nl))
            total = np.sqrt((sf**2 + sl**2) / 2 + (pf**2 + pl_**2) / 2)
            effect = np.abs(ml - mf) / total
            ratio = np.fmax(sl / sf, sf / sl)
            z_sd = np.abs(ll - lf) / (1.2533 * np.sqrt(lpf**2 / nf + lpl**2 / nl))
        for j in range(c["sums"].shape[1]):
            label = _dim_label(raw, name, j)
            if z[j] > th["shift_sigmas"] and effect[j] > th["shift_effect"]:
                out.append(
                    Candidate(
                        "quality.shift",
                        f"{label} mean moves from {mf[j]:.4g} (first {nf} episodes) to "
                        f"{ml[j]:.4g} (last {nl}): {effect[j]:.2f} standard deviations, "
                        f"z={z[j]:.0f}",
                        feature=name,
                        dimension=j,
                        value=float(effect[j]),
                        score=float(effect[j] / max(th["shift_effect"], 1e-9)),
                    )
                )
            elif (
                ratio[j] > th["shift_std_ratio"]
                and z_sd[j] > th["shift_sigmas"]
                and min(sf[j], sl[j]) > 0
            ):
                out.append(
                    Candidate(
                        "quality.shift",
                        f"{label} standard deviation changes from {sf[j]:.4g} (first {nf} "
                        f"episodes) to {sl[j]:.4g} (last {nl}): ratio {ratio[j]:.2f}",
                        feature=name,
                        dimension=j,
                        value=float(ratio[j]),
                        score=float(ratio[j] / max(th["shift_std_ratio"], 1e-9)),
                    )
                )
    return out


# ---------------------------------------------------------------------------------------------
# Duplicates and second reads.


def _scaled_summaries(m: Merged) -> Iterator[np.ndarray]:
    """The columns of the (episode, summary) matrix the duplicate search compares, one at a
    time: min, max and mean of every dimension of every feature over the dimension's robust
    range (finite; 0 where unknown). One column at a time: the whole matrix would cost
    ~3 x dimensions x 8 bytes per episode, several times over in the comparisons."""
    L = m.rows.astype(np.float64)
    keys, scales = [], []
    for name, c in m.features.items():
        s = m.scales[name]
        span = np.where(np.isfinite(s["span"]) & (s["span"] > 0), s["span"], 1.0)
        keys += [(c, key) for key in ("mins", "maxs", "sums")]
        scales += [span] * 3
    scale = np.concatenate(scales)  # the dtype a column is divided in, as a whole matrix would
    k = 0
    for c, key in keys:
        for j in range(c[key].shape[1]):
            with np.errstate(all="ignore"):
                col = c[key][:, j].astype(np.float64)
                if key == "sums":
                    col /= L
                col /= scale[k]
            yield np.nan_to_num(col, copy=False)
            k += 1


def _duplicate_candidates(m: Merged, th: dict, window: int = 4) -> list[tuple[int, int]]:
    """Pairs of merged rows (earlier episode first) with equal length and summaries (min, max,
    mean of every dimension) within tolerance: neighbours after sorting by (length, summary)."""
    if len(m.episodes) < 2 or not m.features:
        return []
    cols = _scaled_summaries(m)
    first = next(cols)
    order = np.lexsort((first, m.rows))
    widths = range(1, min(window, len(order) - 1) + 1)
    # the largest |difference| over all summary columns of each pair of neighbours w apart
    dist = {w: np.zeros(len(order) - w) for w in widths}
    for col in itertools.chain([first], cols):
        s = col[order]
        for w in widths:
            np.maximum(dist[w], np.abs(s[w:] - s[:-w]), out=dist[w])
    tol = th["duplicate_tolerance"] + 1e-6
    pairs = set()
    for w in widths:
        a, b = order[:-w], order[w:]
        same = (m.rows[a] == m.rows[b]) & (dist[w] <= tol)
        for i, k in zip(a[same].tolist(), b[same].tolist()):
            pairs.add((i, k) if m.episodes[i] < m.episodes[k] else (k, i))
    return sorted(pairs, key=lambda p: (m.episodes[p[1]], m.episodes[p[0]]))


def read_episode_values(
    raw: RawRoot, wanted: dict[str, set[int]], columns: Iterable[str]
) -> dict[int, dict[str, np.ndarray]]:
    """episode -> column -> values ((frames, d) for list columns) for the wanted episodes of each
    data file; every file is read once, batch by batch, keeping only the wanted episodes' rows.
    Unreadable files are skipped."""
    out: dict[int, dict[str, np.ndarray]] = {}
    columns = list(columns)
    for rel, eps in wanted.items():
        table = _wanted_rows(raw, rel, eps, columns)
        if table is None:
            continue
        ep, order = _ordered(table)
        if order is not None:
            table = table.take(pa.array(order))
        for e in eps:
            sel = np.flatnonzero(ep == e)
            if len(sel):
                out[e] = _episode_values(table.slice(int(sel[0]), len(sel)), columns)
    return out


def _wanted_rows(raw: RawRoot, rel: str, eps: set[int], columns: list[str]) -> pa.Table | None:
    """The rows of episodes ``eps`` of one data file, in file order (None: unreadable)."""
    keep = pa.array(sorted(eps), pa.int64())
    parts = []
    try:
        with _open(raw.fs, raw.join(rel)) as pf:
            names = set(pf.schema_arrow.names)
            cols = [c for c in ("episode_index", "index", *columns) if c in names]
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=cols):
                ep = batch.column("episode_index").cast(pa.int64(), safe=False)
                mask = pc.is_in(ep, value_set=keep)
                if pc.any(mask).as_py():
                    parts.append(pa.Table.from_batches([batch.filter(mask)]))
            schema = pf.schema_arrow
    except Exception:  # noqa: BLE001 - reported by the first pass
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        return None
    if not parts:
        return pa.table({c: pa.array([], schema.field(c).type) for c in cols})
    return pa.concat_tables(parts)


def _episode_values(part: pa.Table, columns: list[str]) -> dict[str, np.ndarray]:
    vals = {}
    for c in columns:
        if c not in part.column_names:
            continue
        col = part[c].combine_chunks()
        t = col.type
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
            d = t.list_size if pa.types.is_fixed_size_list(t) else None
            if d is None:
                d = int(col.value_lengths()[0].as_py() or 1)
            x = _matrix(col, d)
        else:
            x = _matrix(col, 1)
        if x is not None:
            vals[c] = x
    return vals


def _confirm_duplicates(
    raw: RawRoot, m: Merged, pairs: list[tuple[int, int]], th: dict, limit: int
) -> list[Candidate]:
    if not pairs:
        return []
    pairs = pairs[: limit * 4]
    wanted: dict[str, set[int]] = {}
    for i, k in pairs:
        for r in (i, k):
            wanted.setdefault(m.file_of(r), set()).add(int(m.episodes[r]))
    vals = read_episode_values(raw, wanted, m.features)
    spans = {n: m.scales[n]["span"] for n in m.features}
    out, seen = [], set()
    for i, k in pairs:
        a, b = vals.get(int(m.episodes[i])), vals.get(int(m.episodes[k]))
        if a is None or b is None or int(m.episodes[k]) in seen:
            continue
        worst = 0.0
        for n in m.features:
            if n not in a or n not in b or a[n].shape != b[n].shape:
                worst = math.inf
                break
            span = np.where(spans[n] > 0, spans[n], 1.0)
            with np.errstate(invalid="ignore"):
                worst = max(worst, float(np.nanmax(np.abs(a[n] - b[n]) / span)))
        if worst <= th["duplicate_tolerance"]:
            seen.add(int(m.episodes[k]))
            kind = "identical to" if worst == 0 else f"within {worst:.2g} of the range of"
            out.append(
                Candidate(
                    "quality.duplicate",
                    f"{', '.join(m.features)} {kind} episode {int(m.episodes[i])} at every frame "
                    f"({plural(int(m.rows[k]), 'frame')})",
                    feature=next(iter(m.features)),
                    value=worst,
                    score=1.0,
                    details={"duplicate_of": int(m.episodes[i])},
                    **_ep(m, k),
                )
            )
    return out


def _locate(c: Candidate, x: np.ndarray) -> int | None:
    if c.locate == "step" and len(x) >= 2:
        return int(np.argmax(np.abs(np.diff(x)))) + 1
    if c.locate == "max":
        return int(np.argmax(x))
    if c.locate == "min":
        return int(np.argmin(x))
    return None


def _signal(x: np.ndarray, at: int | None) -> list[float]:
    """At most SIGNAL_POINTS values of ``x``: the whole episode bucketed (keeping each bucket's
    most extreme value, so a one-frame spike survives), or a window around ``at``."""
    if len(x) <= SIGNAL_POINTS:
        return [float(v) for v in x]
    edges = np.linspace(0, len(x), SIGNAL_POINTS + 1).astype(int)
    mid = np.median(x)
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        seg = x[a:b]
        out.append(float(seg[np.argmax(np.abs(seg - mid))]))
    return out


def _attach_signals(raw: RawRoot, cands: list[Candidate]) -> None:
    """Frame position and a short signal for per-episode findings with a feature (re-reads only
    the flagged episodes)."""
    need = [c for c in cands if c.episode is not None and c.feature and c.file]
    need = [c for c in need if "signal" not in c.details]  # drift: its own per-episode signal
    if not need:
        return
    wanted: dict[str, set[int]] = {}
    cols: set[str] = set()
    for c in need:
        wanted.setdefault(c.file, set()).add(c.episode)
        cols.add(c.feature)
    vals = read_episode_values(raw, wanted, cols)
    for c in need:
        x = vals.get(c.episode, {}).get(c.feature)
        if x is None:
            continue
        if c.dimension is not None:
            x = x[:, c.dimension]
        elif c.feature == "timestamp":
            x = np.diff(x[:, 0]) * (raw.fps or 1.0) if len(x) > 1 else x[:, 0]
        else:
            x = x[:, 0]
        at = _locate(c, x)
        if at is not None:
            c.details["frame"] = at
            c.message += f" at frame {at}"
        c.details["signal"] = _signal(x, at)


# ---------------------------------------------------------------------------------------------
# Entry point.


def check_quality(
    raw: RawRoot,
    rels: list[str],
    want: set[str] | None = None,
    thresholds: dict | None = None,
    threads: int | None = None,
    executor: str = "local",
) -> list[Finding]:
    """Run the ``quality.*`` checks over the readable data files ``rels`` of ``raw``.

    The per-file pass runs in threads here, or one Ray task per file with ``executor="ray"``
    (each returns its per-episode summaries and strided sample, never the file's rows). Each
    file's summaries are folded into the merged ones as they arrive and dropped: the driver
    holds one copy of the per-episode summaries, whatever the number of files."""
    th = dict(DEFAULTS if thresholds is None else {**DEFAULTS, **thresholds})
    want = set(CHECKS) if want is None else want
    m = _scan(raw, rels, quality_features(raw), th, threads, executor)
    cands: list[Candidate] = []
    cands += _signal_checks(raw, m, th)
    cands += _timing_checks(raw, m, th)
    cands += _episode_checks(raw, m, th)
    cands += _task_checks(raw, th)
    cands += _shift_checks(raw, m, th)
    if "quality.drift" in want:
        label = lambda f, j: _dim_label(raw, f, j)  # noqa: E731
        cands += [Candidate(**c) for c in drift.drift_candidates(raw, m, th, label)]
    if "quality.duplicate" in want:
        cands += _confirm_duplicates(raw, m, _duplicate_candidates(m, th), th, MAX_PER_CHECK)
    del m
    release_memory()  # the merged summaries and the re-read rows' Arrow buffers
    cands = [c for c in cands if c.check in want]
    return _to_findings(raw, cands)


def _scan(
    raw: RawRoot,
    rels: list[str],
    features: dict[str, int],
    th: dict,
    threads: int | None,
    executor: str,
) -> Merged:
    """The per-file pass over ``rels``, merged as the files' summaries arrive."""
    total = 0
    if raw.episodes is not None and "length" in raw.episodes.column_names:
        total = int(np.nansum(raw.episodes["length"].to_numpy(zero_copy_only=False)))
    stride = max(1, total // SAMPLE_ROWS)
    episodes = raw.episodes.num_rows if raw.episodes is not None else 0
    merger = _Merger(rels, features, episodes, total // stride + len(rels) + 1)
    if executor != "local":
        jobs = [(raw.fs, raw.join(r), r, raw.fps, features, stride, th) for r in rels]
        results: Iterator[tuple[int, FileStats]] = imap_files(_scan_job, jobs, executor=executor)
    else:
        workers = threads or max(1, min(len(rels), os.cpu_count() or 1, 4))
        results = _scan_threads(raw, rels, features, stride, th, workers)
    for i, part in results:
        merger.add(i, part)
        del part  # a Ray result pins its object-store buffer while referenced
    m = merger.finish()
    release_memory()
    return m


def _scan_threads(
    raw: RawRoot, rels: list[str], features: dict[str, int], stride: int, th: dict, workers: int
) -> Iterator[tuple[int, FileStats]]:
    """(position, summaries) of every file as it is scanned, in ``workers`` threads."""
    if workers == 1:
        for i, r in enumerate(rels):
            yield i, scan_file(raw, r, features, stride, th)
        return
    yield from imap_threads(lambda r: scan_file(raw, r, features, stride, th), rels, workers)


def _scan_job(job: tuple) -> FileStats:
    """One file's pass as an executor job: (fs, path, rel, fps, features, stride, th)."""
    return scan_path(*job)


def _to_findings(raw: RawRoot, cands: list[Candidate]) -> list[Finding]:
    """Worst first per check, capped at MAX_PER_CHECK (the rest summarized in one finding);
    signals are attached to the kept ones."""
    by_check: dict[str, list[Candidate]] = {}
    for c in cands:
        by_check.setdefault(c.check, []).append(c)
    kept, rest = [], {}
    for check, items in by_check.items():
        items.sort(
            key=lambda c: (-c.score if math.isfinite(c.score) else -math.inf, c.episode or 0)
        )
        kept += items[:MAX_PER_CHECK]
        if len(items) > MAX_PER_CHECK:
            rest[check] = items[MAX_PER_CHECK:]
    _attach_signals(raw, kept)
    release_memory()  # the re-read rows' Arrow buffers
    out = []
    for c in kept:
        details = dict(c.details)
        details["score"] = round(c.score, 3) if math.isfinite(c.score) else None
        out.append(
            Finding(
                c.check,
                WARNING,
                c.message,
                c.file,
                c.episode,
                feature=c.feature,
                dimension=c.dimension,
                value=c.value,
                details=details,
            )
        )
    for check, items in rest.items():
        eps = sorted({c.episode for c in items if c.episode is not None})
        out.append(
            Finding(
                check,
                WARNING,
                f"... and {len(items)} more {noun_for(len(items), 'finding')} of this check"
                + (
                    f" (episodes {', '.join(map(str, eps[:20]))}{', ...' if len(eps) > 20 else ''})"
                    if eps
                    else ""
                ),
                details={"more": len(items), "episodes": eps},
            )
        )
    return out
