"""Recover a parquet file whose writer never closed it (no footer), or whose end was cut off:
every row group written whole comes back, bit for bit, under a new footer.

How: walk the page headers from the start (:mod:`episodekit.core.parquet_pages`), group the
pages into column chunks in schema order and the chunks into row groups (every chunk of a row
group holds the same number of rows: a flat column's data pages count them in ``num_values``,
a repeated column's in its repetition levels, a v2 page in ``num_rows``), then encode a
``FileMetaData`` (:mod:`episodekit.core.thrift_compact`) with those row groups and the schema,
key-value metadata (``ARROW:schema``, ``huggingface``) and writer name of a *template*: the
footer of a readable file of the same schema, or of an empty file pyarrow writes for an Arrow
schema (:func:`schema_template`). The repaired file is the original's bytes up to the end of
the last whole row group, then that footer: no value is decoded or re-encoded.

A row group cut off mid-write (inside a page header, inside a page, before its last column) is
dropped and its bytes counted. Column statistics are carried over from the page headers (merged
when a chunk has several pages), so readers keep pruning row groups on them.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from episodekit.core import thrift_compact as tc
from episodekit.core.parquet_footer import group_meta
from episodekit.core.parquet_groups import Group, Groups
from episodekit.core.parquet_pages import (
    DATA_PAGE,
    DICTIONARY_PAGE,
    END,
    MAGIC,
    Leaf,
    NotAPage,
    Page,
    PageReader,
    detect_codec,
    fits,
    leaves,
)
from episodekit.core.parquet_read import DataFile, FileMetaData
from episodekit.core.parquet_regular import RegularWalk
from episodekit.core.parquet_window import RowGroupWindows, encode_footer
from episodekit.core.parquet_write import LEROBOT_ENCODING, RowGroupWriter

MISFIT = "pages do not fit the schema's column types"


@dataclass
class Chunk:
    """One column chunk: its leaf, its pages (an optional dictionary page first), its rows."""

    leaf: Leaf
    pages: list[Page] = field(default_factory=list)
    rows: int = 0

    @property
    def start(self) -> int:
        return self.pages[0].start

    @property
    def end(self) -> int:
        return self.pages[-1].end


@dataclass
class RowGroup:
    chunks: list[Chunk]
    num_rows: int

    @property
    def start(self) -> int:
        return self.chunks[0].start

    @property
    def end(self) -> int:
        return self.chunks[-1].end


@dataclass
class Salvage:
    """What a walk found: the whole row groups (packed: :class:`~episodekit.core.
    parquet_groups.Groups`), where they end, and why the walk stopped."""

    size: int
    row_groups: Groups
    codec: int
    stop: str  # why no further row group was recovered (``END``: the file ended right there)
    structs: bool = True  # the row groups' encoded structs are held (False: :meth:`places`)

    def places(self) -> Salvage:
        """The same row groups without their encoded ``RowGroup`` structs (their places and
        rows only: what a report of the file needs, once its rows were read; ~10 KB a row
        group of a ``meta/episodes`` file). It can no longer be read or written."""
        return replace(self, row_groups=self.row_groups.places(), structs=False)

    @property
    def end(self) -> int:
        return self.row_groups.last_end() if self.row_groups else len(MAGIC)

    @property
    def num_rows(self) -> int:
        return int(self.row_groups.rows().sum())

    @property
    def dropped_bytes(self) -> int:
        """Bytes after the last whole row group (a group cut off, a broken footer)."""
        return self.size - self.end


class SalvageError(ValueError):
    """The file is not parquet at all, or its template does not fit it."""


def read_template(path: str | os.PathLike) -> tc.Struct:
    """The decoded footer of a readable parquet file (:class:`SalvageError` if it has none)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size < 12:
            raise SalvageError(f"{path}: too short for a parquet footer")
        fh.seek(size - 8)
        tail = fh.read(8)
        n = int.from_bytes(tail[:4], "little")
        if tail[4:] != MAGIC or n > size - 12:
            raise SalvageError(f"{path}: no parquet footer")
        fh.seek(size - 8 - n)
        try:
            meta, used = tc.decode(fh.read(n))
        except tc.ThriftError as exc:
            raise SalvageError(f"{path}: unreadable parquet footer ({exc})") from exc
    if used != n:
        raise SalvageError(f"{path}: unreadable parquet footer")
    return meta


def schema_template(schema: pa.Schema) -> tc.Struct:
    """The footer pyarrow writes for ``schema`` (schema elements, ``ARROW:schema`` and the
    schema's own metadata), from an empty file written in memory."""
    sink = io.BytesIO()
    with RowGroupWriter(sink, schema, encoding=LEROBOT_ENCODING) as w:
        w.finish()
    data = sink.getvalue()
    n = int.from_bytes(data[-8:-4], "little")
    return tc.decode(data, len(data) - 8 - n)[0]


