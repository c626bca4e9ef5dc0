"""Stream the kept rows of the source data files into the output's data files.

Rows are read batch by batch (row groups holding no kept episode are skipped through the
footer's ``episode_index`` statistics), filtered, renumbered (``episode_index``, ``index``) and
remapped (``task_index`` to the new tasks table), and written through the episode sink's data
files (:class:`~episodekit.writers.sink_data.DataFiles`, ``planned`` row groups: the plan's
episode-aligned groups, by the writer ``prep rowgroups`` uses, page index, layout marker), so
``prepare`` skips its row-group step on the output. Memory: about one output row group.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.band import codec_name, make_marker
from episodekit.core.checksum import TableChecksum
from episodekit.core.dataset import Dataset
from episodekit.core.errors import DatasetError
from episodekit.core.executor import imap_files
from episodekit.core.memory import release_memory
from episodekit.core.parquet_read import open_data_file
from episodekit.core.parquet_write import Encoding, RowGroupPlanError
from episodekit.core.paths import MIB
from episodekit.writers.frame_rows import FrameCutter
from episodekit.writers.plan import OutputPlan
from episodekit.writers.sink_data import DataFiles, DataPolicy
from episodekit.writers.stream_stats import StreamedStats

RENUMBERED = ("index", "episode_index")  # checked structurally, not by checksum


@dataclass
class TaskValues:
    """Each output episode's ``task_index`` values, kept compactly: (value, count) pieces for
    constant stretches, arrays otherwise (rare: LeRobot episodes have one task)."""

    pieces: dict[int, list] = field(default_factory=dict)

    def add(self, episodes: np.ndarray, tasks: np.ndarray) -> None:
        starts = np.concatenate([[0], np.flatnonzero(episodes[1:] != episodes[:-1]) + 1])
        ends = np.append(starts[1:], len(episodes))
        lo = np.minimum.reduceat(tasks, starts)
        hi = np.maximum.reduceat(tasks, starts)
        for s, e, a, b in zip(starts.tolist(), ends.tolist(), lo.tolist(), hi.tolist()):
            piece = (a, e - s) if a == b else tasks[s:e].copy()
            self.pieces.setdefault(int(episodes[s]), []).append(piece)

    def constant(self, episode: int) -> float:
        """The episode's one task_index, or NaN when it has several."""
        pieces = self.pieces.get(episode, [])
        first = {p[0] if isinstance(p, tuple) else None for p in pieces}
        return float(first.pop()) if len(first) == 1 and None not in first else float("nan")

    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Every task_index value of the output, sorted, and its number of rows."""
        total: dict[int, int] = {}
        for pieces in self.pieces.values():
            for p in pieces:
                one = isinstance(p, tuple)
                v, c = ([p[0]], [p[1]]) if one else np.unique(p, return_counts=True)
                for a, b in zip(v, c):
                    total[int(a)] = total.get(int(a), 0) + int(b)
        values = np.array(sorted(total), dtype=np.int64)
        return values, np.array([total[v] for v in values.tolist()], dtype=np.int64)

    def values(self, episode: int) -> np.ndarray:
        parts = [
            np.full(p[1], p[0], dtype=np.int64) if isinstance(p, tuple) else p
            for p in self.pieces.get(episode, [])
        ]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@dataclass
class DataResult:
    """What the data stage wrote: relative paths (by output file number), per output file the
    checksums of the kept rows it holds (all columns but ``index``/``episode_index``,
    ``task_index`` remapped), the schema."""

    files: dict[int, str]
    checksums: dict[int, dict[str, str]]
    schema: pa.Schema
    codec: str
    tasks: TaskValues
    # stats of the episodes reduced while their rows were written (writers/stream_stats.py)
    streamed: StreamedStats | None = None


def _drop_from_hf_metadata(meta: dict, removed: set[str]) -> dict:
    """The schema's ``huggingface`` metadata without the removed features."""
    raw = meta.get(b"huggingface")
    if not raw or not removed:
        return meta
    try:
        hf = json.loads(raw)
        feats = hf.get("info", {}).get("features", {})
        for k in removed:
            feats.pop(k, None)
        return {**meta, b"huggingface": json.dumps(hf).encode()}
    except (ValueError, AttributeError):
        return meta


def output_schema(plan: OutputPlan, removed: set[str]) -> pa.Schema:
    """The first source's data schema without the removed columns; every source must match it."""
    schemas = []
    for d, ds in enumerate(plan.datasets):
        f = int(plan.src_file[np.flatnonzero(plan.ds_id == d)[0]])
        with open_data_file(ds.data_path(f), ds.fs) as df:
            schemas.append(df.schema)
    keep = [n for n in schemas[0].names if n not in removed]
    for name in RENUMBERED + ("task_index",):
        if name not in keep:
            raise DatasetError(f"the data files have no {name!r} column", plan.datasets[0].root)
    schema = pa.schema([schemas[0].field(n) for n in keep])
    for d, s in enumerate(schemas[1:], start=1):
        other = pa.schema([s.field(n) for n in s.names if n not in removed])
        if not other.equals(schema):
            a = {f.name: str(f.type) for f in schema}
            b = {f.name: str(f.type) for f in other}
            diff = sorted(set(a.items()) ^ set(b.items()))[0]
            raise ValueError(
                f"{plan.datasets[d].root}: data columns differ from {plan.datasets[0].root} "
                f"(column {diff[0]!r}: {b.get(diff[0], 'missing')} vs {a.get(diff[0], 'missing')})"
            )
    return schema.with_metadata(_drop_from_hf_metadata(dict(schemas[0].metadata or {}), removed))


