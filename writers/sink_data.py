"""The episode sink's data files: rows in, episode by episode, ``data/chunk-XXX/file-YYY.parquet``
out (:class:`DataFiles`, used by :class:`~episodekit.writers.sink.EpisodeSink`, by the sample
writer, :mod:`episodekit.sample.writer`, and by the surgery writer, :mod:`episodekit.writers.data`).

A new file starts when LeRobot's roll-over rule says
(:func:`~episodekit.core.layout.files.roll_over` on each episode's size: its Arrow bytes, or the
caller's estimate). How a file is cut into row groups and encoded is a :class:`DataPolicy`, one
of four layouts:

- ``target``: groups of about ``target_mb`` of rows, written as they fill, targeted dictionaries
  and the page index (the import's: what a streaming reader wants);
- ``episode``: one group per episode, pyarrow's default encoding (what LeRobot's recorder writes:
  one ``write_table`` per episode);
- ``file``: one group per file, pyarrow's default encoding (what LeRobot's editing tools write,
  through pandas); the file's rows are held until it closes;
- ``planned``: the row groups of a plan (rows per group, from the band rule: the surgery writer's,
  :mod:`episodekit.writers.plan`), the caller's file numbers instead of the roll-over: each file is
  started by :meth:`DataFiles.open_file` (its number, first ``index``, group sizes) and its rows
  streamed in batches of any size by :meth:`DataFiles.write`; ``marker`` is recorded in its footer
  once the plan is filled (the encoding: the source's compression, a sorted ``index``).

With ``verify`` each group's rows are checksummed as written (:class:`~episodekit.core.checksum.
TableChecksum`) and :meth:`DataFiles.verify` reads a closed file back against them; ``on_group``
sees each group's rows too (the surgery writer's own checksums and streamed stats).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.checksum import TableChecksum
from episodekit.core.layout.files import chunk_file, file_path, roll_over
from episodekit.core.layout.rules import DATA_PATH_V3
from episodekit.core.parquet_read import open_data_file
from episodekit.core.parquet_write import (
    LEROBOT_ENCODING,
    Encoding,
    RowGroupWriter,
    VerificationError,
)
from episodekit.core.paths import MIB

ROW_GROUPS = ("target", "episode", "file", "planned")
# Rows a data file is read back in: a 100 MB file's check peaked ~150 MiB above the import
# in 64K-row batches, ~70 at 8K (the checksums do not depend on the batches).
VERIFY_BATCH_ROWS = 8192
# Each column's read buffer then (the default shares 32 MiB between the columns: an import's
# checkpoint read-back, with the cameras alive, held ~26 MiB of them), and Arrow's pool given
# back to the OS after each batch: the read-back's peak ~25 MiB above the import, not ~50.
VERIFY_BUFFER = MIB


@dataclass(frozen=True)
class DataPolicy:
    """How data files are laid out (see the module docstring): ``row_groups`` (``target``,
    ``episode``, ``file`` or ``planned``), ``encoding``, ``target_mb`` (``target`` only),
    ``verify`` and ``marker`` (the layout marker a file's footer records once filled)."""

    row_groups: str = "target"
    encoding: Encoding = Encoding()
    target_mb: float = 32.0
    verify: bool = True
    marker: str | None = None

    def __post_init__(self) -> None:
        if self.row_groups not in ROW_GROUPS:
            raise ValueError(f"row_groups must be one of {ROW_GROUPS}, got {self.row_groups!r}")


RECORDER = DataPolicy("episode", LEROBOT_ENCODING, verify=False)  # LeRobot's recorder
EDITOR = DataPolicy("file", LEROBOT_ENCODING, verify=False)  # LeRobot's editing tools


class DataFiles:
    """Episodes' rows (in ``index`` order, ``schema``) as data files in ``folder``: a file rolls
    over at ``data_mb`` (LeRobot's rule), ``chunks_size`` files a chunk, row groups and encoding
    by ``policy``; ``on_group`` sees each row group's rows as it is written."""

    def __init__(
        self,
        folder: str | Path,
        schema: pa.Schema,
        chunks_size: int = 1000,
        data_mb: float = 100.0,
        policy: DataPolicy = DataPolicy(),
        on_group: Callable[[pa.Table], None] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self.schema = schema
        self.chunks_size = chunks_size
        self.limit = data_mb * MIB
        self.policy = policy
        self.on_group = on_group
        self.rows = 0  # rows added so far (the next row's ``index``)
        self.file_no = -1
        self.checksums: dict[str, Any] = {}  # rel -> TableChecksum (or Digests: resumed)
        self.file_rows: dict[str, tuple[int | None, int]] = {}  # rel -> (first index, rows)
        self._file_bytes = 0.0
        self._writer: RowGroupWriter | None = None
        self._rel: str | None = None  # the caller's path of the current file (open_file)
        self._opened_at = 0  # ``rows`` when the current file was opened
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0

    @property
    def is_open(self) -> bool:
        """Whether a file is open (rows were added since the last :meth:`close`)."""
        return self._writer is not None

    def rel(self) -> str:
        """The current (or last) file's path relative to the folder."""
        if self._rel is not None:
            return self._rel
        return file_path(DATA_PATH_V3, *chunk_file(self.file_no, self.chunks_size))

    def rolls_over(self, size: float) -> bool:
        """Whether an episode of ``size`` bytes starts a new file (always when none is open)."""
        return self._writer is None or bool(
            roll_over(np.array([self._file_bytes, size]), self.limit)[1]
        )

    def add(self, table: pa.Table, size: float | None = None) -> int:
        """One episode's rows (``size``: its bytes for the roll-over, default its Arrow
        bytes) to the current file or a new one; the file number it went to."""
        size = float(table.nbytes) if size is None else float(size)
        return int(self.add_episodes(table, [table.num_rows], [size])[0])

    def add_episodes(
        self, table: pa.Table, lengths: Sequence[int] | np.ndarray, sizes: Any = None
    ) -> np.ndarray:
        """Consecutive episodes' rows at once (``lengths`` rows each, ``sizes`` their bytes
        for the roll-over, default their Arrow bytes), each where :meth:`add` would put it; the
        file number of each. With ``file`` row groups the episodes that land in one file are
        kept as one slice of ``table``: a file of the caller's one table is written without a
        copy (a file made of several tables is copied into one: the same bytes)."""
        if self.policy.row_groups == "planned":
            raise ValueError("planned row groups: open_file() then write()")
        lengths = np.asarray(lengths, dtype=np.int64)
        files = np.empty(len(lengths), dtype=np.int64)
        whole = self.policy.row_groups == "file"
        start, run = 0, 0  # ``file``: the rows of ``table`` not handed on yet start at ``run``
        for i, n in enumerate(lengths.tolist()):
            rows = table.slice(start, n)
            size = float(rows.nbytes if sizes is None else sizes[i])
            if self.rolls_over(size):
                if whole and start > run:
                    self._pending.append(table.slice(run, start - run))
                run = start
                self.close()
                self._open()
            self._file_bytes += size
            self.rows += n
            files[i] = self.file_no
            start += n
            if self.policy.row_groups == "episode":
                self._write([rows])
            elif self.policy.row_groups == "target":
                self._pending.append(rows)
                self._pending_bytes += rows.nbytes
                if self._pending_bytes >= self.target:
                    self._flush()
        if whole and start > run:
            self._pending.append(table.slice(run, start - run))
        return files

    @property
    def target(self) -> float:
        """Bytes of rows a ``target`` row group holds."""
        return self.policy.target_mb * MIB

    def open_file(
        self,
        file_no: int,
        first_index: int | None,
        group_rows: Sequence[int] | np.ndarray | None = None,
        rel: str | None = None,
    ) -> str:
        """Start the caller's data file ``file_no`` at ``rel`` (default: the layout's path of
        ``file_no``), any open file closed first; its path. ``planned``: ``group_rows`` rows
        each; ``episode``: a row group per :meth:`write`. ``first_index``: its first row's
        ``index``, the rows' ``index`` running on from it (None: the caller's own values,
        checked by :meth:`verify` through the digests only)."""
        planned = self.policy.row_groups == "planned"
        if self.policy.row_groups not in ("planned", "episode"):
            raise ValueError("open_file() is for planned or episode row groups")
        if planned == (group_rows is None):
            raise ValueError("group_rows are for planned row groups, and only for them")
        self.close()
        self.file_no = int(file_no) - 1
        self.rows = 0 if first_index is None else int(first_index)
        self._open(group_rows, rel, known_index=first_index is not None)
        return self.rel()

    def write(self, rows: pa.RecordBatch | pa.Table) -> None:
        """Rows of the file :meth:`open_file` started, in order: ``planned``, in batches of any
        size, cut at the plan's boundaries (each group written as it fills); ``episode``, each
        call's rows one row group (an episode's, as LeRobot's recorder writes)."""
        assert self._writer is not None, "open_file() first"
        if self.policy.row_groups == "planned":
            self._writer.write(rows)
        else:
            self._write([rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])])
        self.rows += rows.num_rows

    def _open(
        self,
        group_rows: Sequence[int] | np.ndarray | None = None,
        rel: str | None = None,
        known_index: bool = True,
    ) -> None:
        self.file_no += 1
        self._rel = rel
        rel = self.rel()
        (self.folder / rel).parent.mkdir(parents=True, exist_ok=True)
        hooks = [self.on_group] if self.on_group is not None else []
        if self.policy.verify:
            hooks.insert(0, self.checksums.setdefault(rel, TableChecksum()).update)
        self.file_rows[rel] = (self.rows if known_index else None, 0)
        self._opened_at = self.rows
        self._writer = RowGroupWriter(
            self.folder / rel,
            self.schema,
            group_rows,
            self.policy.encoding,
            self.policy.marker,
            hooks[0] if len(hooks) == 1 else (_both(*hooks) if hooks else None),
        )
        self._file_bytes = 0.0

    def _write(self, tables: list[pa.Table]) -> None:
        """These rows as one row group of the current file."""
        assert self._writer is not None
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()
        self._writer.write_group(table)  # one contiguous table: same bytes as a whole file's
        first, rows = self.file_rows[self.rel()]
        self.file_rows[self.rel()] = (first, rows + table.num_rows)

    def _flush(self) -> None:
        if self._pending and self._writer is not None:
            self._write(self._pending)
        self._pending, self._pending_bytes = [], 0

    def close(self) -> str | None:
        """Close the current file (its rows written); its path, or None when none was open."""
        if self._writer is None:
            return None
        self._flush()
        self._writer.finish()
        self._writer = None
        first = self.file_rows[self.rel()][0]
        self.file_rows[self.rel()] = (first, self.rows - self._opened_at)
        return self.rel()

    def abort(self) -> None:
        """Close an open file after an error, without its footer's marker (discarded)."""
        self._pending, self._pending_bytes = [], 0
        if self._writer is not None:
            try:
                self._writer.__exit__(RuntimeError, None, None)
            finally:
                self._writer = None

    def state(self) -> dict:
        """The closed files as a checkpoint keeps them (JSON): rel -> [first, rows, digests]."""
        return {rel: [*self.file_rows[rel], c.digests()] for rel, c in self.checksums.items()}

    def restore(self, file_no: int, rows: int, data: dict) -> None:
        """Carry on after a checkpoint's files (:meth:`state`), ``rows`` rows added so far."""
        self.file_no, self.rows = int(file_no), int(rows)
        for rel, (first, count, digests) in data.items():
            self.file_rows[rel] = (None if first is None else int(first), int(count))
            self.checksums[rel] = Digests(digests)

    def verify(self, rel: str) -> None:
        """Data file ``rel`` read back (:func:`read_back`): its schema, rows, ``index`` and
        column digests as written."""
        first, rows = self.file_rows[rel]
        want = self.checksums[rel].digests()
        read_back(self.folder, rel, self.schema, want, rows, first)