def template_codec(template: tc.Struct) -> int | None:
    """The codec of a template's first column chunk, when it has row groups."""
    groups = tc.get(template, 4, (tc.STRUCT, []))[1]
    for g in groups:
        for cc in tc.get(g, 1, (tc.STRUCT, []))[1]:
            meta = tc.get(cc, 3)
            if meta is not None:
                return tc.get(meta, 4)
    return None


def scan(path: str | os.PathLike, template: tc.Struct, codec: int | None = None) -> Salvage:
    """Walk ``path``'s pages and group them into whole row groups of ``template``'s schema
    (``codec``: the compression, when known; else found from the first page)."""
    cols = leaves(template)
    if not cols:
        raise SalvageError("the template schema has no columns")
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        reader = PageReader(fd, size)
        if size < len(MAGIC) or bytes(reader.read(0, len(MAGIC))) != MAGIC:
            raise SalvageError(f"{path}: does not start with {MAGIC!r}: not a parquet file")
        groups = Groups()
        heads: dict = {}  # encoded column metadata heads, per column and page kinds
        pos, stop = len(MAGIC), END
        if codec is None:
            try:
                codec = detect_codec(reader, reader.page(pos))
            except NotAPage as exc:
                return Salvage(size, Groups(), 0, exc.reason)
        walk = RegularWalk(reader, cols, codec)
        regular = False  # the row group before was one of :func:`_regular_group`'s
        while True:
            found = _regular_group(walk, pos) if regular else None
            if found is None:
                try:  # the first row group's pages are checked against the template's types
                    group = _row_group(reader, pos, cols, codec, check=not groups)
                except NotAPage as exc:
                    stop = exc.reason
                    break
                regular = _is_regular(group)
                meta = group_meta(group, codec, heads)
                found = Group(group.start, group.end, group.num_rows, meta)
            groups.append(found)
            pos = found.end
        return Salvage(size, groups, codec, stop)
    finally:
        os.close(fd)


def _row_group(
    reader: PageReader, pos: int, cols: list[Leaf], codec: int, check: bool = False
) -> RowGroup:
    """The row group at ``pos`` (:class:`NotAPage` when there is no whole one); ``check``:
    every page must :func:`~episodekit.core.parquet_pages.fits` its column."""
    chunks, rows = _chunks(reader, pos, cols, None, codec, check)
    if rows is None:  # every chunk ended at the next one's dictionary page: count the first
        rows = sum(reader.rows(p, cols[0], codec) for p in chunks[0].pages if p.is_data)
    for c in chunks:
        c.rows = rows
    return RowGroup(chunks, rows)


def _is_regular(group: RowGroup) -> bool:
    """Whether every chunk of ``group`` is one dictionary page and one v1 data page, and a
    column is flat (LeRobot's recorder, and pyarrow's defaults for small row groups): the next
    group is then tried as :func:`_regular_group`."""
    return any(c.leaf.max_rep == 0 for c in group.chunks) and all(
        len(c.pages) == 2 and c.pages[0].kind == DICTIONARY_PAGE and c.pages[1].kind == DATA_PAGE
        for c in group.chunks
    )


def _regular_group(walk: RegularWalk, pos: int) -> Group | None:
    """The row group at ``pos`` when it is laid out as :func:`_is_regular` says, read page
    after page with no chunk boundary searched (:class:`~episodekit.core.parquet_regular.
    RegularWalk`). Such a group is exactly what :func:`_row_group` finds there (a chunk of one
    data page followed by a dictionary page ends there, whatever its column; its flat columns
    agree on the rows; the last chunk is followed by the next group's dictionary page or is
    flat and holds the rows). None for anything else, also a group cut off: :func:`_row_group`
    then decides, and says why."""
    found = walk.group(pos)
    return None if found is None else Group(pos, *found)


def _next_page(reader: PageReader, pos: int) -> Page | None:
    try:
        return reader.page(pos)
    except NotAPage:
        return None