def _row_groups(plan: OutputPlan, d: int, f: int, keep: np.ndarray) -> list[int] | None:
    """Source row groups that may hold a kept episode (None: all, when the footer has no
    statistics or the layout came without a footer)."""
    layout = plan.layouts[(d, f)]
    if layout.episode_min is None:
        return None
    i = np.clip(np.searchsorted(keep, layout.episode_min), 0, len(keep) - 1)
    return np.flatnonzero(keep[i] <= layout.episode_max).tolist() if len(keep) else []


def kept_batches(
    plan: OutputPlan, d: int, f: int, pos: np.ndarray, schema: pa.Schema, task_map: np.ndarray
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """The rows of output episodes ``pos`` (all from source file ``f`` of dataset ``d``),
    renumbered and remapped, as ``(batch, output episode per row)``."""
    ds: Dataset = plan.datasets[d]
    layout = plan.layouts[(d, f)]
    keep = plan.src_episode[pos]
    offset = int(plan.from_index[pos[0]])
    counts = np.zeros(len(pos), dtype=np.int64)
    path = ds.data_path(f)
    cutter = FrameCutter(plan, pos, ds.fps) if plan.frames else None  # frames cut inside
    changes = plan.changes  # features added or renamed (writers/features.py)
    names = changes.read_names(schema.names) if changes else schema.names
    with open_data_file(path, ds.fs, stream=True) as df:
        for batch in df.batches(layout.batch_rows(), names, _row_groups(plan, d, f, keep)):
            ep = batch.column("episode_index").to_numpy()
            k = np.clip(np.searchsorted(keep, ep), 0, len(keep) - 1)
            mask = keep[k] == ep
            if not mask.all():
                batch, k = batch.filter(pa.array(mask)), k[mask]
            if changes:  # added values looked up by source frame, needed for kept rows only
                need = cutter.kept_rows(batch, k, path) if cutter is not None else None
                batch = changes.apply(batch, path, need)
            if cutter is not None:
                batch, k = cutter.apply(batch, k, path)
            n = batch.num_rows
            if n == 0:
                continue
            counts += np.bincount(k, minlength=len(pos))
            cols = dict(zip(batch.schema.names, batch.columns))
            out_ep = pos[k]
            cols["episode_index"] = pa.array(out_ep, schema.field("episode_index").type)
            cols["index"] = pa.array(np.arange(offset, offset + n), schema.field("index").type)
            offset += n
            cols["task_index"] = _remap_tasks(cols["task_index"], task_map, path, schema)
            arrays = [cols[name] for name in schema.names]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema), out_ep
    bad = np.flatnonzero(counts != plan.length[pos])
    if len(bad):
        i = int(bad[0])
        raise DatasetError(
            f"episode {int(keep[i])} has {int(counts[i])} rows, the episodes table says "
            f"{int(plan.length[pos[i]])}",
            path,
        )


READ_AHEAD_BYTES = 16 * MIB  # source rows decoded ahead of the writer (small files only)
READ_THREADS = 2


def _read_ahead(
    plan: OutputPlan, runs: list, schema: pa.Schema, task_maps: list[np.ndarray]
) -> Iterator[Iterator[tuple[pa.RecordBatch, np.ndarray]]]:
    """Each run's kept batches, in order. Runs from small source files (v2.x: one episode per
    file) are read by a few threads, up to ``READ_AHEAD_BYTES`` of decoded rows ahead of the
    writer; a large file is streamed batch by batch as before (memory: about one row group)."""
    from concurrent.futures import ThreadPoolExecutor

    def size(run) -> float:
        return float(plan.layouts[(run[0], run[1])].row_group_bytes.sum())

    def read(run) -> list:
        return list(kept_batches(plan, run[0], run[1], run[2], schema, task_maps[run[0]]))

    small = [size(r) * 4 <= READ_AHEAD_BYTES for r in runs]
    if sum(small) < 2 * READ_THREADS:
        for r in runs:
            yield kept_batches(plan, r[0], r[1], r[2], schema, task_maps[r[0]])
        return
    with ThreadPoolExecutor(READ_THREADS) as pool:
        pending: list = []  # (future or None, run) in order
        budget = 0.0
        i = 0
        while i < len(runs) or pending:
            while i < len(runs) and small[i] and (budget < READ_AHEAD_BYTES or not pending):
                pending.append((pool.submit(read, runs[i]), size(runs[i])))
                budget += size(runs[i])
                i += 1
            if pending:
                fut, nbytes = pending.pop(0)
                budget -= nbytes
                yield iter(fut.result())
            elif i < len(runs):  # a large file: streamed in this thread
                r = runs[i]
                i += 1
                yield kept_batches(plan, r[0], r[1], r[2], schema, task_maps[r[0]])


