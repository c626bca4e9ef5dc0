"""A parquet file's row groups read a window at a time, each window under a footer that lists only
its own row groups: memory is that of one window, however many row groups the file has.

A recording LeRobot's recorder left has one row group per episode, and pyarrow's parsed footer
costs ~5 KB per row group of 7 columns (~60 KB for the 79 columns of a ``meta/episodes`` file),
held as long as the file is open: 100,000 episodes would take GBs for footers alone. Where the
encoded ``RowGroup`` structs are known without parsing the footer (a salvaged file's:
:mod:`episodekit.core.parquet_salvage`; a footer we wrote), :class:`RowGroupWindows` encodes a
footer of a few of them (Thrift's compact protocol, :mod:`episodekit.core.thrift_compact`),
has pyarrow parse that, and reads those row groups from the file in place (their column chunks
sit at the absolute offsets the structs name, wherever the file's own footer is, or whether it
has one).

Windows are consecutive row groups of about ``rows`` rows, and never more than ``chunks``
column chunks (what pyarrow's parsed footer costs), a single row group at least.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from episodekit.core import thrift_compact as tc
from episodekit.core.parquet_read import DataFile, FileMetaData, parquet_errors, parse_footer

FOOTER_FIELDS = (1, 2, 5, 6, 7)  # version, schema, key-value metadata, created_by, column orders
WINDOW_ROWS = 64 * 1024  # rows of a window (about: whole row groups)
WINDOW_CHUNKS = 4 * 1024  # column chunks of a window at most (~3 MB of pyarrow's parsed footer)


def encode_footer(template: tc.Struct, groups: Sequence[bytes], num_rows: int) -> bytes:
    """The encoded ``FileMetaData`` listing the encoded ``RowGroup`` structs ``groups`` (of
    ``num_rows`` rows together) under ``template``'s schema, key-value metadata, created_by
    and column orders."""
    meta = {k: v for k, v in template.items() if k in FOOTER_FIELDS}
    meta[3] = tc.i64(num_rows)
    meta[4] = tc.list_of(tc.STRUCT, [tc.Raw(g) for g in groups])
    return tc.encode(meta)


@dataclass
class RowGroupWindows:
    """The row groups of the parquet file at ``path``, known by their encoded ``RowGroup``
    structs (``groups``, in file order) and rows (``rows``), under ``template``'s schema."""

    path: str
    template: tc.Struct
    groups: Sequence[bytes]
    rows: np.ndarray

    @property
    def num_row_groups(self) -> int:
        return len(self.groups)

    @property
    def num_rows(self) -> int:
        return int(np.sum(self.rows))

    @property
    def num_columns(self) -> int:
        schema = tc.get(self.template, 2, (tc.STRUCT, []))[1]
        return max(1, sum(1 for e in schema if tc.get(e, 5) is None))  # leaves: no children

    def windows(self, rows: int = WINDOW_ROWS, chunks: int | None = None) -> list[range]:
        """Consecutive row groups, about ``rows`` rows and at most ``chunks`` column chunks a
        window (default :data:`WINDOW_CHUNKS`; one row group at least), covering every row
        group once."""
        chunks = WINDOW_CHUNKS if chunks is None else chunks
        most = max(1, chunks // self.num_columns)
        out: list[range] = []
        start, total = 0, 0
        for i, n in enumerate(self.rows.tolist()):
            total += n
            if total >= rows or i + 1 - start >= most or i == len(self.groups) - 1:
                out.append(range(start, i + 1))
                start, total = i + 1, 0
        return out

    def metadata(self, window: range) -> FileMetaData:
        """The footer of the row groups of ``window`` alone, as pyarrow parses it."""
        groups = [self.groups[i] for i in window]
        rows = int(np.sum(self.rows[window.start : window.stop]))
        with parquet_errors(self.path):
            return parse_footer(encode_footer(self.template, groups, rows))

    def open(self, window: range) -> DataFile:
        """The file under the footer of ``window``'s row groups (its row group ``i`` is the
        file's ``window[i]``); close it (``with``) when done."""
        return DataFile.of(self.path, self.path, self.metadata(window), pre_buffer=True)

    @property
    def schema(self) -> pa.Schema:
        """The file's Arrow schema (with its key-value metadata)."""
        with parquet_errors(self.path):
            return self.metadata(range(0)).schema.to_arrow_schema()

    def read(self, window: range, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows of the row groups of ``window`` (only ``columns``) as one table."""
        if not len(window):
            empty = self.schema.empty_table()
            return empty if columns is None else empty.select(list(columns))
        with self.open(window) as pf:
            return pf.read(columns)

    def tables(
        self,
        columns: Sequence[str] | None = None,
        rows: int = WINDOW_ROWS,
        chunks: int | None = None,
    ) -> Iterator[pa.Table]:
        """Every row in order, one table per window (:meth:`windows`)."""
        for window in self.windows(rows, chunks):
            yield self.read(window, columns)

    def read_all(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole file (or ``columns`` of it) as one table, read a window at a time."""
        parts = list(self.tables(columns))
        if not parts:
            return self.read(range(0), columns)
        return pa.concat_tables(parts)

    def read_combined(self, columns_a_pass: int = 16) -> pa.Table:
        """The whole file as one table of one chunk a column, read ``columns_a_pass`` columns
        at a time (a pass over the windows each), each pass's windows combined and let go
        before the next: the windows' chunks of all the columns are never held with the
        combined columns (their buffers lie interleaved in the pool's pages, which a column
        freed alone does not give back: ~80 MB at 100,000 rows of a ``meta/episodes`` file)."""
        names = self.schema.names
        columns: list[pa.ChunkedArray] = []
        schema = None
        for k in range(0, max(len(names), 1), columns_a_pass):
            part = self.read_all(names[k : k + columns_a_pass]).combine_chunks()
            columns += part.columns
            schema = part.schema if schema is None else schema
            del part
            pa.default_memory_pool().release_unused()
        full = self.read(range(0))  # the file's schema, with its metadata, as a read gives it
        return pa.Table.from_arrays(columns, schema=full.schema) if names else full


__all__ = ["RowGroupWindows", "encode_footer"]