def _chunks(
    reader: PageReader, pos: int, cols: list[Leaf], rows: int | None, codec: int, check: bool
) -> tuple[list[Chunk], int | None]:
    """The chunks of ``cols`` from ``pos`` and their rows (``rows``: when known already).

    A chunk is an optional dictionary page and data pages. It surely ends where a dictionary
    page follows (the next chunk's); elsewhere (a data page, the end, the old footer) its
    rows decide: equal to ``rows``, or, while unknown, tried after each data page against the
    remaining chunks. Repetition levels are decoded only there, so most files are grouped
    from their headers alone. :class:`NotAPage` when no whole set of chunks starts at ``pos``.
    """
    if not cols:
        return [], rows
    leaf, chunk = cols[0], Chunk(cols[0])
    page = reader.page(pos)
    if page.kind == DICTIONARY_PAGE:
        if check and not fits(page, leaf):
            raise NotAPage(MISFIT)
        chunk.pages.append(page)
        page = reader.page(page.end)
    counted = 0
    reason = "column chunks do not line up"
    while True:
        if not page.is_data:
            raise NotAPage(reason)
        if check and not fits(page, leaf):
            raise NotAPage(MISFIT)
        chunk.pages.append(page)
        nxt = _next_page(reader, page.end)
        if nxt is not None and nxt.kind == DICTIONARY_PAGE:  # the chunk ends here
            if leaf.max_rep == 0 or rows is None and len(cols) == 1:
                counted += reader.rows(page, leaf, codec)
                if rows is not None and counted != rows:
                    raise NotAPage(reason)
                rows = counted
            rest, rows = _chunks(reader, page.end, cols[1:], rows, codec, check)
            return [chunk, *rest], rows
        counted += reader.rows(page, leaf, codec)
        if rows is not None:
            if counted > rows:
                raise NotAPage(reason)
            if counted == rows:
                rest, _ = _chunks(reader, page.end, cols[1:], rows, codec, check)
                return [chunk, *rest], rows
        else:
            try:
                rest, _ = _chunks(reader, page.end, cols[1:], counted, codec, check)
                return [chunk, *rest], counted
            except NotAPage as exc:
                reason = exc.reason
        if nxt is None:
            page = reader.page(page.end)  # raises why there is no further page
        page = nxt


def footer(template: tc.Struct, salvage: Salvage) -> bytes:
    """The encoded ``FileMetaData`` for ``salvage``'s row groups under ``template``'s schema."""
    if not salvage.structs:
        raise ValueError("the row groups' structs were dropped (Salvage.places)")
    return encode_footer(template, list(salvage.row_groups.structs()), salvage.num_rows)


def footer_parts(template: tc.Struct, salvage: Salvage) -> Iterator[bytes]:
    """:func:`footer`'s bytes in parts: the head, each row group's struct, the tail (the
    whole footer of a recording of many episodes is never in memory at once: ~700 bytes a row
    group)."""
    if not salvage.structs:
        raise ValueError("the row groups' structs were dropped (Salvage.places)")
    one = encode_footer(template, [b""], salvage.num_rows)  # a list of one (empty) element
    at = _list_at(one)  # its header: one byte, where the list of every row group's goes
    yield one[:at] + bytes(_list_header(len(salvage.row_groups)))
    yield from salvage.row_groups.structs()
    yield one[at + 1 :]


def footer_matches(path: str | os.PathLike, salvage: Salvage, template: tc.Struct) -> bool:
    """Whether ``path`` is ``salvage``'s row groups' bytes followed by exactly the footer
    :func:`footer` makes (compared a part at a time: :func:`footer_parts`)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        if size < salvage.end + 8:
            return False
        fh.seek(size - 8)
        tail = fh.read(8)
        n = int.from_bytes(tail[:4], "little")
        if tail[4:] != MAGIC or salvage.end + n + 8 != size:
            return False
        fh.seek(salvage.end)
        for part in footer_parts(template, salvage):
            if fh.read(len(part)) != part:
                return False
        return fh.tell() == size - 8


def _list_header(n: int) -> bytearray:
    out = bytearray()
    tc.put_list(out, n, tc.STRUCT)
    return out


def _list_at(encoded_with_one_empty: bytes) -> int:
    """Where the row groups' list header (one element) stands in an encoded footer."""
    r = tc.Reader(encoded_with_one_empty)
    fid = 0
    while True:
        head = r.byte()
        if head == 0:
            raise ValueError("no row groups field")
        ttype, delta = head & 0x0F, head >> 4
        fid = fid + delta if delta else r.zigzag()
        if fid == 4:
            return r.pos
        if ttype not in (tc.BOOL_TRUE, tc.BOOL_FALSE):
            r.skip(ttype)


def group_rows(salvage: Salvage) -> np.ndarray:
    """Rows of each whole row group found (int64)."""
    return salvage.row_groups.rows()


