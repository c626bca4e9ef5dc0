"""The pages of a parquet file, read without its footer: page headers one after another, the
leaf columns of a schema, and the number of rows a data page holds.

A parquet file is ``PAR1``, then each row group's column chunks in schema order (each an
optional dictionary page and data pages, every page a Thrift ``PageHeader`` followed by its
bytes), then the footer. Only the footer says where a chunk ends; a file whose writer was never
closed has none. :mod:`episodekit.core.parquet_salvage` rebuilds it from what is here.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from episodekit.core import thrift_compact as tc

MAGIC = b"PAR1"
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3
RLE = 3
# parquet CompressionCodec -> pyarrow codec name (LZO and Hadoop's LZ4 framing are not read)
CODECS = {0: None, 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd", 7: "lz4_raw"}
ENCODINGS = range(0, 10)  # PLAIN .. BYTE_STREAM_SPLIT
UINT_CONVERTED = (11, 12, 13, 14)  # UINT_8 .. UINT_64
WINDOW = 1 << 20  # bytes read at a time while walking headers
HEADROOM = 4096  # bytes after an offset :meth:`PageReader.window` holds (a header's, at most)
MAX_HEADER = 16 << 20  # a page header larger than this is not one
# PageHeader's fields and their types: anything else (the footer, garbage) stops at once
HEADER_TYPES = {1: tc.I32, 2: tc.I32, 3: tc.I32, 4: tc.I32, 5: tc.STRUCT, 6: tc.STRUCT,
                7: tc.STRUCT, 8: tc.STRUCT}  # fmt: skip
SUB_FIELD = {DATA_PAGE: 5, DICTIONARY_PAGE: 7, DATA_PAGE_V2: 8}  # the page kind's own header
STATS_FIELD = {DATA_PAGE: 5, DATA_PAGE_V2: 8}  # its statistics, inside that header
INTS, BOOLS = frozenset((tc.I16, tc.I32, tc.I64)), frozenset((tc.BOOL_TRUE, tc.BOOL_FALSE))


class NotAPage(Exception):
    """The bytes at an offset are no complete page; ``reason`` says why (for the report)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


CUT_HEADER = "cut inside a page header"
CUT_PAGE = "cut inside a page"
NOT_A_PAGE = "not a page header (the old footer, or garbage)"
BAD_CRC = "page checksum differs"
END = "end of file"


@dataclass(frozen=True)
class Leaf:
    """A leaf column of the schema: its path and what its pages' levels look like."""

    path: tuple[bytes, ...]
    physical_type: int
    max_def: int
    max_rep: int
    signed: bool = True  # integer order (unsigned for UINT_* types)
    type_length: int = 0  # FIXED_LEN_BYTE_ARRAY's width

    @property
    def width(self) -> int | None:
        """Bytes per plain-encoded value (None: variable, or bits)."""
        if self.physical_type == 7:
            return self.type_length
        return {1: 4, 2: 8, 3: 12, 4: 4, 5: 8}.get(self.physical_type)


def leaves(meta: tc.Struct) -> list[Leaf]:
    """The leaf columns, in schema order, of a decoded ``FileMetaData`` (its schema elements)."""
    elems = tc.get(meta, 2, (tc.STRUCT, []))[1]
    out: list[Leaf] = []
    # (remaining children, path, def, rep) of each open group
    stack: list[list] = []
    for i, e in enumerate(elems):
        children = tc.get(e, 5, 0)
        rep = tc.get(e, 3, 0)
        if i == 0:
            stack.append([children, (), 0, 0])
            continue
        if not stack:
            raise ValueError("schema has elements outside its root")
        parent = stack[-1]
        parent[0] -= 1
        path = (*parent[1], tc.get(e, 4, b""))
        d = parent[2] + (rep in (1, 2))
        r = parent[3] + (rep == 2)
        if children:
            stack.append([children, path, d, r])
        else:
            logical = tc.get(e, 10) or {}
            unsigned = tc.get(e, 6) in UINT_CONVERTED or (
                10 in logical and tc.get(logical[10][1], 2, True) is False
            )
            out.append(Leaf(path, tc.get(e, 1, -1), d, r, not unsigned, tc.get(e, 2, 0)))
        while stack and stack[-1][0] == 0:
            stack.pop()
    return out


