"""Rewrite one data parquet file into episode-aligned row groups, verified, crash-safe.

One call handles one file (the unit of parallelism): read the footer, decide whether the file is
already done, find the episode runs (one streamed read of ``episode_index``), plan the row groups,
stream the rows into a temporary sibling while checksumming them, stream the temporary back and
compare row count, schema (with its metadata) and per-column checksums, then ``os.replace``. Any
error or mismatch leaves the original untouched and is returned as a ``failed`` result naming the
file, never raised, so the other files complete.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core import interrupt
from episodekit.core.atomic import atomic_path
from episodekit.core.dataset import DatasetError, is_local
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.footer import FileLayout, file_layout
from episodekit.core.paths import MIB
from episodekit.prep.band import (
    MARKER_KEY,
    codec_name,
    episode_byte_estimate,
    file_needs_rewrite,
    make_marker,
    plan_row_groups,
    read_marker,
)
from episodekit.prep.checksum import TableChecksum

READ_BUFFER_TOTAL = 32 * MIB  # read buffers of all column streams (pre_buffer off) together
BATCH_BYTES = 8 * MIB  # aim for read batches of about this many uncompressed bytes
DICTIONARY_COLUMNS = ("episode_index", "task_index")  # low cardinality; others stay plain
# Write failures that no other file escapes (read-only, permission, disk full): the run stops
# with exit 2 instead of reporting every file as failed; other errors (EIO...) fail one file.
STOPS_THE_RUN = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}
STATUSES = ("rewritten", "skipped", "copied", "planned", "failed")


class VerificationError(Exception):
    """The written temporary file differs from its source."""


@dataclass(frozen=True)
class FileJob:
    """One data file to process. ``src`` is a path in ``fs`` (None: local); ``dst`` is local.
    ``same_source`` (``--out``): whether ``dst`` was made from ``src`` as it is now (True), from
    an older ``src`` (False), or unknown (None; :mod:`episodekit.prep.outcopy`)."""

    relpath: str
    src: str
    dst: str
    target_bytes: int
    compression: str = "keep"
    force: bool = False
    dry_run: bool = False
    fs: fsspec.AbstractFileSystem | None = None
    same_source: bool | None = None

    @property
    def in_place(self) -> bool:
        return self.fs is None and Path(self.src).resolve() == Path(self.dst).resolve()


@dataclass
class LayoutStats:
    """The footer facts the before/after table needs (small and picklable)."""

    rows: int
    file_size: int
    compression: str
    has_page_index: bool
    row_group_bytes: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, layout: FileLayout) -> LayoutStats:
        return cls(
            rows=int(layout.num_rows),
            file_size=int(layout.file_size),
            compression=layout.compression,
            has_page_index=bool(layout.has_page_index),
            row_group_bytes=[int(b) for b in layout.row_group_bytes],
        )

    @property
    def row_groups(self) -> int:
        return len(self.row_group_bytes)


@dataclass
class FileResult:
    """Outcome for one file: status is one of :data:`STATUSES`; ``reason`` says why."""

    path: str
    status: str
    reason: str = ""
    before: LayoutStats | None = None
    after: LayoutStats | None = None
    seconds: float = 0.0
    environment: bool = False  # failed for the environment (read-only, disk full), not the file

    @property
    def bytes(self) -> int:
        """Uncompressed bytes of the source (0 when its footer was unreadable)."""
        return sum(self.before.row_group_bytes) if self.before else 0


@contextlib.contextmanager
def _open_parquet(path: str, fs: fsspec.AbstractFileSystem | None):
    """A streaming ParquetFile (no pre-buffering: memory stays bounded on giant row groups)."""
    with contextlib.ExitStack() as stack:
        source = path if fs is None or is_local(fs) else stack.enter_context(fs.open(path, "rb"))
        pf = pq.ParquetFile(source, pre_buffer=False, buffer_size=MIB)
        stack.callback(pf.close)
        # Each column chunk is streamed through its own buffer: share a fixed total between them
        # (bigger buffers read faster, their sum bounds memory on giant row groups).
        leaves = max(1, pf.metadata.num_columns)
        buffer = int(np.clip(READ_BUFFER_TOTAL // leaves, MIB, 8 * MIB))
        if buffer != MIB:
            pf = pq.ParquetFile(source, pre_buffer=False, buffer_size=buffer, metadata=pf.metadata)
            stack.callback(pf.close)
        yield pf


def _batch_rows(layout: FileLayout) -> int:
    rows = np.maximum(layout.row_group_rows, 1)
    per_row = float(np.max(layout.row_group_bytes / rows)) if layout.num_row_groups else 1.0
    return int(np.clip(BATCH_BYTES / max(per_row, 1.0), 1024, 1 << 20))


def scan_runs(pf: pq.ParquetFile, batch_rows: int) -> tuple[np.ndarray, bool]:
    """First row of every run of equal ``episode_index``, and whether ``index`` never decreases.

    Streams just those two columns (a few bytes per row) before the rewrite: the plan needs the
    episode boundaries, and ``sorting_columns`` may be declared only if the order really holds.
    """
    names = pf.schema_arrow.names
    if "episode_index" not in names:
        raise ValueError("no episode_index column")
    has_index = "index" in names and pa.types.is_integer(pf.schema_arrow.field("index").type)
    columns = ["episode_index", "index"] if has_index else ["episode_index"]
    starts = [np.zeros(1, dtype=np.int64)]
    offset, last_ep, last_idx, index_sorted = 0, None, None, has_index
    for batch in pf.iter_batches(batch_size=batch_rows, columns=columns):
        if batch.num_rows == 0:
            continue
        col = batch.column(0)
        if col.null_count:
            raise ValueError("episode_index has nulls")
        ep = col.to_numpy()
        change = np.flatnonzero(ep[1:] != ep[:-1]) + 1
        if last_ep is not None and ep[0] != last_ep:
            change = np.concatenate([[0], change])
        starts.append(change.astype(np.int64) + offset)
        offset, last_ep = offset + len(ep), ep[-1]
        if index_sorted:
            idx_col = batch.column(1)
            idx = idx_col.to_numpy(zero_copy_only=False)
            index_sorted = not idx_col.null_count and not (
                (last_idx is not None and idx[0] < last_idx) or np.any(idx[1:] < idx[:-1])
            )
            last_idx = idx[-1]
    return np.concatenate(starts), bool(index_sorted)


def plain_scale(pf: pq.ParquetFile, layout: FileLayout, batch_rows: int) -> float:
    """Ratio of the rows' arrow (~ plain-encoded) size to the source footer's uncompressed size.

    The footer's sizes reflect the source's encodings (dictionary pages on float columns inflate
    them), while the output is written plain except for a few dictionary columns; scaling the
    footer sizes by this ratio, measured on the first rows, makes the output groups land near the
    target. Reads one batch.
    """
    total = float(layout.row_group_bytes.sum())
    if total <= 0 or layout.num_rows == 0:
        return 1.0
    for batch in pf.iter_batches(batch_size=min(batch_rows, 8192)):
        if batch.num_rows:
            # Dictionary-encoded columns (episode/task index) cost next to nothing in the output.
            plain = sum(
                c.nbytes
                for n, c in zip(batch.schema.names, batch.columns)
                if n not in DICTIONARY_COLUMNS
            )
            ratio = (plain / batch.num_rows) / (total / layout.num_rows)
            return float(np.clip(ratio, 0.05, 20.0))
    return 1.0


def _writer(path: Path, schema: pa.Schema, codec: str, sorted_index: bool) -> pq.ParquetWriter:
    return pq.ParquetWriter(
        path,
        schema,
        compression=codec,
        use_dictionary=[c for c in DICTIONARY_COLUMNS if c in schema.names],
        write_statistics=True,
        write_page_index=True,
        sorting_columns=(
            pq.SortingColumn.from_ordering(schema, [("index", "ascending")])
            if sorted_index
            else None
        ),
        store_schema=True,
    )


def _write_group(writer: pq.ParquetWriter, batches: list[pa.RecordBatch], schema: pa.Schema):
    """Write one output row group (exactly these rows)."""
    table = pa.Table.from_batches(batches, schema=schema)
    writer.write_table(table, row_group_size=max(1, table.num_rows))


def _stream_rewrite(
    pf: pq.ParquetFile,
    tmp: Path,
    group_rows: np.ndarray,
    codec: str,
    batch_rows: int,
    sorted_index: bool,
    marker: str,
) -> TableChecksum:
    """Stream ``pf`` into ``tmp`` as row groups of ``group_rows`` rows; checksum the source."""
    schema = pf.schema_arrow
    source_sum = TableChecksum()
    writer = _writer(tmp, schema, codec, sorted_index)
    try:
        pending: list[pa.RecordBatch] = []
        pending_rows, g = 0, 0
        for batch in pf.iter_batches(batch_size=batch_rows):
            source_sum.update(batch)
            off = 0
            while off < batch.num_rows:
                take = min(int(group_rows[g]) - pending_rows, batch.num_rows - off)
                pending.append(batch.slice(off, take))
                pending_rows += take
                off += take
                if pending_rows == group_rows[g]:
                    _write_group(writer, pending, schema)
                    pending, pending_rows, g = [], 0, g + 1
        if pending_rows:
            raise VerificationError(f"source ended inside planned row group {g}")
        writer.add_key_value_metadata({MARKER_KEY: marker})
    finally:
        writer.close()
    return source_sum


def verify_written(
    tmp: Path,
    schema: pa.Schema,
    num_rows: int,
    group_rows: np.ndarray,
    expected: TableChecksum,
    batch_rows: int,
) -> FileLayout:
    """Stream the written file back and compare it with the source; raise on any difference."""
    with _open_parquet(str(tmp), None) as pf:
        meta = pf.metadata
        if meta.num_rows != num_rows:
            raise VerificationError(f"row count {meta.num_rows} != source {num_rows}")
        if not pf.schema_arrow.equals(schema, check_metadata=True):
            raise VerificationError("schema or schema metadata differs from the source")
        rows = np.array([meta.row_group(i).num_rows for i in range(meta.num_row_groups)])
        if not np.array_equal(rows, group_rows):
            raise VerificationError("row groups differ from the plan")
        written = TableChecksum()
        for batch in pf.iter_batches(batch_size=batch_rows):
            written.update(batch)
        if written.num_rows != expected.num_rows:
            raise VerificationError(f"read back {written.num_rows} rows, wrote {num_rows}")
        got, want = written.digests(), expected.digests()
        bad = sorted(c for c in set(got) | set(want) if got.get(c) != want.get(c))
        if bad:
            raise VerificationError(f"values differ from the source in columns {bad}")
        return file_layout(str(tmp), meta=meta)


def copy_file(src: str, dst: str, fs: fsspec.AbstractFileSystem | None = None) -> None:
    """Copy ``src`` (in ``fs``; None: local) unchanged to the local path ``dst``, atomically."""
    fs = fs or fsspec.filesystem("file")
    with atomic_path(dst) as tmp:
        with fs.open(src, "rb") as r, open(tmp, "wb") as w:
            shutil.copyfileobj(r, w, 8 * MIB)


def _already_in_out(job: FileJob, before: FileLayout) -> bool:
    """For ``--out``: the destination already holds a rewrite of this source for this target."""
    dst = Path(job.dst)
    if job.in_place or job.force or job.same_source is False or not dst.exists():
        return False
    try:
        layout = file_layout(str(dst))
    except (OSError, pa.ArrowInvalid, DatasetError):
        return False
    marker = read_marker(layout)
    return (
        layout.num_rows == before.num_rows
        and marker is not None
        and marker.get("target_mb") == job.target_bytes / MIB
        and (job.compression == "keep" or codec_name(layout.compression) == job.compression)
    )


def _copied_already(job: FileJob) -> bool:
    """For ``--out``: the destination is the copy of this very source file (which needs no
    rewrite), made by an earlier run."""
    return bool(job.same_source) and not job.force and Path(job.dst).exists()


def done_already(job: FileJob) -> FileResult | None:
    """The result for a local file that needs no work, from its footer alone; else None.

    The executor asks this in the parent first, so a rerun where every file is done starts no
    process pool. Anything unusual (forced, remote, unreadable) is left to :func:`rewrite_file`.
    """
    if job.force or job.fs is not None:
        return None
    t0 = time.perf_counter()
    try:
        before = file_layout(job.src)
    except (OSError, pa.ArrowInvalid, DatasetError, EnvironmentProblem):
        return None  # the worker reports it, with the rest of the file's story
    done = file_needs_rewrite(before, job.target_bytes, job.compression) is None
    if done and (job.in_place or job.dry_run):
        reason = "already done"
    elif done and _copied_already(job):
        reason = "already copied to the output"
    elif _already_in_out(job, before):
        reason = "already rewritten in the output"
    else:
        return None
    stats = LayoutStats.of(before)
    return FileResult(job.relpath, "skipped", reason, stats, stats, time.perf_counter() - t0)


def rewrite_file(job: FileJob) -> FileResult:
    """Process one file (see the module docstring); never raises for a bad file."""
    t0 = time.perf_counter()
    result = FileResult(path=job.relpath, status="failed")
    try:
        _rewrite(job, result)
    except Exception as exc:  # any failure of one file is reported, the others go on
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        result.status = "failed"
        result.environment = getattr(exc, "errno", None) in STOPS_THE_RUN
        text = " ".join(str(exc).split()) or type(exc).__name__
        named = text.startswith((str(job.src), str(job.dst)))
        result.reason = text if named else f"{job.src}: {text}"  # the path once
    result.seconds = time.perf_counter() - t0
    return result


def _rewrite(job: FileJob, result: FileResult) -> None:
    with _open_parquet(job.src, job.fs) as pf:
        before = file_layout(job.src, job.fs, meta=pf.metadata)
        result.before = result.after = LayoutStats.of(before)
        reason = (
            "forced" if job.force else file_needs_rewrite(before, job.target_bytes, job.compression)
        )
        if reason is None or _already_in_out(job, before):
            if job.in_place or job.dry_run:
                result.status, result.reason = "skipped", "already done"
            elif reason is None and _copied_already(job):
                result.status, result.reason = "skipped", "already copied to the output"
            elif _already_in_out(job, before):
                result.status, result.reason = "skipped", "already rewritten in the output"
            else:
                copy_file(job.src, job.dst, job.fs)
                result.status, result.reason = "copied", "already done at the source"
            return
        result.reason = reason
        if job.dry_run:
            result.status = "planned"
            return
        batch_rows = _batch_rows(before)
        starts, index_sorted = scan_runs(pf, batch_rows)
        ep_bytes = episode_byte_estimate(
            starts, before.num_rows, before.row_group_rows, before.row_group_bytes
        ) * plain_scale(pf, before, batch_rows)
        per_group = plan_row_groups(ep_bytes, job.target_bytes)
        bounds = np.append(starts, before.num_rows)[np.concatenate([[0], np.cumsum(per_group)])]
        group_rows = np.diff(bounds)
        codec = codec_name(before.compression) if job.compression == "keep" else job.compression
        marker = make_marker(job.target_bytes / MIB, codec)
        schema = pf.schema_arrow
        with atomic_path(job.dst) as tmp:
            source_sum = _stream_rewrite(
                pf, tmp, group_rows, codec, batch_rows, index_sorted, marker
            )
            after = verify_written(tmp, schema, before.num_rows, group_rows, source_sum, batch_rows)
        result.after = LayoutStats.of(after)
        result.after.file_size = Path(job.dst).stat().st_size
        result.status = "rewritten"
