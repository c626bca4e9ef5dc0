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

import re
import zlib

from episodekit.core import thrift_compact as tc
from episodekit.core.parquet_footer import (
    CHUNK_HEAD,
    I64_NEXT,
    I64_SKIP1,
    ColumnTemplate,
    column_template,
)
from episodekit.core.parquet_pages import DICTIONARY_PAGE, Leaf, NotAPage, PageReader

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


def _statistics(width: int | None) -> bytes:
    """A ``Statistics`` struct (its stop byte included) whose binaries are ``width`` bytes long
    (None: any length under 128), numbers and flags."""
    if width is None or width >= 0x80:
        binary = b"(?:" + b"|".join(b"%s.{%d}" % (re.escape(bytes([n])), n) for n in range(128))
        binary += b")"
    else:
        binary = b"%s.{%d}" % (re.escape(bytes([width])), width)
    number = _field(tc.I16, tc.I32, tc.I64) + VARINT
    flag = _field(tc.BOOL_TRUE, tc.BOOL_FALSE)
    return b"(?:" + _field(tc.BINARY) + binary + b"|" + number + b"|" + flag + b")*\x00"


def data_header(width: int | None) -> re.Pattern[bytes]:
    """PageHeader and DataPageHeader (num_values, encoding, level encodings, statistics);
    groups: uncompressed, compressed, crc, num_values, encoding, statistics."""
    return re.compile(
        rb"\x15\x00\x15" + _V + rb"\x15" + _V + rb"(?:\x15" + _V + rb"\x1c|\x2c)"
        rb"\x15" + _V + rb"\x15" + _V + rb"\x15" + VARINT + rb"\x15" + VARINT
        + rb"(?:\x1c(" + _statistics(width) + rb"))?\x00\x00",
        re.DOTALL,
    )  # fmt: skip


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


ZIGZAG = _ZigZag({bytes([n]): (n >> 1) ^ -(n & 1) for n in range(0x80)})
ZIGZAG.update({bytes([n & 0x7F | 0x80, n >> 7]): (n >> 1) ^ -(n & 1) for n in range(0x80, 1 << 14)})


def _zz(n: int) -> bytes:
    """A non-negative i64 as the compact protocol writes it (zigzag varint)."""
    n <<= 1
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


SMALL = 1 << 13
ZZ = [_zz(n) for n in range(SMALL)]  # the encodings of small numbers (counts, sizes)


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
        self.templates: dict[tuple[int, int, int], ColumnTemplate] = {}
        head = bytearray()
        tc.put_field(head, 1, tc.LIST)
        tc.put_list(head, len(cols), tc.STRUCT)
        self.list_head = bytes(head)

    def _template(self, i: int, leaf: Leaf, dict_enc: int, enc: int) -> ColumnTemplate:
        t = self.templates[i, dict_enc, enc] = column_template(
            leaf, self.codec, ((DICTIONARY_PAGE, dict_enc), (0, enc))
        )
        return t

    def group(self, pos: int) -> tuple[int, int, bytes] | None:
        """The regular row group at ``pos``: (where it ends, its rows, its encoded ``RowGroup``
        struct); None when there is none whole here, read this way."""
        reader, size, zz, small = self.reader, self.reader.size, ZIGZAG, ZZ
        start, rows = pos, -1
        total = total_compressed = 0
        out = bytearray(self.list_head)
        templates = self.templates
        for i, leaf, pattern, flat in self.cols:
            buf, off = reader.window(pos)
            m = DICT_HEADER.match(buf, off)
            if m is None:
                return None
            u, c, crc, n, e = m.groups()
            c, dict_enc = zz[c], zz[e]
            body = pos + m.end() - off
            end = body + c
            if c < 0 or zz[u] < 0 or zz[n] < 0 or not 0 <= dict_enc < 10 or end > size:
                return None
            if crc is not None and not _crc_ok(reader, body, c, zz[crc]):
                return None
            dict_start = pos
            uncompressed = zz[u] + body - pos
            pos = end
            buf, off = reader.window(pos)
            m = pattern.match(buf, off)
            if m is None:
                return None
            u, c, crc, n, e, stats = m.groups()
            c, n, enc = zz[c], zz[n], zz[e]
            body = pos + m.end() - off
            end = body + c
            if c < 0 or zz[u] < 0 or n < 0 or not 0 <= enc < 10 or end > size:
                return None
            if crc is not None and not _crc_ok(reader, body, c, zz[crc]):
                return None
            if flat:
                if rows < 0:
                    rows = n
                elif n != rows:
                    return None
            uncompressed += zz[u] + body - pos
            compressed = end - dict_start
            t = templates.get((i, dict_enc, enc)) or self._template(i, leaf, dict_enc, enc)
            out += CHUNK_HEAD
            out += t.head
            out.append(I64_NEXT)
            out += small[n] if n < SMALL else _zz(n)
            out.append(I64_NEXT)
            out += small[uncompressed] if uncompressed < SMALL else _zz(uncompressed)
            out.append(I64_NEXT)
            out += small[compressed] if compressed < SMALL else _zz(compressed)
            out.append(I64_SKIP1)  # field 9: the data page
            out += _zz(pos)
            out.append(I64_SKIP1)  # field 11: the dictionary page
            out += _zz(dict_start)
            if stats is None:
                out += t.tails[11]
            else:
                out.append(1 << 4 | tc.STRUCT)  # field 12
                out += stats
                out += t.tails[12]
            out.append(0)
            total += uncompressed
            total_compressed += compressed
            pos = end
        if rows < 0 or not flat and not _dictionary_page_at(reader, pos):
            return None  # (a last column of lists ends only where a dictionary page follows)
        for delta, value in ((1, total), (1, rows), (2, start), (1, total_compressed)):
            tc.put_field(out, delta, tc.I64)  # RowGroup fields 2, 3, 5, 6
            tc.put_int(out, value)
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
