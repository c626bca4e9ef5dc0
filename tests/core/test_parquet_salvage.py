"""Footer-less parquet files come back bit-exactly (core/parquet_salvage.py), on files pyarrow
writes the way LeRobot's recorder does (an open ParquetWriter, one row group per episode) and on
complete files cut at every kind of place."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core import parquet_pages as pp
from episodekit.core import parquet_regular as pr
from episodekit.core import parquet_salvage as ps
from episodekit.core import thrift_compact as tc

SCHEMA = pa.schema(
    [
        ("observation.state", pa.list_(pa.float32(), 6)),
        ("timestamp", pa.float32()),
        ("frame_index", pa.int64()),
        ("episode_index", pa.int64()),
        ("index", pa.int64()),
        ("task_index", pa.int64()),
        ("done", pa.bool_()),
        ("tags", pa.list_(pa.string())),
        ("nested", pa.list_(pa.list_(pa.int32()))),
        ("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
    ],
    metadata={"huggingface": '{"info": {"features": {}}}'},
)


def episode(ep: int, start: int, n: int, rng: np.random.Generator) -> pa.Table:
    state = np.cumsum(rng.normal(0, 0.01, (n, 6)).astype(np.float32), axis=0)
    nested = [[list(range(i % 3)), []] if i % 5 else None for i in range(n)]
    return pa.table(
        {
            "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), 6),
            "timestamp": pa.array((np.arange(n) / 30).astype(np.float32)),
            "frame_index": pa.array(np.arange(n)),
            "episode_index": pa.array(np.full(n, ep)),
            "index": pa.array(np.arange(start, start + n)),
            "task_index": pa.array(np.full(n, ep % 3)),
            "done": pa.array(np.arange(n) == n - 1),
            "tags": pa.array([["a", f"t{ep}"] if i % 7 else [] for i in range(n)]),
            "nested": pa.array(nested, pa.list_(pa.list_(pa.int32()))),
            "image": pa.array(
                [{"bytes": rng.bytes(20 + i % 9), "path": None} for i in range(n)],
                SCHEMA.field("image").type,
            ),
        },
        schema=SCHEMA,
    )


def record(path, lengths, seed=0, keep_open_copy=None, **writer) -> list[pa.Table]:
    """Write one row group per episode like LeRobot's recorder; ``keep_open_copy``: copy the
    file there before ``close()`` (what a killed recorder leaves)."""
    rng = np.random.default_rng(seed)
    opts = {"compression": "snappy", "use_dictionary": True, **writer}
    tables, start = [], 0
    with pq.ParquetWriter(path, SCHEMA, **opts) as w:
        for ep, n in enumerate(lengths):
            t = episode(ep, start, n, rng)
            w.write_table(t)
            tables.append(t)
            start += n
        if keep_open_copy:
            shutil.copyfile(path, keep_open_copy)
    return tables


def salvage_to(src, dst, template=None) -> ps.Salvage:
    template = template or ps.schema_template(SCHEMA)
    s = ps.scan(src, template)
    ps.write_salvaged(src, dst, s, template)
    return s


def without_size_stats(meta: tc.Struct) -> tc.Struct:
    """A decoded footer without the size statistics (level histograms are not rebuilt)."""
    meta = dict(meta)
    groups = []
    for g in meta[4][1][1]:
        g = dict(g)
        chunks = []
        for c in g[1][1][1]:
            c = dict(c)
            m = dict(c[3][1])
            m.pop(16, None)
            c[3] = (tc.STRUCT, m)
            chunks.append(c)
        g[1] = (tc.LIST, (tc.STRUCT, chunks))
        groups.append(g)
    meta[4] = (tc.LIST, (tc.STRUCT, groups))
    return meta


def test_unclosed_writer_comes_back_bit_exact(tmp_path):
    lengths = [30, 1, 57, 200, 12]
    full, crashed, out = tmp_path / "full.parquet", tmp_path / "crash.parquet", tmp_path / "o.pq"
    tables = record(full, lengths, keep_open_copy=crashed)
    with pytest.raises(pa.ArrowInvalid):  # what LeRobot and every reader meet
        pq.read_metadata(crashed)
    s = salvage_to(crashed, out)
    assert [g.num_rows for g in s.row_groups] == lengths
    assert s.stop == pp.END and s.dropped_bytes == 0
    got = pq.read_table(out)
    assert got.equals(pa.concat_tables(tables))
    assert got.schema.equals(pq.read_schema(full), check_metadata=True)
    # the footer is the one pyarrow wrote on close (level histograms aside), and the data bytes
    # are the closed file's
    assert without_size_stats(ps.read_template(out)) == without_size_stats(ps.read_template(full))
    assert out.read_bytes()[: s.end] == full.read_bytes()[: s.end]
    # read in place (nothing written) gives the same rows
    with ps.open_salvaged(crashed, s, ps.schema_template(SCHEMA)) as pf:
        assert pf.read().equals(got)
        assert [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)] == lengths


@pytest.mark.parametrize(
    "writer",
    [
        {"compression": "zstd"},
        {"compression": "gzip", "use_dictionary": False},
        {"compression": "none", "data_page_version": "2.0"},
        {"compression": "lz4", "data_page_size": 512, "use_dictionary": False},  # many pages
        {"compression": "snappy", "data_page_size": 300, "write_page_checksum": True},
    ],
)
def test_writer_options(tmp_path, writer):
    full, out = tmp_path / "full.parquet", tmp_path / "out.parquet"
    tables = record(full, [40, 3, 90], seed=1, **writer)
    s = salvage_to(full, out)  # a complete file: its footer is no page; ignored and rebuilt
    assert s.stop == pp.NOT_A_PAGE
    assert pq.read_table(out).equals(pa.concat_tables(tables))
    # statistics merged from several pages equal what the writer put in the footer
    a, b = pq.read_metadata(out), pq.read_metadata(full)
    for g in range(b.num_row_groups):
        for c in range(b.num_columns):
            x, y = a.row_group(g).column(c), b.row_group(g).column(c)
            assert (x.num_values, x.data_page_offset, x.total_compressed_size) == (
                y.num_values,
                y.data_page_offset,
                y.total_compressed_size,
            )
            if y.is_stats_set and y.statistics.has_min_max:
                assert x.statistics.equals(y.statistics), (g, c)


def chunk_range(meta: pq.FileMetaData, g: int, c: int) -> tuple[int, int]:
    col = meta.row_group(g).column(c)
    start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
    return start, start + col.total_compressed_size


def row_group_ends(path) -> list[int]:
    meta = pq.read_metadata(path)
    return [chunk_range(meta, g, meta.num_columns - 1)[1] for g in range(meta.num_row_groups)]


def cut_points(path) -> dict[str, list[int]]:
    """Offsets that fall inside a page header, inside a page, between row groups and inside
    the footer of a complete file (of three row groups or more)."""
    meta = pq.read_metadata(path)
    ends = row_group_ends(path)
    second = meta.row_group(1).column(2)
    size = os.path.getsize(path)
    return {
        "between row groups": [ends[0], ends[1]],
        "inside a page header": [second.data_page_offset + 3],
        "inside a page": [chunk_range(meta, 1, 2)[1] - 5],
        "inside the footer": [size - 8 - meta.serialized_size // 2, size - 5],
    }


def test_cut_files(tmp_path):
    full = tmp_path / "full.parquet"
    tables = record(full, [25, 33, 41], seed=2)
    data = full.read_bytes()
    ends = row_group_ends(full)
    for where, offsets in cut_points(full).items():
        for cut in offsets:
            src, out = tmp_path / "cut.parquet", tmp_path / "out.parquet"
            src.write_bytes(data[:cut])
            s = salvage_to(src, out)
            whole = sum(e <= cut for e in ends)  # row groups written before the cut
            assert len(s.row_groups) == whole, (where, cut, s.stop)
            assert s.end == (ends[whole - 1] if whole else 4)
            assert s.dropped_bytes == cut - s.end
            assert pq.read_table(out).equals(pa.concat_tables(tables[:whole])), where


def test_cut_reasons(tmp_path):
    full = tmp_path / "full.parquet"
    record(full, [25, 33], seed=3)
    data = full.read_bytes()
    points = cut_points(full)
    src = tmp_path / "cut.parquet"
    src.write_bytes(data[: points["inside a page header"][0]])
    assert ps.scan(src, ps.schema_template(SCHEMA)).stop == pp.CUT_HEADER
    src.write_bytes(data[: points["inside a page"][0]])
    assert ps.scan(src, ps.schema_template(SCHEMA)).stop == pp.CUT_PAGE


def test_empty_and_foreign_files(tmp_path):
    template = ps.schema_template(SCHEMA)
    just_magic = tmp_path / "magic.parquet"
    just_magic.write_bytes(b"PAR1")  # a recorder killed before its first episode
    s = ps.scan(just_magic, template)
    assert s.row_groups == [] and s.num_rows == 0
    out = tmp_path / "out.parquet"
    ps.write_salvaged(just_magic, out, s, template)
    assert pq.read_table(out).num_rows == 0
    other = tmp_path / "x.parquet"
    other.write_bytes(b"hello world, not parquet")
    with pytest.raises(ps.SalvageError):
        ps.scan(other, template)


def test_wrong_schema_recovers_nothing(tmp_path):
    """A template whose columns are not the file's finds no whole row group, never garbage."""
    crashed = tmp_path / "c.parquet"
    record(tmp_path / "f.parquet", [20, 20], keep_open_copy=crashed)
    other = pa.schema([("a", pa.list_(pa.int64())), ("b", pa.int64())])
    s = ps.scan(crashed, ps.schema_template(other))
    assert s.num_rows == 0


