"""The walk of a *regular* row group of a footer-less parquet file, fused: every column chunk
one dictionary page and one v1 data page (what LeRobot's recorder, and pyarrow for small row
groups, write), each page header matched by one regular expression and the chunk's
``ColumnMetaData`` appended to the group's footer entry at once, no page object in between.

Nearly all of a salvage's chunks are read here (49,801 in a 1M-frame recording's two files),
so this is its hot loop. It accepts only the header layout writers use (short field headers,
the fields in order; statistics of binaries of the column's width, numbers and flags) and hands
anything else (another layout, a group cut off, a row count that differs, a bad checksum) back
to the generic walk of :mod:`episodekit.core.parquet_salvage`, which decides: a group read here
is byte for byte what that walk makes of it (tested on files cut at offsets all over them).
"""

from __future__ import annotations

import functools
import re
import zlib
from typing import NamedTuple

import numpy as np

from episodekit.core import thrift_compact as tc
from episodekit.core.parquet_footer import CHUNK_HEAD, I64_NEXT, I64_SKIP1, column_template
from episodekit.core.parquet_pages import (
    DATA_PAGE,
    DICTIONARY_PAGE,
    HEADROOM,
    Leaf,
    NotAPage,
    PageReader,
)

VARINT = rb"[\x80-\xff]{0,9}[\x00-\x7f]"
_V = b"(" + VARINT + b")"


def _field(*types: int) -> bytes:
    """A character class: the short-form header of a field of any of ``types`` (any id step)."""
    heads = bytes(step << 4 | t for step in range(1, 16) for t in types)
    return b"[" + re.escape(heads) + b"]"


# PageHeader (type, uncompressed and compressed sizes, crc) and its DictionaryPageHeader
# (num_values, encoding, is_sorted); groups: uncompressed, compressed, crc, num_values, encoding
DICT_HEADER = re.compile(
    rb"\x15\x04\x15" + _V + rb"\x15" + _V + rb"(?:\x15" + _V + rb"\x3c|\x4c)"
    rb"\x15" + _V + rb"\x15" + _V + rb"[\x11\x12]?\x00\x00",
    re.DOTALL,
)


def _statistics(width: int) -> bytes:
    """A ``Statistics`` struct (its stop byte included) whose binaries are ``width`` bytes
    long, numbers and flags."""
    binary = _field(tc.BINARY) + b"%s.{%d}" % (re.escape(bytes([width])), width)
    number = _field(tc.I16, tc.I32, tc.I64) + VARINT
    flag = _field(tc.BOOL_TRUE, tc.BOOL_FALSE)
    return b"(?:" + binary + b"|" + number + b"|" + flag + b")*\x00"


def data_header(width: int | None) -> re.Pattern[bytes]:
    """PageHeader and DataPageHeader (num_values, encoding, level encodings, statistics);
    groups: uncompressed, compressed, crc, num_values, encoding, statistics. The statistics
    of a column whose values have no fixed ``width`` (None) are stepped over by
    :func:`_statistics_end`: the group is then only their field header, ``\x1c``."""
    stats = (
        rb"(?:(\x1c)|\x00\x00)"
        if width is None or width >= 0x80
        else (rb"(?:\x1c(" + _statistics(width) + rb"))?\x00\x00")
    )
    return re.compile(
        rb"\x15\x00\x15" + _V + rb"\x15" + _V + rb"(?:\x15" + _V + rb"\x1c|\x2c)"
        rb"\x15" + _V + rb"\x15" + _V + rb"\x15" + VARINT + rb"\x15" + VARINT + stats,
        re.DOTALL,
    )  # fmt: skip


VARIABLE = b"\x1c"  # what a pattern of no fixed width captures of statistics


def _statistics_end(buf: bytes, pos: int) -> int:
    """Where the ``Statistics`` struct at ``buf[pos]`` ends (after its stop byte), read as
    :func:`~episodekit.core.parquet_pages._fast_header` reads it: binaries (under 128 bytes),
    numbers and flags; -1 for anything else, or a struct cut short."""
    try:
        while True:
            head = buf[pos]
            pos += 1
            if head == 0:
                return pos if pos <= len(buf) else -1
            ttype = head & 0x0F
            if not head >> 4:
                return -1
            if ttype == tc.BINARY:
                if buf[pos] >= 0x80:
                    return -1
                pos += 1 + buf[pos]
            elif ttype in (tc.I16, tc.I32, tc.I64):
                while buf[pos] & 0x80:
                    pos += 1
                pos += 1
            elif ttype not in (tc.BOOL_TRUE, tc.BOOL_FALSE):
                return -1
    except IndexError:
        return -1


