"""The one way episodekit opens a parquet file: any fsspec root, footers shared, one error policy.

- **Opening**: :func:`open_data_file` takes a local path or a path in an fsspec filesystem (a
  hub, ``memory://``) and yields a :class:`DataFile`; the handle, and the file object under it
  for a remote file, are closed when the ``with`` block ends, whatever happens in it.
- **Footers read once**: :func:`read_footer` keeps the footers it read (per process, bounded by
  :data:`FOOTER_CACHE_BYTES` of serialized footer), keyed by the file's identity (size, mtime,
  inode for a local file; size for a remote one): a ``prepare`` that asks a file's footer for its
  skip test, its cost table and its layout check reads it once, and a rewritten file (a new
  inode) is read again.
- **One error policy** (:func:`parquet_errors`): a missing file is a
  :class:`~episodekit.core.errors.MissingFileError`; bytes that are not valid parquet (arrow's
  own errors) a :class:`~episodekit.core.errors.DatasetError`; an operating-system failure
  (permission, disk) goes through :func:`~episodekit.core.errors.os_problem`. Each names the
  file once. Reading batches or row groups of a :class:`DataFile` follows the same policy.

Whole small tables (``meta/`` files) come from :func:`read_table`; a remote one is read from its
bytes, never through a Python file object (pyarrow's IO threads can otherwise release a Python
buffer during interpreter shutdown and abort the process: apache/arrow#34314). A remote footer
is read by range: the file's last 16 KiB, and the rest of a longer footer, never a data page.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core.errors import DatasetError, MissingFileError, os_problem
from episodekit.core.paths import MIB
from episodekit.core.remote import open_ranged, read_range

FileMetaData = pq.FileMetaData  # a parquet footer, for type hints outside this layer
FOOTER_CACHE_BYTES = 4 * MIB  # serialized footers kept per process (parsed: ~5-10x that; was 64
# MiB: a v2.1 conversion of 7,000 one-episode files kept every footer, ~75 MB parsed)
FOOTER_GUESS = 16 * 1024  # a remote footer's first read: its tail, most footers whole
STREAM_BUFFER_TOTAL = 32 * MIB  # streaming reads: all column buffers together
UNREADABLE = "unreadable parquet"


def is_local(fs: fsspec.AbstractFileSystem | None) -> bool:
    """True when ``fs`` is the local disk (None counts as local): pyarrow then opens paths."""
    if fs is None:
        return True
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def parquet_problem(exc: BaseException, path: str, what: str = UNREADABLE) -> Exception:
    """Our error for ``exc``, met reading the parquet file ``path`` (see the module docstring);
    any other exception is returned as it is."""
    if isinstance(exc, DatasetError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return MissingFileError("file is missing", path)
    if isinstance(exc, (pa.ArrowInvalid, pa.ArrowNotImplementedError)):  # e.g. an unknown codec
        return DatasetError(f"{what} ({exc})", path)
    if isinstance(exc, OSError):
        if exc.errno is None:  # arrow's own errors: the bytes are not valid parquet
            return DatasetError(f"{what} ({exc})", path)
        return os_problem(exc, path, "read")
    return exc


@contextlib.contextmanager
def parquet_errors(path: str, what: str = UNREADABLE) -> Iterator[None]:
    """Turn what pyarrow and the filesystem raise while reading ``path`` into our errors."""
    try:
        yield
    except (OSError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise parquet_problem(exc, path, what) from exc


# --------------------------------------------------------------------------------------------
# Footers, read once


class _FooterCache:
    """Footers by file identity, least recently used dropped past a byte budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: OrderedDict[tuple, FileMetaData] = OrderedDict()
        self.held = 0
        self.lock = threading.Lock()
        self.reads = 0  # footers parsed from a file (what tests and benchmarks count)

    def get(self, key: tuple) -> FileMetaData | None:
        with self.lock:
            meta = self.entries.get(key)
            if meta is not None:
                self.entries.move_to_end(key)
            return meta

    def put(self, key: tuple, meta: FileMetaData) -> None:
        with self.lock:
            self.reads += 1
            if key in self.entries:
                return
            self.entries[key] = meta
            self.held += meta.serialized_size
            while self.held > self.budget and len(self.entries) > 1:
                _, old = self.entries.popitem(last=False)
                self.held -= old.serialized_size

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.held = 0


_FOOTERS = _FooterCache(FOOTER_CACHE_BYTES)


def footer_reads() -> int:
    """How many footers this process parsed from files so far (the cache's misses)."""
    return _FOOTERS.reads


def forget_footers() -> None:
    """Drop every cached footer (tests; a long-lived process that rewrote files elsewhere)."""
    _FOOTERS.clear()


