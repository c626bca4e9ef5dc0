"""Row groups read a window at a time under footers of their own (core/parquet_window.py), on
footer-less files LeRobot's recorder leaves (one row group per episode): the same tables as
``pq.read_table`` of the closed file, and no footer of every row group is ever parsed."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core import parquet_salvage as ps
from episodekit.core import parquet_window as pw
from tests.core.test_parquet_salvage import SCHEMA, record


def crash(tmp_path, lengths):
    """A closed file and the footer-less copy its writer left, with the walk of the copy."""
    full, crashed = tmp_path / "full.parquet", tmp_path / "crash.parquet"
    record(full, lengths, keep_open_copy=crashed)
    template = ps.schema_template(SCHEMA)
    return full, crashed, template, ps.scan(crashed, template)


@pytest.mark.parametrize(
    ("rows", "chunks"),
    [(1, 10**6), (25, 10**6), (10**6, 10**6), (10**6, 1), (10**6, 25), (64 * 1024, 16 * 1024)],
)
def test_windows_read_what_read_table_reads(tmp_path, rows, chunks):
    lengths = [3, 1, 10, 7, 2, 9, 4, 1, 1, 12] * 5  # 50 row groups
    full, crashed, template, s = crash(tmp_path, lengths)
    w = ps.windows(crashed, s, template)
    wins = w.windows(rows, chunks)
    assert [i for win in wins for i in win] == list(range(len(lengths)))  # each group once
    assert all(len(win) >= 1 for win in wins)
    if chunks < w.num_columns:
        assert all(len(win) == 1 for win in wins)  # one row group at least, never more
    expect = pq.read_table(full)
    parts = list(w.tables(rows=rows, chunks=chunks))
    assert len(parts) == len(wins)
    assert pa.concat_tables(parts).equals(expect)
    assert w.read_all().equals(expect)
    assert w.read_all(["index", "tags"]).equals(expect.select(["index", "tags"]))
    assert w.schema.equals(pq.read_schema(full), check_metadata=True)
    # a window's footer lists its row groups alone, the file's rows in them
    win = wins[len(wins) // 2]
    meta = w.metadata(win)
    assert meta.num_row_groups == len(win)
    assert [meta.row_group(i).num_rows for i in range(len(win))] == [lengths[i] for i in win]
    first = sum(lengths[: win.start])
    n = sum(lengths[win.start : win.stop])
    assert w.read(win).equals(expect.slice(first, n))


def test_window_larger_than_the_file_and_a_single_row_group(tmp_path):
    full, crashed, template, s = crash(tmp_path, [40])
    w = ps.windows(crashed, s, template)
    assert w.windows() == [range(0, 1)]
    assert w.read_all().equals(pq.read_table(full))
    assert w.num_rows == 40 and w.num_row_groups == 1


def test_a_file_with_no_whole_row_group(tmp_path):
    path = tmp_path / "empty.parquet"
    path.write_bytes(b"PAR1")  # a writer that died before its first row group
    template = ps.schema_template(SCHEMA)
    s = ps.scan(path, template, 1)
    w = ps.windows(path, s, template)
    assert w.windows() == [] and w.num_rows == 0
    assert w.read_all().equals(SCHEMA.empty_table())
    assert w.read_all(["index"]).schema.names == ["index"]
    assert list(w.tables()) == []


def test_no_footer_of_every_row_group_is_parsed(tmp_path, monkeypatch):
    """Reading a 200-group file by windows of 16 groups never has pyarrow parse a footer
    listing more than one window's row groups (the memory of a recording of many episodes)."""
    lengths = [2] * 200
    full, crashed, template, s = crash(tmp_path, lengths)
    parsed = []
    real = pw.parse_footer

    def counting(footer):
        meta = real(footer)
        parsed.append(meta.num_row_groups)
        return meta

    monkeypatch.setattr(pw, "parse_footer", counting)
    w = ps.windows(crashed, s, template)
    got = pa.concat_tables(list(w.tables(rows=32)))
    assert got.equals(pq.read_table(full))
    assert parsed and max(parsed) == 16 and sum(parsed) == 200


def test_footer_parts_write_the_footer_and_are_checked(tmp_path):
    lengths = [5] * 40 + [3]
    full, crashed, template, s = crash(tmp_path, lengths)
    assert b"".join(ps.footer_parts(template, s)) == ps.footer(template, s)
    out = tmp_path / "out.parquet"
    ps.write_salvaged(crashed, out, s, template)
    assert pq.read_table(out).equals(pq.read_table(full))
    assert ps.footer_matches(out, s, template)
    data = bytearray(out.read_bytes())
    at = len(data) - 20  # one byte of the footer changed: no longer the one planned
    data[at] ^= 0xFF
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(data))
    assert not ps.footer_matches(bad, s, template)
    short = tmp_path / "short.parquet"
    short.write_bytes(out.read_bytes()[: s.end + 4])
    assert not ps.footer_matches(short, s, template)
    assert not ps.footer_matches(crashed, s, template)  # no footer at all


def test_an_empty_salvage_writes_a_readable_empty_file(tmp_path):
    path = tmp_path / "empty.parquet"
    path.write_bytes(b"PAR1")
    template = ps.schema_template(SCHEMA)
    s = ps.scan(path, template, 1)
    out = tmp_path / "out.parquet"
    ps.write_salvaged(path, out, s, template)
    assert pq.read_table(out).equals(SCHEMA.empty_table())
    assert ps.footer_matches(out, s, template)
    assert os.path.getsize(out) == 4 + len(ps.footer(template, s)) + 8
    assert np.array_equal(ps.group_rows(s), np.zeros(0, np.int64))


def test_places_keep_what_a_report_says_and_refuse_to_be_read(tmp_path):
    full, crashed, template, s = crash(tmp_path, [4, 6, 5])
    p = s.places()
    assert (p.num_rows, p.end, p.dropped_bytes, p.stop) == (
        s.num_rows,
        s.end,
        s.dropped_bytes,
        s.stop,
    )
    assert len(p.row_groups) == 3 and all(g.meta == b"" for g in p.row_groups)
    with pytest.raises(ValueError, match="dropped"):
        ps.windows(crashed, p, template)
    with pytest.raises(ValueError, match="dropped"):
        list(ps.footer_parts(template, p))
    with pytest.raises(ValueError, match="dropped"):
        ps.footer(template, p)


@pytest.mark.parametrize("a_pass", [1, 2, 100])
def test_read_combined_is_the_file_in_one_chunk_a_column(tmp_path, monkeypatch, a_pass):
    """Read a few columns at a time over many windows, then combined: the same table (schema
    and its metadata too) as the closed file's, one chunk a column."""
    monkeypatch.setattr(pw, "WINDOW_CHUNKS", 12)  # a few row groups a window
    lengths = [3, 1, 10, 7, 2, 9, 4, 1, 1, 12] * 3
    full, crashed, template, s = crash(tmp_path, lengths)
    w = ps.windows(crashed, s, template)
    assert len(w.windows()) > 5 and w.read_all().column(0).num_chunks > 5
    got = w.read_combined(a_pass)
    expect = pq.read_table(full)
    assert got.equals(expect) and got.schema.equals(expect.schema, check_metadata=True)
    assert all(c.num_chunks == 1 for c in got.columns)
