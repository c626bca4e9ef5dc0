"""The one way episodekit writes parquet: data files in planned row groups, and small tables.

:class:`RowGroupWriter` writes a data file as a plan of row groups (rows per group, from the band
rule of :mod:`episodekit.core.band`): batches of any size go in, the rows are cut at the plan's
boundaries (the one loop that does it), each group is written by one call (pyarrow starts a new
row group at every call and sizes groups by rows only), with statistics, the page index, the
dictionary only on low-cardinality columns, ``sorting_columns`` when ``index`` is known to be
ascending, and the layout marker (:data:`~episodekit.core.band.MARKER_KEY`) once the plan is
complete. :func:`verify_written` streams a written file back and compares it with its source
(rows, schema and its metadata, row groups, per-column checksums) before anything replaces an
original. :func:`write_table` writes a whole small table (``meta/`` files, artifacts).

Paths are local; callers write to a temporary name and publish with ``os.replace``
(:mod:`episodekit.core.atomic`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core.band import MARKER_KEY
from episodekit.core.checksum import TableChecksum
from episodekit.core.footer import FileLayout, file_layout
from episodekit.core.parquet_read import DataFile, open_data_file

DICTIONARY_COLUMNS = ("episode_index", "task_index")  # low cardinality; others stay plain


class RowGroupPlanError(Exception):
    """The rows written do not fill the planned row groups exactly."""


class VerificationError(Exception):
    """A written file differs from its source."""


@dataclass(frozen=True)
class Encoding:
    """How a data file is encoded. The default is the rewrite's (targeted dictionaries, page
    index); ``Encoding(dictionary=True, page_index=False)`` is pyarrow's own default, what
    LeRobot's writers produce."""

    compression: str = "snappy"
    dictionary: bool | tuple[str, ...] = DICTIONARY_COLUMNS
    page_index: bool = True
    sorted_index: bool = False  # declare ``index`` ascending (only when it is)


LEROBOT_ENCODING = Encoding(dictionary=True, page_index=False)  # pyarrow's default, LeRobot's


def _parquet_writer(path: Any, schema: pa.Schema, enc: Encoding) -> pq.ParquetWriter:
    dictionary = (
        enc.dictionary
        if isinstance(enc.dictionary, bool)
        else [c for c in enc.dictionary if c in schema.names]
    )
    sorting = None
    if enc.sorted_index:
        sorting = pq.SortingColumn.from_ordering(schema, [("index", "ascending")])
    return pq.ParquetWriter(
        path,
        schema,
        compression=enc.compression,
        use_dictionary=dictionary,
        write_statistics=True,
        write_page_index=enc.page_index,
        sorting_columns=sorting,
        store_schema=True,
    )


class RowGroupWriter:
    """Write ``path`` as the row groups of ``group_rows`` (rows per group; None: the caller
    cuts the groups itself with :meth:`write_group`). ``on_group`` sees each group's table just
    before it is written (checksums). :meth:`finish` checks the plan is complete, records
    ``marker`` under :data:`~episodekit.core.band.MARKER_KEY` and closes; leaving the ``with``
    block on an error closes the file without either (the caller discards it)."""

    def __init__(
        self,
        path: str | os.PathLike,
        schema: pa.Schema,
        group_rows: Sequence[int] | np.ndarray | None = None,
        encoding: Encoding = Encoding(),
        marker: str | None = None,
        on_group: Callable[[pa.Table], None] | None = None,
    ) -> None:
        self.path = str(path)
        self.schema = schema
        self.group_rows = None if group_rows is None else np.asarray(group_rows, dtype=np.int64)
        self.marker = marker
        self.on_group = on_group
        self.groups_written = 0
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._writer = _parquet_writer(path, schema, encoding)

    def write(self, batch: pa.RecordBatch) -> None:
        """Rows in order: cut at the plan's boundaries, each full group written at once."""
        if self.group_rows is None:
            raise RowGroupPlanError("write() needs planned group_rows; use write_group()")
        off, n = 0, batch.num_rows
        while off < n:
            g = self.groups_written
            if g >= len(self.group_rows):
                raise RowGroupPlanError(f"more rows than the {len(self.group_rows)} planned groups")
            take = min(int(self.group_rows[g]) - self._pending_rows, n - off)
            self._pending.append(batch.slice(off, take))
            self._pending_rows += take
            off += take
            if self._pending_rows == self.group_rows[g]:
                self.write_group(self._pending)
                self._pending, self._pending_rows = [], 0

    def write_group(self, rows: pa.Table | Sequence[pa.RecordBatch]) -> None:
        """Write exactly these rows as one row group."""
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches(rows, self.schema)
        if self.on_group is not None:
            self.on_group(table)
        self._put(table)
        self.groups_written += 1

    def _put(self, table: pa.Table) -> None:
        """The one call that writes a row group (pyarrow starts a group per call)."""
        self._writer.write_table(table, row_group_size=max(1, table.num_rows))

    def finish(self) -> None:
        """Check the plan was filled exactly, record the marker, close the file."""
        if self.group_rows is not None and (
            self._pending_rows or self.groups_written != len(self.group_rows)
        ):
            raise RowGroupPlanError(
                f"the rows end inside planned row group {self.groups_written} "
                f"of {len(self.group_rows)}"
            )
        if self.marker is not None:
            self._writer.add_key_value_metadata({MARKER_KEY: self.marker})
        self._writer.close()

    def __enter__(self) -> RowGroupWriter:
        return self

    def __exit__(self, exc_type, *rest: object) -> None:
        if exc_type is not None or self._writer.is_open:
            self._writer.close()