def _identity(path: str, fs: fsspec.AbstractFileSystem | None) -> tuple:
    if is_local(fs):
        st = os.stat(path)
        return ("local", os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ino)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return (protocol, id(fs), path, int(fs.size(path)))


def read_footer(
    path: str, fs: fsspec.AbstractFileSystem | None = None, what: str = "unreadable parquet footer"
) -> FileMetaData:
    """The parquet footer of ``path`` (local, or a path in ``fs``), parsed once per process
    while the file stays the same (see the module docstring); ``what`` starts the message of
    the error a broken file raises."""
    with parquet_errors(path, what):
        key = _identity(path, fs)
        meta = _FOOTERS.get(key)
        if meta is not None:
            return meta
        if is_local(fs):
            meta = pq.read_metadata(path)
        else:
            meta = _remote_footer(fs, path, key[-1])
        _FOOTERS.put(key, meta)
        return meta


def _remote_footer(fs: fsspec.AbstractFileSystem, path: str, size: int) -> FileMetaData:
    """The footer of a remote parquet file of ``size`` bytes through range reads of its tail:
    :data:`FOOTER_GUESS` bytes first, the rest of a longer footer in a second read; no data page
    is read. A file whose tail is not a footer goes to pyarrow through an unbuffered handle, so
    its error is pyarrow's own (the same a local file gives)."""
    tail = read_range(fs, path, max(0, size - FOOTER_GUESS), size)
    n = int.from_bytes(tail[-8:-4], "little") if len(tail) >= 12 else -1
    if tail[-4:] != b"PAR1" or not 0 < n <= size - 12:
        with open_ranged(fs, path) as fh:
            return pq.read_metadata(fh)
    if n + 8 > len(tail):
        tail = read_range(fs, path, size - 8 - n, size - len(tail)) + tail
    footer = tail[len(tail) - 8 - n :]
    # The footer with the magic bytes before it: a whole parquet file to pyarrow's parser.
    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer))


def parse_footer(footer: bytes) -> FileMetaData:
    """pyarrow's reading of an encoded ``FileMetaData`` (the footer's bytes alone)."""
    tail = len(footer).to_bytes(4, "little") + b"PAR1"
    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer + tail))


# --------------------------------------------------------------------------------------------
# One open file