class Page:
    """One page: where its header starts, its bytes begin and end, and what the header says:
    the data/dictionary page header's numbers by field id in ``sub``, and, read from it once
    (a salvage touches each many times), ``num_values``, ``encoding`` and ``stats`` (its
    statistics struct as the bytes it was written as, or None)."""

    __slots__ = ("start", "data_start", "end", "kind", "compressed", "uncompressed", "crc",
                 "sub", "is_data", "num_values", "encoding", "stats")  # fmt: skip

    def __init__(
        self,
        start: int,
        data_start: int,
        kind: int,
        compressed: int,
        uncompressed: int,
        crc: int | None,
        sub: dict[int, int | bool | bytes],
    ):
        self.start = start
        self.data_start = data_start
        self.end = data_start + compressed
        self.kind = kind
        self.compressed = compressed
        self.uncompressed = uncompressed
        self.crc = crc
        self.sub = sub
        self.is_data = kind in (DATA_PAGE, DATA_PAGE_V2)
        num_values = sub.get(1)
        encoding = sub.get(4 if kind == DATA_PAGE_V2 else 2)
        if not isinstance(num_values, int) or num_values < 0 or encoding not in ENCODINGS:
            raise NotAPage(NOT_A_PAGE)
        self.num_values, self.encoding = num_values, encoding
        raw = sub.get(STATS_FIELD.get(kind, 0))
        self.stats = raw if isinstance(raw, bytes) else None


class PageReader:
    """Reads page headers and page bytes of an open file by offset (``os.pread``, a window at
    a time: memory stays one window plus one page)."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self._buf = b""
        self._at = 0
        self._last: tuple[int, Page] | None = None  # the page read last (read again next)

    def read(self, pos: int, n: int) -> memoryview:
        """``n`` bytes at ``pos`` (fewer at the end of the file)."""
        if self._at <= pos and pos + n <= self._at + len(self._buf):
            off = pos - self._at
            return memoryview(self._buf)[off : off + n]
        if n >= WINDOW:
            return memoryview(os.pread(self.fd, n, pos))
        self._buf = os.pread(self.fd, WINDOW, pos)
        self._at = pos
        return memoryview(self._buf)[:n]

    def window(self, pos: int) -> tuple[bytes, int]:
        """The read window and ``pos``'s offset in it, with :data:`HEADROOM` bytes from there
        (fewer at the end of the file): headers are matched in it without a copy."""
        at, buf = self._at, self._buf
        if pos < at or pos + HEADROOM > at + len(buf) and at + len(buf) < self.size:
            buf = self._buf = os.pread(self.fd, WINDOW, pos)
            self._at = at = pos
        return buf, pos - at

    def page(self, pos: int) -> Page:
        """The page at ``pos``; :class:`NotAPage` when there is none, complete, there."""
        if self._last is not None and self._last[0] == pos:
            return self._last[1]
        if pos >= self.size:
            raise NotAPage(END)
        want = 4096
        while True:
            if self._at <= pos and pos + want <= self._at + len(self._buf):
                buf, off = self._buf, pos - self._at  # the window: parsed without a copy
            else:
                buf, off = bytes(self.read(pos, want)), 0
            try:
                page = _fast_header(buf, off, pos) or parse_header(memoryview(buf)[off:], pos)
                break
            except tc.CutShort:
                if pos + len(buf) - off >= self.size:
                    raise NotAPage(CUT_HEADER) from None
                if want >= MAX_HEADER:
                    raise NotAPage(NOT_A_PAGE) from None
                want *= 8
            except tc.ThriftError:
                raise NotAPage(NOT_A_PAGE) from None
        if page.end > self.size:
            raise NotAPage(CUT_PAGE)
        if page.crc is not None:
            body = self.read(page.data_start, page.compressed)
            if zlib.crc32(body) != page.crc & 0xFFFFFFFF:
                raise NotAPage(BAD_CRC)
        self._last = (pos, page)
        return page

    def rows(self, page: Page, leaf: Leaf, codec: int) -> int:
        """How many rows (records) a data page of ``leaf`` holds."""
        if page.kind == DATA_PAGE_V2:
            return int(page.sub.get(3, 0))
        if leaf.max_rep == 0:
            return page.num_values
        if page.sub.get(4) != RLE:
            raise NotAPage("repetition levels not RLE-encoded")
        body = self.read(page.data_start, page.compressed)
        name = CODECS.get(codec, "?")
        if name == "?":
            raise NotAPage(f"compression codec {codec} is not supported")
        try:
            raw = body if name is None else pa.decompress(body, page.uncompressed, codec=name)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise NotAPage(f"page does not decompress ({exc})") from exc
        raw = memoryview(raw)
        n = int.from_bytes(raw[:4], "little")
        if len(raw) < 4 + n:
            raise NotAPage("repetition levels longer than the page")
        width = max(int(leaf.max_rep).bit_length(), 1)
        return zero_levels(raw[4 : 4 + n], width, page.num_values)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at ``buf[pos]``."""
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7
        if shift > 63:
            raise tc.ThriftError("varint longer than 10 bytes")


