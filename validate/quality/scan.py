"""The scanning: which features are checked, one data file streamed into per-episode summaries
(:func:`scan_file`), and every file of a root scanned in threads (or executor jobs) and merged
as the summaries arrive (:func:`scan_files`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core import interrupt
from episodekit.core.errors import DatasetError
from episodekit.core.executor import imap_files, imap_threads
from episodekit.core.memory import release_memory
from episodekit.core.parquet_read import open_data_file as open_parquet
from episodekit.core.parquet_read import read_schema, read_table
from episodekit.validate.quality.merge import Merged, Merger
from episodekit.validate.quality.summaries import (
    TS_FILL,
    FeatureStats,
    FileStats,
    episode_segments,
    feature_matrix,
    feature_stats,
    last_finite,
)
from episodekit.validate.quality.thresholds import (
    FEATURE_PREFIXES,
    SAMPLE_ROWS,
)
from episodekit.validate.raw import RawRoot


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


def ordered_rows(table: pa.Table) -> tuple[np.ndarray, np.ndarray | None]:
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


def _read_path(fs: Any, path: str, features: dict[str, int]) -> pa.Table:
    names = set(read_schema(fs, path).names)
    cols = [c for c in ("episode_index", "index", "timestamp", *features) if c in names]
    return read_table(fs, path, cols)


@contextlib.contextmanager
def open_data_file(fs: Any, path: str) -> Iterator[Any]:
    """A streaming ``pyarrow.parquet.ParquetFile`` (the data-file layer's: pages read as decoded, no
    pre-buffered row group; a local file through arrow's own reader), closed on exit."""
    with open_parquet(path, fs, stream=True) as df:
        yield df.parquet


def _batches(fs: Any, path: str, features: dict[str, int]):
    """The file's record batches as tables (reader failures raise :class:`_ReadError`)."""
    try:
        with open_data_file(fs, path) as pf:
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
        cause = exc.__cause__ if isinstance(exc, DatasetError) and exc.__cause__ else exc
        raise _ReadError(str(cause)) from cause  # the reader's own words, as reported before


def _in_order(table: pa.Table) -> bool:
    """True when the rows are in (episode, index) order (what :func:`ordered_rows` leaves alone)."""
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
    ep, order = ordered_rows(table)
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
    ids, starts, lengths = episode_segments(ep)
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
        x = feature_matrix(table[name], dim)
        if x is not None:
            prev = carry.get(name)
            out.features[name] = feature_stats(x, starts, lengths, stride, th, first, prev)
            carry[name] = last_finite(x, prev)
    return out


def scan_files(
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
    merger = Merger(rels, features, episodes, total // stride + len(rels) + 1)
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