def windows(path: str | os.PathLike, salvage: Salvage, template: tc.Struct) -> RowGroupWindows:
    """``path``'s whole row groups read a window at a time, each under a footer of its own
    (:mod:`episodekit.core.parquet_window`): what :func:`write_salvaged` would write, read in
    place, without pyarrow ever parsing a footer of every row group."""
    if not salvage.structs:
        raise ValueError(f"{path}: its row groups' structs were dropped (Salvage.places)")
    structs = salvage.row_groups.structs()
    return RowGroupWindows(os.fspath(path), template, structs, group_rows(salvage))


class _Joined(io.RawIOBase):
    """A read-only file: the first ``end`` bytes of ``path`` followed by ``tail`` bytes."""

    def __init__(self, path: str | os.PathLike, end: int, tail: bytes):
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY)
        self._end = end
        self._tail = tail
        self._size = end + len(tail)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b) -> int:
        view = memoryview(b).cast("B")
        n = min(len(view), max(0, self._size - self._pos))
        done = 0
        while done < n:
            at = self._pos + done
            if at < self._end:
                got = os.preadv(self._fd, [view[done : done + min(n - done, self._end - at)]], at)
                if got <= 0:
                    raise OSError(f"file shorter than {self._end} bytes")
            else:
                piece = self._tail[at - self._end : at - self._end + n - done]
                view[done : done + len(piece)] = piece
                got = len(piece)
            done += got
        self._pos += n
        return n

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


IN_MEMORY = 64 << 20  # a salvaged file up to this size is read from memory


@contextlib.contextmanager
def open_salvaged(
    path: str | os.PathLike,
    salvage: Salvage,
    template: tc.Struct,
    meta: bytes | None = None,
    parsed: FileMetaData | None = None,
) -> Iterator[DataFile]:
    """``path``'s whole row groups under their new footer (``meta``: :func:`footer`'s bytes,
        ``parsed``: pyarrow's reading of them, when already made), read in place: what
        :func:`write_salvaged` would write, without writing it. A small file is read into memory
        (one read, native parsing), a larger one through a file object that reads only what is
        asked. Read through :class:`~episodekit.core.parquet_read.DataFile` (the data-file layer's
    error policy and closing)."""
    meta = footer(template, salvage) if meta is None else meta
    tail = meta + len(meta).to_bytes(4, "little") + MAGIC
    if salvage.end <= IN_MEMORY:
        buf = pa.allocate_buffer(salvage.end + len(tail))
        view = memoryview(buf).cast("B")
        with open(path, "rb") as fh:
            if fh.readinto(view[: salvage.end]) != salvage.end:
                raise OSError(f"{path}: shorter than {salvage.end} bytes")
        view[salvage.end :] = tail
        with DataFile.of(str(path), pa.BufferReader(buf), parsed) as df:
            yield df
        return
    with (
        _Joined(path, salvage.end, tail) as fh,
        DataFile.of(str(path), fh, parsed, pre_buffer=False) as df,
    ):
        yield df


def _copy_prefix(src: int, dst: int, n: int) -> None:
    """The first ``n`` bytes of ``src`` into ``dst`` (in the kernel where it can)."""
    done = 0
    while done < n:
        try:
            got = os.copy_file_range(src, dst, n - done, done)  # type: ignore[attr-defined]
        except (AttributeError, OSError):
            got = 0
        if got <= 0:  # no copy_file_range (or not across these filesystems): plain reads
            while done < n:
                buf = os.pread(src, min(n - done, 8 << 20), done)
                if not buf:
                    raise OSError(f"file shorter than {n} bytes")
                _write_all(dst, buf)
                done += len(buf)
            return
        done += got


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_salvaged(
    src: str | os.PathLike, dst: str | os.PathLike, salvage: Salvage, template: tc.Struct
) -> int:
    """Write ``dst``: ``src``'s whole row groups and a new footer; return the rows written."""
    fi = os.open(src, os.O_RDONLY)
    try:
        fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _copy_prefix(fi, fo, salvage.end)
            os.lseek(fo, salvage.end, os.SEEK_SET)
            size, buf = 0, bytearray()
            for part in footer_parts(template, salvage):  # the footer a part at a time
                buf += part
                size += len(part)
                if len(buf) >= 1 << 20:
                    _write_all(fo, bytes(buf))
                    buf.clear()
            _write_all(fo, bytes(buf) + size.to_bytes(4, "little") + MAGIC)
            os.fsync(fo)
        finally:
            os.close(fo)
    finally:
        os.close(fi)
    return salvage.num_rows


__all__ = [
    "Salvage",
    "SalvageError",
    "footer",
    "footer_matches",
    "footer_parts",
    "group_rows",
    "open_salvaged",
    "read_template",
    "scan",
    "schema_template",
    "template_codec",
    "windows",
    "write_salvaged",
]