def plain_scale(df: DataFile, layout: FileLayout, batch_rows: int) -> float:
    """Ratio of the rows' arrow (~ plain-encoded) size to the source footer's uncompressed size.

    The footer's sizes reflect the source's encodings (dictionary pages on float columns inflate
    them), while :class:`RowGroupWriter` writes plain except for :data:`DICTIONARY_COLUMNS`;
    scaling the footer sizes by this ratio, measured on the first rows, makes the output groups
    land near the target. Reads one batch.
    """
    total = float(layout.row_group_bytes.sum())
    if total <= 0 or layout.num_rows == 0:
        return 1.0
    for batch in df.batches(min(batch_rows, 8192)):
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


def verify_written(
    path: str,
    schema: pa.Schema,
    group_rows: np.ndarray,
    expected: TableChecksum,
    batch_rows: int,
) -> FileLayout:
    """Stream the written ``path`` back and compare it with its source: row count, schema (with
    its metadata), row groups as planned, per-column checksums. Raise
    :class:`VerificationError` on any difference; return the written file's layout."""
    num_rows = int(np.sum(group_rows))
    with open_data_file(path, stream=True, shared_footer=False) as df:
        meta = df.metadata
        if meta.num_rows != num_rows:
            raise VerificationError(f"row count {meta.num_rows} != source {num_rows}")
        if not df.schema.equals(schema, check_metadata=True):
            raise VerificationError("schema or schema metadata differs from the source")
        if not np.array_equal(df.row_group_rows(), group_rows):
            raise VerificationError("row groups differ from the plan")
        written = TableChecksum()
        for batch in df.batches(batch_rows):
            written.update(batch)
        if written.num_rows != expected.num_rows:
            raise VerificationError(f"read back {written.num_rows} rows, wrote {num_rows}")
        got, want = written.digests(), expected.digests()
        bad = sorted(c for c in set(got) | set(want) if got.get(c) != want.get(c))
        if bad:
            raise VerificationError(f"values differ from the source in columns {bad}")
        return file_layout(path, meta=meta)


def plain_writer(path: Any, schema: pa.Schema, compression: str = "snappy") -> pq.ParquetWriter:
    """A streaming parquet writer in pyarrow's default encoding (a row group per
    ``write_table``): for files written a part at a time (the import's ``meta/episodes``)."""
    return pq.ParquetWriter(path, schema, compression=compression)


def write_table(
    table: pa.Table,
    where: Any,
    compression: str = "snappy",
    row_group_rows: int | None = None,
) -> None:
    """A whole table as one parquet file (``where``: a local path or a writable file object),
    in pyarrow's default encoding (``row_group_rows``: at most that many rows per group)."""
    pq.write_table(table, where, compression=compression, row_group_size=row_group_rows)
