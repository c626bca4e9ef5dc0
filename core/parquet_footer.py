"""The footer entries of the row groups a salvage found (:mod:`episodekit.core.parquet_salvage`):
each row group's ``RowGroup`` struct, encoded in Thrift's compact protocol as pyarrow writes it,
from the page headers alone (sizes, offsets, value counts, encodings, statistics).

A file has thousands of column chunks and most of a salvage's time went into encoding them, so
what every chunk of a column shares (its type, encodings, path and codec; its encoding stats) is
made once per column and pages' (kind, encoding)s (:class:`ColumnTemplate`), and each chunk
appends only its numbers and statistics to the group's bytes (a regular row group's chunks:
:mod:`episodekit.core.parquet_regular`, around the same templates).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from episodekit.core import thrift_compact as tc
from episodekit.core.parquet_pages import DICTIONARY_PAGE, RLE, Leaf

if TYPE_CHECKING:
    from episodekit.core.parquet_salvage import Chunk, RowGroup

# physical types whose statistics merge as numbers (numpy dtype of their plain encoding)
NUMERIC = {1: "<i4", 2: "<i8", 4: "<f4", 5: "<f8"}
BOOLEAN, BYTE_ARRAY = 0, 6


def _decode_stat(raw: bytes, leaf: Leaf):
    dtype = NUMERIC.get(leaf.physical_type)
    if dtype is not None:
        if not leaf.signed:
            dtype = dtype.replace("i", "u")
        return np.frombuffer(raw, dtype=dtype)[0] if len(raw) == np.dtype(dtype).itemsize else None
    if leaf.physical_type in (BOOLEAN, BYTE_ARRAY):
        return raw
    return None  # INT96, FIXED_LEN_BYTE_ARRAY (decimals, float16): orders not merged


def _merged_stats(chunk: Chunk) -> bytes | None:
    """The chunk's encoded statistics: its one data page's as they are, else merged from every
    page's (min of mins, max of maxes, null counts summed); None when a page has none or the
    type's order is not merged here."""
    raws = [p.stats for p in chunk.pages if p.is_data]
    if any(r is None for r in raws):
        return None
    if len(raws) == 1:
        return raws[0]
    stats = [tc.decode(r)[0] for r in raws]
    out: tc.Struct = {}
    for lo_id, hi_id in ((2, 1), (6, 5)):  # deprecated min/max, then min_value/max_value
        if all(lo_id in s and hi_id in s for s in stats):
            lows = [(_decode_stat(s[lo_id][1], chunk.leaf), s[lo_id][1]) for s in stats]
            highs = [(_decode_stat(s[hi_id][1], chunk.leaf), s[hi_id][1]) for s in stats]
            if any(v is None for v, _ in lows + highs):
                return None
            out[lo_id] = tc.binary(min(lows, key=lambda t: t[0])[1])
            out[hi_id] = tc.binary(max(highs, key=lambda t: t[0])[1])
    if all(3 in s for s in stats):
        out[3] = tc.i64(sum(s[3][1] for s in stats))
    for flag in (7, 8):  # is_max_value_exact, is_min_value_exact
        if all(flag in s for s in stats):
            out[flag] = (tc.BOOL, all(s[flag][1] for s in stats))
    return tc.encode(out)


def _meta_head(leaf: Leaf, codec: int, kinds: tuple[tuple[int, int], ...]) -> bytes:
    """``ColumnMetaData`` fields 1-4 (type, encodings, path, codec): the same for every chunk of
    a column whose pages have the same (kind, encoding)s. Encodings as Arrow lists them: the
    dictionary page's, RLE (levels), the data pages'."""
    encodings = sorted({e for k, e in kinds if k == DICTIONARY_PAGE}) + [RLE]
    encodings += sorted({e for k, e in kinds if k != DICTIONARY_PAGE})
    out = bytearray()
    tc.put_field(out, 1, tc.I32)
    tc.put_int(out, leaf.physical_type)
    tc.put_field(out, 1, tc.LIST)
    tc.put_list(out, len(encodings), tc.I32)
    for e in encodings:
        tc.put_int(out, e)
    tc.put_field(out, 1, tc.LIST)
    tc.put_list(out, len(leaf.path), tc.BINARY)
    for name in leaf.path:
        tc.put_binary(out, name)
    tc.put_field(out, 1, tc.I32)
    tc.put_int(out, codec)
    return bytes(out)