def stats_width(leaf: Leaf) -> int | None:
    """Bytes of a min or max in ``leaf``'s statistics (None: variable)."""
    return 1 if leaf.physical_type == 0 else leaf.width


class _ZigZag(dict):
    """Varint bytes -> the zigzag number they encode: every one- and two-byte varint held, a
    longer one computed."""

    def __missing__(self, raw: bytes) -> int:
        n = 0
        for i, b in enumerate(raw):
            n |= (b & 0x7F) << (7 * i)
        return (n >> 1) ^ -(n & 1)


SMALL, LOW_BITS = 1 << 13, 1 << 14
ZBIG = 1 << 28  # zigzag values from here are encoded by a loop (they take over 4 bytes)


class Codes(NamedTuple):
    """Varints looked up, not computed, in the hot loop: ``zigzag`` decodes one- and two-byte
    ones; ``varint14[y]`` encodes y < 2**14, ``low14[x]`` the low 14 bits of a larger one
    (more bytes follow), ``next_small[n]`` an ``I64_NEXT`` field of n < 2**13 (zigzag 2n)."""

    zigzag: _ZigZag
    varint14: list[bytes]
    low14: list[bytes]
    next_small: list[bytes]


def _slices(raw: bytes, width: int) -> list[bytes]:
    return [raw[i : i + width] for i in range(0, len(raw), width)]


@functools.cache
def codes() -> Codes:
    """The tables (made once, with numpy: a few milliseconds)."""
    y = np.arange(LOW_BITS)
    two = np.stack([y & 0x7F | 0x80, y >> 7], axis=1).astype(np.uint8).tobytes()
    varint14 = _slices(y[:0x80].astype(np.uint8).tobytes(), 1) + _slices(two, 2)[0x80:]
    low14 = _slices(np.stack([y | 0x80, y >> 7 | 0x80], axis=1).astype(np.uint8).tobytes(), 2)
    zigzag = _ZigZag(zip(varint14, ((y >> 1) ^ -(y & 1)).tolist()))
    head = bytes([I64_NEXT])
    return Codes(zigzag, varint14, low14, [head + v for v in varint14[: 2 * SMALL : 2]])


def _zz(n: int, codes: Codes) -> bytes:
    """A non-negative i64 as the compact protocol writes it (zigzag varint)."""
    z = n << 1
    if z < LOW_BITS:
        return codes.varint14[z]
    if z < ZBIG:
        return codes.low14[z & 0x3FFF] + codes.varint14[z >> 14]
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


class _Column(NamedTuple):
    """A column's footer entry around a regular chunk's numbers: the ``ColumnChunk`` head and
    ``ColumnMetaData`` fields 1-4; its end without statistics, and after them."""

    head: bytes
    tail_plain: bytes
    tail_stats: bytes