def _fast_header(buf: bytes, off: int, start: int) -> Page | None:
    """:func:`parse_header` for the layout writers use (short field headers; numbers, flags and
    a statistics struct of binaries and numbers), in one loop (the generic walk's; a regular
    row group's headers are matched in :mod:`episodekit.core.parquet_regular`). None for any
    other layout (the generic parser decides); :class:`CutShort` when the
    bytes end inside it."""
    I32, STRUCT, BINARY = tc.I32, tc.STRUCT, tc.BINARY  # locals: the loop reads them often
    try:
        pos, fid, top, sub, sub_id = off, 0, {}, None, 0
        while True:
            head = buf[pos]
            pos += 1
            if head == 0:
                break
            fid += head >> 4
            ttype = head & 0x0F
            if not head >> 4:
                return None
            if fid <= 4 and ttype == I32:
                v = buf[pos]  # varints inline (up to 2 bytes; longer: the helper)
                if v < 0x80:
                    pos += 1
                elif buf[pos + 1] < 0x80:
                    v = (v & 0x7F) | (buf[pos + 1] << 7)
                    pos += 2
                else:
                    v, pos = _varint(buf, pos)
                top[fid] = (v >> 1) ^ -(v & 1)
            elif (fid == 5 or fid == 7 or fid == 8) and ttype == STRUCT and sub is None:
                sub, sub_id, sfid = {}, fid, 0
                while True:
                    head = buf[pos]
                    pos += 1
                    if head == 0:
                        break
                    if not head >> 4:
                        return None
                    sfid += head >> 4
                    ttype = head & 0x0F
                    if ttype in INTS:
                        v = buf[pos]
                        if v < 0x80:
                            pos += 1
                        elif buf[pos + 1] < 0x80:
                            v = (v & 0x7F) | (buf[pos + 1] << 7)
                            pos += 2
                        else:
                            v, pos = _varint(buf, pos)
                        sub[sfid] = (v >> 1) ^ -(v & 1)
                    elif ttype in BOOLS:
                        sub[sfid] = ttype == tc.BOOL_TRUE
                    elif ttype == STRUCT:  # statistics: stepped over, kept as bytes
                        a = pos
                        while True:
                            head = buf[pos]
                            pos += 1
                            if head == 0:
                                break
                            if not head >> 4:
                                return None
                            ttype = head & 0x0F
                            if ttype == BINARY:
                                v = buf[pos]
                                if v < 0x80:
                                    pos += 1 + v
                                else:
                                    v, pos = _varint(buf, pos)
                                    pos += v
                            elif ttype in INTS:
                                while buf[pos] & 0x80:  # a number nobody reads: stepped over
                                    pos += 1
                                pos += 1
                            elif ttype not in BOOLS:
                                return None
                        if pos > len(buf):
                            raise tc.CutShort("cut short")
                        sub[sfid] = buf[a:pos]
                    else:
                        return None
            else:
                return None
    except IndexError:
        raise tc.CutShort("cut short") from None
    except tc.ThriftError:
        return None
    kind = top.get(1)
    compressed, uncompressed = top.get(3, -1), top.get(2, -1)
    if sub is None or SUB_FIELD.get(kind) != sub_id or compressed < 0 or uncompressed < 0:
        raise NotAPage(NOT_A_PAGE)
    return Page(start, start + pos - off, kind, compressed, uncompressed, top.get(4), sub)


def parse_header(buf: memoryview, start: int) -> Page:
    """The page whose header starts ``buf`` (found at file offset ``start``). Raises
    :class:`~episodekit.core.thrift_compact.CutShort` when ``buf`` ends inside the header and
    :class:`NotAPage` when it is no page header. Only the numbers are decoded; the statistics
    are kept as their bytes (a footer copies them)."""
    r = tc.Reader(buf)
    top: dict[int, int] = {}
    sub: dict[int, int | bool | bytes] | None = None
    sub_id = fid = 0
    try:
        while True:
            head = r.byte()
            if head == 0:
                break
            ttype = head & 0x0F
            fid = fid + (head >> 4) if head >> 4 else r.zigzag()
            if HEADER_TYPES.get(fid, ttype) != ttype:
                raise NotAPage(NOT_A_PAGE)
            if fid <= 4:
                top[fid] = r.zigzag()
            elif fid in (5, 7, 8):
                sub_id, sub = fid, _sub_header(r)
            elif ttype not in (tc.BOOL_TRUE, tc.BOOL_FALSE):
                r.skip(ttype)
    except tc.CutShort:
        raise
    except tc.ThriftError:
        raise NotAPage(NOT_A_PAGE) from None
    kind = top.get(1)
    compressed, uncompressed = top.get(3, -1), top.get(2, -1)
    if sub is None or SUB_FIELD.get(kind) != sub_id or compressed < 0 or uncompressed < 0:
        raise NotAPage(NOT_A_PAGE)
    return Page(start, start + r.pos, kind, compressed, uncompressed, top.get(4), sub)


