"""The data-file layer (core/parquet_read.py, core/parquet_write.py): one error policy naming the
file, handles always closed, footers read once, and the row-group writer's plan and marker."""

from __future__ import annotations

import os
import time
from pathlib import Path

import fsspec
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core import parquet_read as pr
from episodekit.core.band import MARKER_KEY
from episodekit.core.checksum import TableChecksum
from episodekit.core.errors import DatasetError, EnvironmentProblem, MissingFileError
from episodekit.core.footer import file_layout
from episodekit.core.parquet_write import (
    RowGroupPlanError,
    RowGroupWriter,
    VerificationError,
    verify_written,
)

ROWS = 4000


def _table(n: int = ROWS) -> pa.Table:
    ep = np.repeat(np.arange(n // 100), 100)
    return pa.table(
        {
            "index": np.arange(n, dtype=np.int64),
            "episode_index": ep.astype(np.int64),
            "value": np.random.default_rng(0).random(n),
        }
    ).replace_schema_metadata({"huggingface": "{}"})


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.parquet"
    pq.write_table(_table(), path, row_group_size=1000)
    return path


def _open_paths() -> set[str]:
    return {f.path for f in psutil.Process().open_files()}


def _all_reads(path: str, fs=None) -> list:
    """Every way the layer reads a file, as callables."""

    def batches():
        with pr.open_data_file(path, fs) as df:
            return list(df.batches(500))

    def row_group():
        with pr.open_data_file(path, fs) as df:
            return df.read_row_group(0)

    return [
        lambda: pr.read_footer(path, fs),
        lambda: pr.read_schema(fs, path),
        lambda: pr.read_table(fs, path),
        batches,
        row_group,
    ]


@pytest.fixture(autouse=True)
def _fresh_cache():
    pr.forget_footers()
    yield
    pr.forget_footers()


def test_missing_file_is_our_missing_file_error_naming_it(tmp_path):
    path = str(tmp_path / "absent.parquet")
    for read in _all_reads(path):
        with pytest.raises(MissingFileError) as info:
            read()
        assert str(info.value).startswith(path + ": ")


def test_garbage_file_is_a_dataset_error_naming_it(tmp_path):
    path = tmp_path / "garbage.parquet"
    path.write_bytes(b"not parquet at all" * 100)
    for read in _all_reads(str(path)):
        with pytest.raises(DatasetError, match="unreadable parquet") as info:
            read()
        assert str(info.value).startswith(f"{path}: ")
        assert not isinstance(info.value, MissingFileError)


def test_truncated_file_is_a_dataset_error_naming_it(good, tmp_path):
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # no footer: a killed writer
    for read in _all_reads(str(cut)):
        with pytest.raises(DatasetError) as info:
            read()
        assert str(info.value).startswith(f"{cut}: ")


def test_corrupt_data_page_fails_the_read_with_the_path(good, tmp_path):
    """A readable footer over damaged pages: the batches themselves raise our error."""
    meta = pq.read_metadata(good)
    col = meta.row_group(2).column(2)  # the float column of a middle row group
    start = col.data_page_offset
    raw = bytearray(good.read_bytes())
    raw[start : start + 64] = os.urandom(64)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(bytes(raw))
    with pr.open_data_file(str(bad)) as df:
        assert df.num_rows == ROWS  # the footer is fine
        with pytest.raises(DatasetError) as info:
            for _ in df.batches(500):
                pass
    assert str(info.value).startswith(f"{bad}: ")


def test_permission_denied_is_an_environment_problem(good):
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    good.chmod(0)
    try:
        with pytest.raises(EnvironmentProblem) as info:
            pr.read_footer(str(good))
        assert str(info.value).startswith(f"{good}: cannot read")
    finally:
        good.chmod(0o644)


def test_local_handles_are_closed_after_use_and_after_an_error(good):
    path = str(good)
    before = _open_paths()
    with pr.open_data_file(path, stream=True) as df:
        next(df.batches(100))
    with pytest.raises(RuntimeError):
        with pr.open_data_file(path) as df:
            df.read_row_group(1)
            raise RuntimeError("the caller fails mid-read")
    assert path not in _open_paths() - before
    pr.read_table(None, path)
    # pyarrow's whole-table read closes the file from an IO thread, just after it returns
    for _ in range(100):
        if path not in _open_paths() - before:
            break
        time.sleep(0.02)
    assert path not in _open_paths() - before


def test_remote_handles_are_closed_after_use_and_after_an_error(good, monkeypatch):
    fs = fsspec.filesystem("memory")
    path = "/layer-test/good.parquet"
    fs.pipe(path, good.read_bytes())
    handed, closed = [], set()
    real_open = fs.open

    def recording_open(p, mode="rb", **kw):  # a memory file cannot close: count the calls
        fh = real_open(p, mode, **kw)
        handed.append(fh)
        fh.close = lambda: closed.add(id(fh))
        return fh

    monkeypatch.setattr(fs, "open", recording_open)
    with pr.open_data_file(path, fs) as df:
        assert sum(b.num_rows for b in df.batches(700)) == ROWS
    with pytest.raises(RuntimeError):
        with pr.open_data_file(path, fs) as df:
            raise RuntimeError("the caller fails mid-read")
    assert pr.read_table(fs, path).num_rows == ROWS
    assert pr.read_schema(fs, path).names == _table().schema.names
    fs.pipe("/layer-test/bad.parquet", b"garbage" * 50)
    with pytest.raises(DatasetError, match="bad.parquet: unreadable parquet"):
        pr.open_data_file("/layer-test/bad.parquet", fs)
    assert len(handed) >= 5 and {id(fh) for fh in handed} == closed
    fs.rm("/layer-test", recursive=True)


def test_a_footer_is_read_once_until_the_file_changes(good, tmp_path):
    path = str(good)
    n0 = pr.footer_reads()
    file_layout(path)
    with pr.open_data_file(path) as df:
        assert df.num_rows == ROWS
    pr.read_schema(None, path)
    file_layout(path)
    assert pr.footer_reads() == n0 + 1
    other = tmp_path / "other.parquet"
    pq.write_table(_table(2000), other)
    os.replace(other, good)  # a rewrite: the same name, another file
    assert pr.read_footer(path).num_rows == 2000
    assert pr.footer_reads() == n0 + 2


def test_row_group_writer_cuts_batches_at_the_plan_and_marks_the_file(tmp_path):
    table = _table()
    plan = np.array([700, 1300, 2000])
    out = tmp_path / "out.parquet"
    seen = []
    with RowGroupWriter(out, table.schema, plan, marker='{"x": 1}', on_group=seen.append) as w:
        for batch in table.to_batches(max_chunksize=333):  # batches cross the plan's cuts
            w.write(batch)
        w.finish()
    meta = pq.read_metadata(out)
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == plan.tolist()
    assert [t.num_rows for t in seen] == plan.tolist()
    layout = file_layout(str(out))
    assert layout.has_page_index and layout.key_value[MARKER_KEY] == '{"x": 1}'
    assert pq.read_table(out).equals(table, check_metadata=True)
    expected = TableChecksum()
    expected.update(table)
    assert verify_written(str(out), table.schema, plan, expected, 1000).num_rows == ROWS


def test_row_group_writer_refuses_an_unfilled_plan_and_writes_no_marker(tmp_path):
    table = _table()
    out = tmp_path / "short.parquet"
    with pytest.raises(RowGroupPlanError, match="inside planned row group 1"):
        with RowGroupWriter(out, table.schema, [1000, 5000], marker="{}") as w:
            w.write(table.to_batches()[0])
            w.finish()
    assert MARKER_KEY not in file_layout(str(out)).key_value
    with pytest.raises(RowGroupPlanError, match="more rows"):
        with RowGroupWriter(tmp_path / "long.parquet", table.schema, [10]) as w:
            w.write(table.to_batches()[0])


def test_verify_written_catches_a_changed_value(tmp_path):
    table = _table()
    out = tmp_path / "out.parquet"
    with RowGroupWriter(out, table.schema, [ROWS]) as w:
        w.write_group(table)
        w.finish()
    other = table.set_column(2, "value", pa.array(np.zeros(ROWS)))
    expected = TableChecksum()
    expected.update(other)
    with pytest.raises(VerificationError, match=r"columns \['value'\]"):
        verify_written(str(out), table.schema, np.array([ROWS]), expected, 1000)