def _remap_tasks(col: pa.Array, task_map: np.ndarray, path: str, schema: pa.Schema) -> pa.Array:
    old = col.to_numpy(zero_copy_only=False).astype(np.int64)
    ok = (old >= 0) & (old < len(task_map))
    new = np.where(ok, task_map[np.clip(old, 0, max(len(task_map) - 1, 0))], -1)
    if np.any(new < 0):
        bad = int(old[np.flatnonzero(new < 0)[0]])
        raise DatasetError(f"task_index {bad} is not in the tasks of the kept episodes", path)
    return pa.array(new, schema.field("task_index").type)


def write_data(
    plan: OutputPlan,
    staging: Path,
    schema: pa.Schema,
    task_maps: list[np.ndarray],
    target_bytes: int,
    chunks_size: int,
    executor: str = "local",
) -> DataResult:
    """Write every output data file under ``staging`` (see the module docstring): one job per
    output file, in this process (``executor="local"``) or as Ray tasks (``"ray"``: ``staging``
    must be on a filesystem every node mounts at the same path)."""
    first = plan.layouts[(0, int(plan.src_file[0]))]
    codec = codec_name(first.compression)
    codec = "snappy" if codec == "none" else codec
    marker = make_marker(target_bytes / MIB, codec)
    result = DataResult({}, {}, schema, codec, TaskValues())
    if plan.stream:
        result.streamed = StreamedStats(plan.stream)
    shared = (plan, str(staging), schema, task_maps, codec, marker, chunks_size)
    files = np.unique(plan.file_seq).tolist()
    pieces: dict[int, dict] = {}
    workers = 1 if executor == "local" else None
    for _, done in imap_files(_file_job, files, executor, workers, shared=shared):
        f, rel, digests, tasks, streamed = done
        result.files[f], result.checksums[f], pieces[f] = rel, digests, tasks
        if streamed is not None:
            result.streamed.merge(streamed)
    for f in sorted(pieces):  # in file order: an episode's pieces stay in row order
        for ep, parts in pieces[f].items():
            result.tasks.pieces.setdefault(ep, []).extend(parts)
    return result


def _file_job(f: int, shared: tuple) -> tuple:
    """One output data file (an executor job): its path, checksums, task pieces and the stats
    of the episodes reduced as they were written (None when none are)."""
    plan, staging, schema, task_maps, codec, marker, chunks_size = shared
    streamed = StreamedStats(plan.stream) if plan.stream else None
    seen = FileSeen(TableChecksum(), TaskValues(), streamed)
    policy = DataPolicy("planned", Encoding(codec, sorted_index=True), verify=False, marker=marker)
    files = DataFiles(staging, schema, chunks_size, policy=policy, on_group=seen.group(schema))
    rel = _write_file(plan, f, files, task_maps, seen.tasks)
    release_memory()  # the file's decoded row groups: memory stays about one row group
    return f, rel, seen.checksum.digests(), seen.tasks.pieces, streamed


@dataclass
class FileSeen:
    """What one output file's rows leave behind as they are written: the checksums of its kept
    rows, its task pieces and (when asked) the stats of its episodes."""

    checksum: TableChecksum
    tasks: TaskValues
    streamed: StreamedStats | None = None

    def group(self, schema: pa.Schema):
        """The per-row-group hook (the sink's ``on_group``): the checksums of the kept rows
        without the renumbered columns, and the stats of the group's episodes."""
        checked = [n for n in schema.names if n not in RENUMBERED]

        def on_group(group: pa.Table) -> None:
            # one checksum pass per row group, not per (small) source batch: the sums are over
            # the rows in order, so the result is the same
            self.checksum.update(group.select(checked), contiguous=True)
            if self.streamed is not None:  # a group holds whole episodes: their stats
                self.streamed.add(group)

        return on_group


def _write_file(
    plan: OutputPlan, f: int, files: DataFiles, task_maps: list[np.ndarray], tasks: TaskValues
) -> str:
    """Output data file ``f``'s kept rows, streamed into ``files`` (its planned row groups);
    its path relative to the staging folder."""
    first = int(plan.from_index[np.flatnonzero(plan.file_seq == f)[0]])
    rel = files.open_file(f, first, plan.group_rows[f])
    try:
        for batches in _read_ahead(plan, plan.runs(f), files.schema, task_maps):
            for batch, out_ep in batches:
                tasks.add(out_ep, batch.column("task_index").to_numpy())
                files.write(batch)
        files.close()
    except RowGroupPlanError as exc:
        files.abort()
        msg = "the kept rows do not fill the planned row groups"
        raise DatasetError(msg, str(files.folder / rel)) from exc
    except BaseException:
        files.abort()
        raise
    return rel