class DataFile:
    """An open parquet file: its footer, schema, batches and row groups; every read follows the
    error policy and names :attr:`path`. Made by :func:`open_data_file` (or :meth:`of` for a
    source opened elsewhere, e.g. a salvaged file's bytes); close it (``with``) when done."""

    def __init__(self, path: str, pf: pq.ParquetFile, closers: Sequence[Any] = ()) -> None:
        self.path = path
        self.parquet = pf  # the pyarrow handle, for the loaders' hot path
        self._closers = list(closers)

    @classmethod
    def of(cls, path: str, source: Any, metadata: FileMetaData | None = None, **opts) -> DataFile:
        """A DataFile over an already open ``source`` (a buffer, a file object) named ``path``."""
        with parquet_errors(path):
            return cls(path, pq.ParquetFile(source, metadata=metadata, **opts))

    @property
    def metadata(self) -> FileMetaData:
        return self.parquet.metadata

    @property
    def schema(self) -> pa.Schema:
        """The file's Arrow schema (with its key-value metadata)."""
        return self.parquet.schema_arrow

    @property
    def num_rows(self) -> int:
        return int(self.parquet.metadata.num_rows)

    @property
    def num_row_groups(self) -> int:
        return int(self.parquet.metadata.num_row_groups)

    def row_group_rows(self) -> np.ndarray:
        """Rows per row group (int64), from the footer."""
        md = self.parquet.metadata
        n = md.num_row_groups
        return np.fromiter((md.row_group(i).num_rows for i in range(n)), np.int64, n)

    def batches(
        self,
        batch_rows: int = 65536,
        columns: Sequence[str] | None = None,
        row_groups: Sequence[int] | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The rows in order, ``batch_rows`` at a time (only ``row_groups`` when given)."""
        it = self.parquet.iter_batches(
            batch_size=batch_rows,
            row_groups=row_groups,
            columns=list(columns) if columns is not None else None,
        )
        while True:
            with parquet_errors(self.path):
                batch = next(it, None)
            if batch is None:
                return
            yield batch

    def read_row_groups(
        self, groups: Sequence[int], columns: Sequence[str] | None = None, use_threads: bool = True
    ) -> pa.Table:
        """Row groups ``groups`` decoded as one table (``use_threads=False``: every read on the
        calling thread, for a source that is a Python file object)."""
        with parquet_errors(self.path):
            cols = list(columns) if columns is not None else None
            return self.parquet.read_row_groups(list(groups), columns=cols, use_threads=use_threads)

    def read_row_group(
        self, i: int, columns: Sequence[str] | None = None, use_threads: bool = True
    ) -> pa.Table:
        with parquet_errors(self.path):
            cols = list(columns) if columns is not None else None
            return self.parquet.read_row_group(i, columns=cols, use_threads=use_threads)

    def read(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The whole file (or ``columns`` of it) as one table."""
        with parquet_errors(self.path):
            return self.parquet.read(columns=list(columns) if columns is not None else None)

    def close(self) -> None:
        """Close the handle and what it was opened on (idempotent)."""
        closers, self._closers = self._closers, []
        try:
            self.parquet.close()
        finally:
            for c in closers:
                c.close()

    def __enter__(self) -> DataFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream_buffer(num_columns: int) -> int:
    """Buffer of each column stream when a file is streamed without pre-buffering: a fixed total
    shared between the column chunks (bigger buffers read faster, their sum bounds memory on
    giant row groups)."""
    return int(np.clip(STREAM_BUFFER_TOTAL // max(1, num_columns), MIB, 8 * MIB))


def open_data_file(
    path: str,
    fs: fsspec.AbstractFileSystem | None = None,
    *,
    stream: bool = False,
    shared_footer: bool = True,
    buffer: int | None = None,
) -> DataFile:
    """Open ``path`` (local, or a path in ``fs``). ``stream``: no pre-buffering, each column
    read through a bounded buffer (memory stays bounded on giant row groups; see
    :func:`stream_buffer`; ``buffer``: that many bytes a column instead). ``shared_footer``:
    take the footer from :func:`read_footer` (False: this handle parses its own, for a caller
    that budgets footer memory itself)."""
    meta = read_footer(path, fs) if shared_footer else None
    fh = None
    with parquet_errors(path):
        try:
            source = path if is_local(fs) else fs.open(path, "rb")
            fh = None if is_local(fs) else source
            opts: dict[str, Any] = {}
            if stream:
                size = buffer or (stream_buffer(meta.num_columns) if meta is not None else MIB)
                opts = {"pre_buffer": False, "buffer_size": int(size)}
            pf = pq.ParquetFile(source, metadata=meta, **opts)
            if (
                stream
                and not buffer
                and meta is None
                and stream_buffer(pf.metadata.num_columns) != MIB
            ):
                meta = pf.metadata  # its own footer, parsed: reopen with the buffer it asks
                pf.close()
                opts["buffer_size"] = stream_buffer(meta.num_columns)
                pf = pq.ParquetFile(source, metadata=meta, **opts)
        except BaseException:
            if fh is not None:
                fh.close()
            raise
    return DataFile(path, pf, [fh] if fh is not None else [])


# --------------------------------------------------------------------------------------------
# Whole tables and schemas


def arrow_buffer(data: bytes) -> pa.Buffer:
    """``data`` copied into arrow-owned memory, so no arrow thread ever holds a Python object
    (see the module docstring)."""
    buf = pa.allocate_buffer(len(data))
    np.frombuffer(buf, dtype=np.uint8)[:] = np.frombuffer(data, dtype=np.uint8)
    return buf


def schema_from_bytes(data: bytes) -> pa.Schema:
    """The Arrow schema of a parquet file held in memory."""
    return pq.read_schema(pa.BufferReader(data))


def table_from_bytes(data: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """A parquet file's table from its bytes (in arrow-owned memory: :func:`arrow_buffer`)."""
    reader = pa.BufferReader(arrow_buffer(data))
    return pq.read_table(reader, columns=list(columns) if columns else columns)


def read_table(
    fs: fsspec.AbstractFileSystem | None, path: str, columns: Sequence[str] | None = None
) -> pa.Table:
    """A whole parquet file (or ``columns`` of it): a local one by path, a remote one from its
    bytes."""
    cols = list(columns) if columns is not None else None
    with parquet_errors(path):
        if is_local(fs):
            return pq.read_table(path, columns=cols)
        with fs.open(path, "rb") as fh:
            data = fh.read()
        return table_from_bytes(data, columns=cols)


def read_schema(fs: fsspec.AbstractFileSystem | None, path: str) -> pa.Schema:
    """The Arrow schema of a parquet file (from its footer, shared: :func:`read_footer`)."""
    meta = read_footer(path, fs, UNREADABLE)
    with parquet_errors(path):
        return meta.schema.to_arrow_schema()


def local_batches(
    path: str | os.PathLike, batch_rows: int, columns: Sequence[str] | None = None
) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """A local parquet file's Arrow schema and its rows in batches of ``batch_rows`` (one
    thread): memory bounded by a batch, not the file (a file this process wrote itself)."""
    pf = pq.ParquetFile(path)

    def batches() -> Iterator[pa.RecordBatch]:
        with pf:
            cols = list(columns) if columns is not None else None
            yield from pf.iter_batches(batch_rows, columns=cols, use_threads=False)

    return pf.schema_arrow, batches()