def read_back(
    folder: str | Path,
    rel: str,
    schema: pa.Schema,
    digests: dict[str, str],
    rows: int,
    first: int | None = None,
    check_metadata: bool = False,
    group_rows: Sequence[int] | np.ndarray | None = None,
    each: Callable[[pa.RecordBatch, int], None] | None = None,
) -> None:
    """Data file ``rel`` written under ``folder`` streamed back against what was written:
    its schema (with its metadata when ``check_metadata``), its row groups (``group_rows``,
    when given), ``rows`` rows, ``index`` ``first``, ``first + 1``, ... (None: only through the
    digests), ``each(batch, row)`` the caller's check of every batch (``row``: its first row's
    place in the file) and the digests of the columns ``digests`` names equal to them; raise
    :class:`VerificationError` naming the file and the first difference. Memory: batches of
    :data:`VERIFY_BATCH_ROWS` through :data:`VERIFY_BUFFER` per column, Arrow's pool given back
    after each one."""
    got, at = TableChecksum(), 0
    columns = [c for c in schema.names if c in digests]  # the others: checked otherwise
    pool = pa.default_memory_pool()
    path = str(Path(folder) / rel)
    with open_data_file(path, stream=True, shared_footer=False, buffer=VERIFY_BUFFER) as df:
        if group_rows is not None and not np.array_equal(df.row_group_rows(), group_rows):
            raise VerificationError(f"{rel}: row groups {df.row_group_rows().tolist()} differ")
        if not (
            df.schema.equals(schema, check_metadata=True)
            if check_metadata
            else df.schema.remove_metadata().equals(schema.remove_metadata())
        ):
            raise VerificationError(f"{rel}: schema differs from the one written")
        for batch in df.batches(VERIFY_BATCH_ROWS):
            n = batch.num_rows
            if first is not None:
                idx = batch.column("index").to_numpy()
                if not np.array_equal(idx, np.arange(first + at, first + at + n)):
                    raise VerificationError(f"{rel}: index is not {first + at}.. in order")
                idx = None
            if each is not None:
                each(batch, at)
            got.update(batch if len(columns) == batch.num_columns else batch.select(columns))
            at += n
            batch = None
            pool.release_unused()  # else mimalloc keeps each batch's pages
    if at != rows:
        raise VerificationError(f"{rel}: {at} rows, {rows} were written")
    found = got.digests()
    bad = sorted(c for c in set(found) | set(digests) if found.get(c) != digests.get(c))
    if bad:
        raise VerificationError(f"{rel}: values differ from those written in columns {bad}")


def _both(a: Callable[[pa.Table], None], b: Callable[[pa.Table], None]) -> Callable:
    def hook(table: pa.Table) -> None:
        a(table)
        b(table)

    return hook


@dataclass(frozen=True)
class Digests:
    """A kept data file's column digests, as its checkpoint recorded them."""

    recorded: dict[str, str]

    def digests(self) -> dict[str, str]:
        """The recorded digests (a copy)."""
        return dict(self.recorded)