class RegularWalk:
    """Reads regular row groups of one file (:meth:`group`), with the patterns and footer
    templates of its columns made once."""

    def __init__(self, reader: PageReader, cols: list[Leaf], codec: int):
        self.reader = reader
        self.codec = codec
        patterns: dict[int | None, re.Pattern[bytes]] = {}
        self.cols = []
        for i, leaf in enumerate(cols):
            width = stats_width(leaf)
            if width not in patterns:
                patterns[width] = data_header(width)
            self.cols.append((i, leaf, patterns[width], leaf.max_rep == 0))
        self.templates: dict[tuple[int, int, int], _Column] = {}
        head = bytearray()
        tc.put_field(head, 1, tc.LIST)
        tc.put_list(head, len(cols), tc.STRUCT)
        self.list_head = bytes(head)
        self.codes = codes()

    def _template(self, i: int, leaf: Leaf, dict_enc: int, enc: int) -> _Column:
        """What :func:`~episodekit.core.parquet_footer.group_meta` writes around the numbers
        of a chunk of column ``i`` (the same template)."""
        t = column_template(leaf, self.codec, ((DICTIONARY_PAGE, dict_enc), (DATA_PAGE, enc)))
        c = _Column(CHUNK_HEAD + t.head, t.tails[11] + b"\0", t.tails[12] + b"\0")
        self.templates[i, dict_enc, enc] = c
        return c

    def _window(self, pos: int) -> tuple[bytes, int, int]:
        """The read window, its file offset, and the last offset a header is matched at in it
        (:data:`~episodekit.core.parquet_pages.HEADROOM` bytes before its end, unless it ends
        the file)."""
        reader = self.reader
        buf, off = reader.window(pos)
        at = pos - off
        end = at + len(buf)
        return buf, at, end - HEADROOM if end < reader.size else reader.size

    def group(self, pos: int) -> tuple[int, int, bytes] | None:
        """The regular row group at ``pos``: (where it ends, its rows, its encoded ``RowGroup``
        struct, as :func:`~episodekit.core.parquet_footer.group_meta` encodes it); None when
        there is none whole here, read this way."""
        reader, size, templates, codes = self.reader, self.reader.size, self.templates, self.codes
        zz, varint14, low14, next_small = codes
        buf, at, limit = self._window(pos)
        start, rows = pos, -1
        total = total_compressed = 0
        out = bytearray(self.list_head)
        for i, leaf, pattern, flat in self.cols:
            if pos > limit:
                buf, at, limit = self._window(pos)
            m = DICT_HEADER.match(buf, pos - at)
            if m is None:
                return None
            u, c, crc, n, e = m.groups()
            dict_u, c, n, dict_enc = zz[u], zz[c], zz[n], zz[e]
            body = at + m.end()
            end = body + c
            if (dict_u | c | n | dict_enc) < 0 or dict_enc > 9 or end > size:
                return None
            if crc is not None and not _crc_ok(reader, body, c, zz[crc]):
                return None
            dict_start = pos
            uncompressed = dict_u + body - pos
            pos = end
            if pos > limit:
                buf, at, limit = self._window(pos)
            m = pattern.match(buf, pos - at)
            if m is None:
                return None
            u, c, crc, n, e, stats = m.groups()
            u, c, n, enc = zz[u], zz[c], zz[n], zz[e]
            body = at + m.end()
            if stats == VARIABLE:  # statistics of no fixed width: stepped over here
                a = body - at
                b = _statistics_end(buf, a)
                if b < 0 or buf[b : b + 2] != b"\0\0":
                    return None
                stats, body = buf[a:b], at + b + 2
            end = body + c
            if (u | c | n | enc) < 0 or enc > 9 or end > size:
                return None
            if crc is not None and not _crc_ok(reader, body, c, zz[crc]):
                return None
            if flat:
                if rows < 0:
                    rows = n
                elif n != rows:
                    return None
            uncompressed += u + body - pos
            compressed = end - dict_start
            t = templates.get((i, dict_enc, enc)) or self._template(i, leaf, dict_enc, enc)
            # ColumnMetaData fields 5-7 (num_values, sizes), 9 and 11 (the data and dictionary
            # pages' offsets), 12 (statistics), each number's bytes looked up when it can be
            out += t.head
            for number in (n, uncompressed, compressed):
                if number < SMALL:
                    out += next_small[number]
                else:
                    out.append(I64_NEXT)
                    out += _zz(number, codes)
            for offset in (pos, dict_start):
                out.append(I64_SKIP1)
                z = offset << 1
                out += (
                    low14[z & 0x3FFF] + varint14[z >> 14]
                    if LOW_BITS <= z < ZBIG
                    else _zz(offset, codes)
                )
            if stats is None:
                out += t.tail_plain
            else:
                out.append(1 << 4 | tc.STRUCT)
                out += stats
                out += t.tail_stats
            total += uncompressed
            total_compressed += compressed
            pos = end
        if rows < 0 or not flat and not _dictionary_page_at(reader, pos):
            return None  # (a last column of lists ends only where a dictionary page follows)
        for delta, value in ((1, total), (1, rows), (2, start), (1, total_compressed)):
            out.append(delta << 4 | tc.I64)  # RowGroup fields 2, 3, 5, 6
            out += _zz(value, codes)
        out.append(0)
        return pos, rows, bytes(out)


def _crc_ok(reader: PageReader, pos: int, n: int, crc: int) -> bool:
    return zlib.crc32(reader.read(pos, n)) == crc & 0xFFFFFFFF


def _dictionary_page_at(reader: PageReader, pos: int) -> bool:
    try:
        return reader.page(pos).kind == DICTIONARY_PAGE
    except NotAPage:
        return False


__all__ = ["RegularWalk", "data_header", "stats_width"]