def _meta_tail(counts: tuple[tuple[tuple[int, int], int], ...], last: int) -> bytes:
    """``ColumnMetaData`` field 13 (encoding stats: page type, encoding, count) and the stop."""
    out = bytearray()
    tc.put_field(out, 13 - last, tc.LIST)
    tc.put_list(out, len(counts), tc.STRUCT)
    for (kind, enc), n in counts:
        for value in (kind, enc, n):
            tc.put_field(out, 1, tc.I32)
            tc.put_int(out, value)
        out.append(0)
    out.append(0)
    return bytes(out)


def _put_zz(out: bytearray, n: int) -> None:
    """A non-negative i64 as the compact protocol writes it (zigzag varint), appended."""
    n <<= 1
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


I64_NEXT, I64_SKIP1 = 1 << 4 | tc.I64, 2 << 4 | tc.I64


class ColumnTemplate(NamedTuple):
    """What every chunk of one column with the same pages' (kind, encoding)s shares:
    :func:`_meta_head`, and :func:`_meta_tail` by the field before it (9, 11 or 12)."""

    head: bytes
    tails: dict[int, bytes]


def column_template(leaf: Leaf, codec: int, kinds: tuple[tuple[int, int], ...]) -> ColumnTemplate:
    counts: dict[tuple[int, int], int] = {}
    for k in kinds:
        counts[k] = counts.get(k, 0) + 1
    pairs = tuple(counts.items())
    head = _meta_head(leaf, codec, tuple(counts))
    return ColumnTemplate(head, {last: _meta_tail(pairs, last) for last in (9, 11, 12)})


def _column_meta(out: bytearray, chunk: Chunk, codec: int, heads: dict) -> tuple[int, int]:
    """Append the encoded ``ColumnMetaData`` of a chunk; return its uncompressed and compressed
    bytes. The head and tail come from a template made once per column and pages' (kind,
    encoding)s (``heads``); between them: num_values, sizes, data page offset, dictionary page
    offset, statistics (thousands of chunks a file: most of a salvage's time was here)."""
    pages = chunk.pages
    kinds = tuple([(p.kind, p.encoding) for p in pages])
    key = (id(chunk.leaf), kinds)
    t = heads.get(key)
    if t is None:
        t = heads[key] = column_template(chunk.leaf, codec, kinds)
    num_values = uncompressed = 0
    first_data = None
    for p in pages:
        uncompressed += p.uncompressed + p.data_start - p.start
        if p.kind != DICTIONARY_PAGE:
            num_values += p.num_values
            if first_data is None:
                first_data = p
    compressed = pages[-1].end - pages[0].start
    out += t.head
    out.append(I64_NEXT)
    _put_zz(out, num_values)
    out.append(I64_NEXT)
    _put_zz(out, uncompressed)
    out.append(I64_NEXT)
    _put_zz(out, compressed)
    out.append(I64_SKIP1)  # field 9
    _put_zz(out, first_data.start)
    last = 9
    if pages[0].kind == DICTIONARY_PAGE:
        out.append(I64_SKIP1)  # field 11
        _put_zz(out, pages[0].start)
        last = 11
    stats = _merged_stats(chunk)
    if stats is not None:
        out.append((12 - last) << 4 | tc.STRUCT)
        out += stats
        last = 12
    out += t.tails[last]
    return uncompressed, compressed


def group_meta(g: RowGroup, codec: int, heads: dict) -> bytes:
    """The encoded ``RowGroup`` struct of a whole row group: its ``ColumnChunk``s (file_offset
    0 as pyarrow writes it, then the metadata), total bytes, rows, file offset, compressed
    bytes."""
    out = bytearray()
    tc.put_field(out, 1, tc.LIST)
    tc.put_list(out, len(g.chunks), tc.STRUCT)
    total = total_compressed = 0
    for c in g.chunks:
        out += CHUNK_HEAD  # file_offset 0, meta_data
        u, comp = _column_meta(out, c, codec, heads)
        out.append(0)
        total += u
        total_compressed += comp
    for delta, value in ((1, total), (1, g.num_rows), (2, g.start), (1, total_compressed)):
        tc.put_field(out, delta, tc.I64)  # fields 2, 3, 5, 6
        tc.put_int(out, value)
    out.append(0)
    return bytes(out)


CHUNK_HEAD = bytes([2 << 4 | tc.I64, 0, 1 << 4 | tc.STRUCT])


__all__ = ["ColumnTemplate", "column_template", "group_meta"]