def fits(page: Page, leaf: Leaf) -> bool:
    """Whether ``page`` can belong to a column of ``leaf``'s physical type: a plain dictionary
    page holds ``width`` bytes per value, page statistics are values of that width (what tells
    a template of the wrong schema from the right one; levels decide nothing of the kind)."""
    width = leaf.width
    if page.kind == DICTIONARY_PAGE and page.encoding in (0, 2):  # PLAIN, PLAIN_DICTIONARY
        if width is not None:
            return page.uncompressed == width * page.num_values
        if leaf.physical_type == 6:  # BYTE_ARRAY: a 4-byte length per value at least
            return page.uncompressed >= 4 * page.num_values
        return True
    if page.stats is None or leaf.physical_type == 6:
        return True
    try:
        stats = tc.decode(page.stats)[0]
    except tc.ThriftError:
        return False
    want = 1 if leaf.physical_type == 0 else width
    return all(len(stats[k][1]) == want for k in (1, 2, 5, 6) if k in stats)


def _sub_header(r: tc.Reader) -> dict[int, int | bool | bytes]:
    """A data/dictionary page header: its numbers and flags by field id, its statistics struct
    as bytes."""
    out: dict[int, int | bool | bytes] = {}
    fid = 0
    while True:
        head = r.byte()
        if head == 0:
            return out
        ttype = head & 0x0F
        fid = fid + (head >> 4) if head >> 4 else r.zigzag()
        if ttype in (tc.I16, tc.I32, tc.I64):
            out[fid] = r.zigzag()
        elif ttype in (tc.BOOL_TRUE, tc.BOOL_FALSE):
            out[fid] = ttype == tc.BOOL_TRUE
        elif ttype == tc.STRUCT:
            a = r.pos
            r.skip(tc.STRUCT)
            out[fid] = bytes(r.buf[a : r.pos])
        else:
            r.skip(ttype)


def zero_levels(buf: memoryview, width: int, count: int) -> int:
    """How many of the first ``count`` levels in ``buf`` (parquet's RLE / bit-packed hybrid,
    ``width`` bits each) are 0: for repetition levels, the rows that start in the page."""
    pos = got = zeros = 0
    data = bytes(buf)
    size = len(data)
    vbytes = (width + 7) // 8
    weights = (1 << np.arange(width)).astype(np.int64)
    while got < count:
        head = shift = 0
        while True:  # the run's header, a varint
            if pos >= size:
                raise NotAPage("levels cut short")
            b = data[pos]
            pos += 1
            head |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        n = head >> 1
        if head & 1:  # bit-packed: n groups of 8 values
            nbytes = n * width
            take = min(n * 8, count - got)
            if n == 0 or pos + nbytes > size:
                raise NotAPage("levels cut short")
            if width == 1:  # the usual case (one level of lists): count the set bits
                ones = int.from_bytes(data[pos : pos + nbytes], "little")
                zeros += take - (ones & ((1 << take) - 1)).bit_count()
            else:
                raw = np.frombuffer(data, np.uint8, nbytes, pos)
                bits = np.unpackbits(raw, bitorder="little")[: take * width]
                zeros += take - int(np.count_nonzero(bits.reshape(take, width) @ weights))
            pos += nbytes
        else:  # a run of one value
            if n == 0 or pos + vbytes > size:
                raise NotAPage("levels cut short")
            take = min(n, count - got)
            if not any(data[pos : pos + vbytes]):
                zeros += take
            pos += vbytes
        got += take
    return zeros


def detect_codec(reader: PageReader, page: Page) -> int:
    """The compression codec of ``page`` (parquet's code), tried on its bytes: page headers do
    not name it, the footer does. :class:`NotAPage` when no codec gives its declared size."""
    body = bytes(reader.read(page.data_start, page.compressed))
    candidates = [1, 6, 2, 7, 4]
    if body[:4] == b"\x28\xb5\x2f\xfd":
        candidates = [6]
    elif body[:2] == b"\x1f\x8b":
        candidates = [2]
    if page.kind == DATA_PAGE_V2 and page.sub.get(7, True) is False:
        candidates = [0]  # a v2 page may say it is stored uncompressed
    elif page.compressed == page.uncompressed:
        candidates = [0, *candidates]
    for code in candidates:
        name = CODECS[code]
        if name is None:
            return code
        try:
            data = body
            if page.kind == DATA_PAGE_V2:  # levels are stored uncompressed before the values
                skip = int(page.sub.get(5, 0)) + int(page.sub.get(6, 0))
                data = body[skip:]
                size = page.uncompressed - skip
            else:
                size = page.uncompressed
            if len(pa.decompress(data, size, codec=name)) == size:
                return code
        except (pa.ArrowException, ValueError, OSError):
            continue
    raise NotAPage("no known compression codec decodes the first page")
