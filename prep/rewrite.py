"""Rewrite one data parquet file into episode-aligned row groups, verified, crash-safe.

One call handles one file (the unit of parallelism): read the footer, decide whether the file is
already done, find the episode runs (one streamed read of ``episode_index``), plan the row groups,
stream the rows into a temporary sibling while checksumming them, stream the temporary back and
compare row count, schema (with its metadata) and per-column checksums, then ``os.replace``
(the reading, writing and verifying are :mod:`episodekit.core.parquet_read` and
:mod:`episodekit.core.parquet_write`). Any
error or mismatch leaves the original untouched and is returned as a ``failed`` result naming the
file, never raised, so the other files complete.
"""

from __future__ import annotations

import errno
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa

from episodekit.core import interrupt
from episodekit.core.atomic import atomic_path
from episodekit.core.band import (
    codec_name,
    episode_byte_estimate,
    file_needs_rewrite,
    make_marker,
    plan_row_groups,
    read_marker,
)
from episodekit.core.checksum import TableChecksum
from episodekit.core.errors import DatasetError, EnvironmentProblem
from episodekit.core.footer import FileLayout, file_layout
from episodekit.core.parquet_read import DataFile, open_data_file
from episodekit.core.parquet_write import (
    Encoding,
    RowGroupPlanError,
    RowGroupWriter,
    VerificationError,
    plain_scale,
    verify_written,
)
from episodekit.core.paths import MIB

# Write failures that no other file escapes (read-only, permission, disk full): the run stops
# with exit 2 instead of reporting every file as failed; other errors (EIO...) fail one file.
STOPS_THE_RUN = {errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT}
STATUSES = ("rewritten", "skipped", "copied", "planned", "failed")


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


def scan_runs(df: DataFile, batch_rows: int) -> tuple[np.ndarray, bool]:
    """First row of every run of equal ``episode_index``, and whether ``index`` never decreases.

    Streams just those two columns (a few bytes per row) before the rewrite: the plan needs the
    episode boundaries, and ``sorting_columns`` may be declared only if the order really holds.
    """
    names = df.schema.names
    if "episode_index" not in names:
        raise ValueError("no episode_index column")
    has_index = "index" in names and pa.types.is_integer(df.schema.field("index").type)
    columns = ["episode_index", "index"] if has_index else ["episode_index"]
    starts = [np.zeros(1, dtype=np.int64)]
    offset, last_ep, last_idx, index_sorted = 0, None, None, has_index
    for batch in df.batches(batch_rows, columns):
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


def _stream_rewrite(
    df: DataFile,
    tmp: Path,
    group_rows: np.ndarray,
    encoding: Encoding,
    batch_rows: int,
    marker: str,
) -> TableChecksum:
    """Stream ``df`` into ``tmp`` as row groups of ``group_rows`` rows; checksum the source."""
    source_sum = TableChecksum()
    with RowGroupWriter(tmp, df.schema, group_rows, encoding, marker) as writer:
        try:
            for batch in df.batches(batch_rows):
                source_sum.update(batch)
                writer.write(batch)
            writer.finish()
        except RowGroupPlanError as exc:
            raise VerificationError(f"source rows do not fit the plan: {exc}") from exc
    return source_sum


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
    with open_data_file(job.src, job.fs, stream=True) as df:
        before = file_layout(job.src, job.fs, meta=df.metadata)
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
        batch_rows = before.batch_rows()
        starts, index_sorted = scan_runs(df, batch_rows)
        ep_bytes = episode_byte_estimate(
            starts, before.num_rows, before.row_group_rows, before.row_group_bytes
        ) * plain_scale(df, before, batch_rows)
        per_group = plan_row_groups(ep_bytes, job.target_bytes)
        bounds = np.append(starts, before.num_rows)[np.concatenate([[0], np.cumsum(per_group)])]
        group_rows = np.diff(bounds)
        codec = codec_name(before.compression) if job.compression == "keep" else job.compression
        marker = make_marker(job.target_bytes / MIB, codec)
        encoding = Encoding(compression=codec, sorted_index=index_sorted)
        with atomic_path(job.dst) as tmp:
            source_sum = _stream_rewrite(df, tmp, group_rows, encoding, batch_rows, marker)
            after = verify_written(str(tmp), df.schema, group_rows, source_sum, batch_rows)
        result.after = LayoutStats.of(after)
        result.after.file_size = Path(job.dst).stat().st_size
        result.status = "rewritten"