def test_thrift_roundtrip_and_garbage(tmp_path):
    full = tmp_path / "full.parquet"
    record(full, [10, 10])
    data = full.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    raw = data[-8 - n : -8]
    meta, used = tc.decode(raw)
    assert used == n and tc.encode(meta) == raw
    with pytest.raises(tc.CutShort):
        tc.decode(raw[: n // 2])
    rng = np.random.default_rng(0)
    for _ in range(200):  # random bytes: an error or a struct, never a hang or a crash
        try:
            tc.decode(rng.bytes(64))
        except tc.ThriftError:
            pass


def test_zero_levels():
    # runs: RLE run of 5 zeros, bit-packed group of 8 values 0,1,1,1,0,1,1,1 (width 1)
    buf = bytes([5 << 1, 0, (1 << 1) | 1, 0b11101110])
    assert pp.zero_levels(memoryview(buf), 1, 13) == 7
    assert pp.zero_levels(memoryview(buf), 1, 7) == 6
    # width 2: bit-packed 8 values 0,1,2,0,3,0,1,2 -> 3 zeros
    vals = [0, 1, 2, 0, 3, 0, 1, 2]
    packed = sum(v << (2 * i) for i, v in enumerate(vals)).to_bytes(2, "little")
    assert pp.zero_levels(memoryview(bytes([3]) + packed), 2, 8) == 3
    with pytest.raises(pp.NotAPage):
        pp.zero_levels(memoryview(bytes([5 << 1])), 1, 5)


# LeRobot's recorder layout: every column dictionary-encoded (no bool), one row group per episode
RECORDER = pa.schema([f for f in SCHEMA if f.name not in ("done", "image")])


def _scan_both(monkeypatch, path) -> tuple[ps.Salvage, ps.Salvage, int]:
    """``path`` scanned with the regular-group walk, and with the generic walk only; how many
    row groups the regular walk read."""
    template = ps.schema_template(RECORDER)
    regular = ps._regular_group
    taken = []

    def counted(*args):
        got = regular(*args)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(ps, "_regular_group", counted)
    fast = ps.scan(path, template)
    monkeypatch.setattr(ps, "_is_regular", lambda group: False)
    slow = ps.scan(path, template)
    monkeypatch.undo()
    return fast, slow, sum(taken)


@pytest.mark.parametrize(
    "lengths, writer, regular",
    [
        # every group but the first and the last (its last column is a list and no dictionary
        # page follows it: the generic walk counts its rows from the levels)
        ([25, 33, 41, 8, 60, 1], {}, 4),
        ([25, 33, 3000, 41, 7], {"data_page_size": 4096}, 1),  # a group of several pages a chunk
        ([20, 30, 40], {"write_page_checksum": True, "compression": "zstd"}, 1),
    ],
)
def test_regular_groups_are_read_as_the_generic_walk_reads_them(
    tmp_path, monkeypatch, lengths, writer, regular
):
    """The walk that reads a recorder's row group page after page (no chunk boundary searched)
    finds, on the whole file and cut at offsets all over it, exactly what the generic walk
    finds: the same row groups, footer entries, end and reason to stop."""
    full = tmp_path / "full.parquet"
    rng = np.random.default_rng(5)
    with pq.ParquetWriter(full, RECORDER, **{"compression": "snappy", **writer}) as w:
        start = 0
        for ep, n in enumerate(lengths):
            w.write_table(episode(ep, start, n, rng).select(RECORDER.names))
            start += n
    fast, slow, taken = _scan_both(monkeypatch, full)
    assert fast == slow and len(fast.row_groups) == len(lengths)
    assert taken >= regular  # (the regular walk did read groups)
    data = full.read_bytes()
    ends = row_group_ends(full)
    src = tmp_path / "cut.parquet"
    step = max(61, len(data) // 100)  # (about 100 cuts a file, a prime step apart at least)
    for cut in sorted({*range(5, len(data), step), *(e + d for e in ends for d in (-1, 0, 1, 3))}):
        src.write_bytes(data[:cut])
        fast, slow, _ = _scan_both(monkeypatch, src)
        assert fast == slow, cut
        assert len(fast.row_groups) == sum(e <= cut for e in ends), cut


def test_a_regular_group_whose_columns_disagree_on_its_rows_ends_the_walk(tmp_path, monkeypatch):
    """One flat column of the second row group claims a row more than the others (its data
    page header's num_values changed in place): both walks stop before that group."""
    full = tmp_path / "full.parquet"
    rng = np.random.default_rng(6)
    with pq.ParquetWriter(full, RECORDER, compression="snappy") as w:
        start = 0
        for ep, n in enumerate([20, 33, 40, 25]):
            w.write_table(episode(ep, start, n, rng).select(RECORDER.names))
            start += n
    meta = pq.read_metadata(full)
    at = meta.row_group(2).column(RECORDER.names.index("timestamp")).data_page_offset
    data = bytearray(full.read_bytes())
    head = bytes(data[at : at + 40])
    pos = at + head.rindex(bytes([0x15, 2 * 40]))  # DataPageHeader.num_values = 40 (zigzag)
    data[pos + 1] = 2 * 41
    src = tmp_path / "bad.parquet"
    src.write_bytes(bytes(data))
    fast, slow, taken = _scan_both(monkeypatch, src)
    assert fast == slow and taken == 1  # the second group read page after page, not the third
    assert len(fast.row_groups) == 2 and fast.stop == "column chunks do not line up"


def test_regular_walk_steps_over_string_statistics_and_leaves_long_ones_to_the_generic_walk(
    tmp_path, monkeypatch
):
    """A column of strings has statistics of no fixed width: the regular walk steps over them
    (short strings) or hands the group to the generic walk (a min or max of 128 bytes or more,
    whose length takes two bytes); either way the same footer entries, whole and cut."""
    full = tmp_path / "full.parquet"
    rng = np.random.default_rng(7)
    with pq.ParquetWriter(full, RECORDER, compression="snappy") as w:
        start = 0
        for ep, n in enumerate([20, 30, 25, 40, 22]):
            t = episode(ep, start, n, rng).select(RECORDER.names)
            if ep == 3:  # one group whose tags' statistics are 200 bytes long
                tags = pa.array([["z" * 200, "a"] for _ in range(n)], RECORDER.field("tags").type)
                t = t.set_column(RECORDER.names.index("tags"), "tags", tags)
            w.write_table(t)
            start += n
    fast, slow, taken = _scan_both(monkeypatch, full)
    assert fast == slow and len(fast.row_groups) == 5
    assert taken == 2  # groups 1 and 2; group 3 is the generic walk's, then group 4 again
    assert pq.read_metadata(full).row_group(3).column(6).statistics.max == "z" * 200
    data = full.read_bytes()
    src = tmp_path / "cut.parquet"
    for cut in range(len(data) - 400, len(data), 7):
        src.write_bytes(data[:cut])
        fast, slow, _ = _scan_both(monkeypatch, src)
        assert fast == slow, cut


def test_a_regular_group_with_a_bad_checksum_ends_the_walk(tmp_path, monkeypatch):
    """A page of the third row group whose bytes no longer match its CRC: neither walk keeps
    that group (the regular walk checks checksums as the generic one does)."""
    full = tmp_path / "full.parquet"
    rng = np.random.default_rng(8)
    with pq.ParquetWriter(full, RECORDER, compression="zstd", write_page_checksum=True) as w:
        start = 0
        for ep, n in enumerate([20, 33, 40, 25]):
            w.write_table(episode(ep, start, n, rng).select(RECORDER.names))
            start += n
    col = pq.read_metadata(full).row_group(2).column(RECORDER.names.index("index"))
    data = bytearray(full.read_bytes())
    data[col.data_page_offset + col.total_compressed_size // 2 - 30] ^= 0xFF  # in its page
    src = tmp_path / "bad.parquet"
    src.write_bytes(bytes(data))
    fast, slow, taken = _scan_both(monkeypatch, src)
    assert fast == slow and taken == 1
    assert len(fast.row_groups) == 2 and fast.stop == pp.BAD_CRC


def test_varint_tables_encode_and_decode_as_the_compact_protocol_does():
    """The regular walk's lookup tables (numbers decoded from header bytes, footer numbers
    encoded) agree with the Thrift codec, at every table's edges and beyond."""
    codes = pr.codes()
    edges = [0, 1, 63, 64, 127, 128, 8191, 8192, 8193, (1 << 13) + 5, (1 << 14) - 1, 1 << 14]
    edges += [(1 << 20) + 3, (1 << 27) - 1, 1 << 27, (1 << 27) + 1, 1 << 40, (1 << 62) + 7]
    for n in edges:
        want = bytearray()
        tc.put_int(want, n)
        assert pr._zz(n, codes) == bytes(want), n
        for value in (n, -n, -n - 1):
            raw = bytearray()
            tc.put_int(raw, value)
            if -(1 << 63) <= value < 1 << 63:
                assert codes.zigzag[bytes(raw)] == value, value
    small = [bytes([tc.I64 | 1 << 4]) + pr._zz(n, codes) for n in range(pr.SMALL)]
    assert codes.next_small == small
