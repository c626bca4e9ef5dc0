"""prep rowgroups: layout, exactness, idempotence, failure handling, --out and remote roots."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.band import (
    MARKER_KEY,
    band_violations,
    file_needs_rewrite,
    plan_row_groups,
    row_group_band,
)
from episodekit.core.checksum import TableChecksum, WordSum
from episodekit.core.dataset import open_dataset
from episodekit.core.footer import file_layout
from episodekit.core.parquet_write import RowGroupWriter
from episodekit.prep import rewrite as rw
from episodekit.prep import rewrite_rowgroups

MIB = 1024 * 1024
TARGET_MB = 0.25
SPECS = {
    "recorded": dict(episodes=60, style="recorded", data_files_size_in_mb=0.6, images=True),
    "edited": dict(episodes=60, style="edited", data_files_size_in_mb=0.6, extra_column=True),
    "v21": dict(episodes=12, version="v2.1"),
}


def _digest_files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".episodekit.lock"  # the writer lock (empty, kept)
    }


def _data_tables(root: Path) -> dict[str, pa.Table]:
    ds = open_dataset(str(root))
    return {rel: pq.read_table(root / rel) for rel in ds.data_files}


@pytest.mark.parametrize("kind", list(SPECS))
def test_rewrite_layout_and_exactness(make_sample, kind):
    root = make_sample(**SPECS[kind])
    before = _data_tables(root)
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=2)
    assert report.ok and report.count("rewritten") == len(before)
    target = int(TARGET_MB * MIB)
    lo, hi = row_group_band(target)
    multi_group_files = 0
    for rel, table in before.items():
        path = root / rel
        layout = file_layout(str(path))
        assert layout.has_page_index
        assert band_violations(layout, target) == [], rel
        # episode-aligned: no episode spans two row groups
        assert np.all(layout.episode_max[:-1] < layout.episode_min[1:])
        # within the band unless last group or a single (oversized) episode
        single = layout.episode_min == layout.episode_max
        inner = layout.row_group_bytes[:-1]
        assert np.all((inner >= lo) | single[:-1] | np.append(single[1:-1], True)), rel
        assert np.all((layout.row_group_bytes <= hi) | single), rel
        multi_group_files += layout.num_row_groups > 1
        # same rows, order, schema and schema metadata (huggingface byte for byte)
        after = pq.read_table(path)
        assert after.equals(table, check_metadata=True)
        assert after.schema.metadata[b"huggingface"] == table.schema.metadata[b"huggingface"]
        md = pq.read_metadata(path)
        assert json.loads(md.metadata[MARKER_KEY.encode()])["target_mb"] == TARGET_MB
        index_leaf = [md.schema.column(j).path for j in range(md.num_columns)].index("index")
        assert md.row_group(0).sorting_columns[0].column_index == index_leaf
        assert md.row_group(0).column(0).statistics.has_min_max
    if kind != "v21":
        assert multi_group_files >= 1
    # the dataset still opens with the same episodes -> file mapping
    assert open_dataset(str(root)).data_files == list(before)


def test_rerun_is_idempotent_and_force_redoes(make_sample):
    root = make_sample(**SPECS["recorded"])
    assert rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1).ok
    files = _digest_files(root)
    mtimes = {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet")}
    again = rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1)
    assert again.count("skipped") == len(again.files) and again.count("rewritten") == 0
    assert _digest_files(root) == files
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*.parquet")} == mtimes
    forced = rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1, force=True)
    assert forced.count("rewritten") == len(forced.files)
    assert _digest_files(root) == files  # deterministic output: same bytes
    # a different target is a different job
    other = rewrite_rowgroups(str(root), target_mb=TARGET_MB * 4, workers=1)
    assert other.count("rewritten") >= 1


def test_dry_run_changes_nothing(make_sample):
    root = make_sample(**SPECS["edited"])
    files = _digest_files(root)
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, dry_run=True)
    assert report.count("planned") == len(report.files) > 0
    assert all(r.reason for r in report.files)
    assert _digest_files(root) == files


def test_flipped_value_is_caught_and_original_kept(make_sample, monkeypatch):
    root = make_sample(**SPECS["edited"])
    files = _digest_files(root)
    real = RowGroupWriter.write_group
    calls = {"n": 0}

    def corrupting(writer, batches):
        calls["n"] += 1
        schema = writer.schema
        if calls["n"] == 1:  # flip one float of the first group of the first file
            t = pa.Table.from_batches(batches, schema=schema).combine_chunks()
            state = t["observation.state"].chunk(0)
            values = state.flatten().to_numpy().copy()
            values[3] += 1.0
            flipped = pa.FixedSizeListArray.from_arrays(pa.array(values), state.type.list_size)
            t = t.set_column(
                t.schema.get_field_index("observation.state"),
                schema.field("observation.state"),
                flipped,
            )
            batches = t.to_batches()
        real(writer, batches)

    monkeypatch.setattr(RowGroupWriter, "write_group", corrupting)
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1)
    assert len(report.failed) == 1
    bad = report.failed[0]
    assert "observation.state" in bad.reason and bad.path in bad.reason
    assert _digest_files(root)[bad.path] == files[bad.path]  # original untouched
    assert not [p for p in root.rglob(".*tmp-*")]  # no temporaries left
    assert report.count("rewritten") == len(report.files) - 1
    monkeypatch.setattr(RowGroupWriter, "write_group", real)
    assert rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1).count("rewritten") == 1


def test_failure_between_write_and_replace_keeps_original(make_sample, monkeypatch):
    root = make_sample(**SPECS["recorded"])
    before = _data_tables(root)
    files = _digest_files(root)
    real = rw.verify_written

    def crash(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError("simulated failure before replace")

    monkeypatch.setattr(rw, "verify_written", crash)
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1)
    assert len(report.failed) == len(report.files)
    assert "simulated failure" in report.failed[0].reason
    assert _digest_files(root) == files
    monkeypatch.setattr(rw, "verify_written", real)
    assert rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1).ok
    assert _data_tables(root).keys() == before.keys()
    for rel, t in _data_tables(root).items():
        assert t.equals(before[rel], check_metadata=True)


def test_corrupt_file_reported_others_complete(make_sample):
    root = make_sample(**SPECS["edited"])
    ds = open_dataset(str(root))
    bad = root / ds.data_files[1]
    bad.write_bytes(b"PAR1 this is not parquet" * 10)
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=2)
    assert [r.path for r in report.failed] == [ds.data_files[1]]
    assert str(bad) in report.failed[0].reason
    assert report.count("rewritten") == len(ds.data_files) - 1
    assert bad.read_bytes() == b"PAR1 this is not parquet" * 10
    assert not report.ok


def test_out_dir_from_memory_root(make_sample, tmp_path):
    src = make_sample(**SPECS["edited"], copy=False)
    fs = fsspec.filesystem("memory")
    fs.put(str(src), "/prep_src", recursive=True)
    url = "memory://prep_src"
    with pytest.raises(ValueError, match="out="):
        rewrite_rowgroups(url, target_mb=TARGET_MB)
    out = tmp_path / "out"
    report = rewrite_rowgroups(url, target_mb=TARGET_MB, out=str(out), workers=2)
    assert report.ok and report.count("rewritten") == len(report.files)
    ds_out = open_dataset(str(out))
    ds_src = open_dataset(str(src))
    assert ds_out.fingerprint == ds_src.fingerprint
    assert (out / "meta/info.json").read_bytes() == (src / "meta/info.json").read_bytes()
    for rel in ds_src.data_files:
        assert pq.read_table(out / rel).equals(pq.read_table(src / rel), check_metadata=True)
        assert file_layout(str(out / rel)).has_page_index
    again = rewrite_rowgroups(url, target_mb=TARGET_MB, out=str(out), workers=1)
    assert again.count("skipped") == len(again.files)
    fs.rm("/prep_src", recursive=True)


def test_out_dir_copies_done_files(make_sample, tmp_path):
    root = make_sample(**SPECS["recorded"])
    assert rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1).ok
    out = tmp_path / "copy"
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, out=str(out), workers=2)
    assert report.count("copied") == len(report.files)
    ds = open_dataset(str(root))
    for rel in ds.data_files:
        assert (out / rel).read_bytes() == (root / rel).read_bytes()
    assert not (out / "videos").exists()


def test_executors_give_identical_bytes(make_sample):
    a = make_sample(**SPECS["edited"])
    b = make_sample(**SPECS["edited"])
    rewrite_rowgroups(str(a), target_mb=TARGET_MB, workers=1)
    rewrite_rowgroups(str(b), target_mb=TARGET_MB, workers=2)
    assert _digest_files(a) == _digest_files(b)


def test_compression_option(make_sample):
    root = make_sample(**SPECS["edited"])
    assert rewrite_rowgroups(str(root), target_mb=TARGET_MB, compression="zstd").ok
    ds = open_dataset(str(root))
    assert file_layout(str(root / ds.data_files[0])).compression == "ZSTD"
    keep = rewrite_rowgroups(str(root), target_mb=TARGET_MB)  # keep: already done
    assert keep.count("skipped") == len(keep.files)
    back = rewrite_rowgroups(str(root), target_mb=TARGET_MB, compression="snappy")
    assert back.count("rewritten") == len(back.files)
    assert file_layout(str(root / ds.data_files[0])).compression == "SNAPPY"


def test_bad_arguments(make_sample):
    root = make_sample(**SPECS["v21"], copy=False)
    with pytest.raises(ValueError, match="target_mb"):
        rewrite_rowgroups(str(root), target_mb=0)
    with pytest.raises(ValueError, match="compression"):
        rewrite_rowgroups(str(root), compression="brotli9")


def test_plan_row_groups():
    target = 100
    # small episodes fill groups up to the target
    assert plan_row_groups(np.full(10, 30.0), target).tolist() == [3, 3, 4]
    # an oversized episode gets a group of its own
    assert plan_row_groups(np.array([30.0, 30, 400, 30, 30, 30]), target).tolist() == [2, 1, 3]
    # a small first group may grow to reach the band's lower edge
    assert plan_row_groups(np.array([10.0, 95, 95]), target).tolist() == [2, 1]
    assert plan_row_groups(np.array([7.0]), target).tolist() == [1]
    sizes = np.random.default_rng(0).lognormal(3, 1, 500)
    counts = plan_row_groups(sizes, target)
    assert counts.sum() == 500 and np.all(counts >= 1)


def _write(path: Path, table: pa.Table, rows_per_group: list[int], page_index: bool) -> None:
    with pq.ParquetWriter(path, table.schema, write_page_index=page_index) as w:
        start = 0
        for n in rows_per_group:
            w.write_table(table.slice(start, n), row_group_size=n)
            start += n


def test_file_needs_rewrite_from_footer(tmp_path):
    ep = np.repeat(np.arange(8), 1000)
    table = pa.table({"index": np.arange(len(ep)), "episode_index": ep, "x": np.ones(len(ep))})
    p = tmp_path / "f.parquet"
    _write(p, table, [2000] * 4, page_index=True)  # two episodes per group
    layout = file_layout(str(p))
    target = int(layout.row_group_bytes.mean())
    assert file_needs_rewrite(layout, target) is None  # within the band, no marker needed
    assert "compression" in file_needs_rewrite(layout, target, compression="zstd")
    _write(p, table, [2000] * 4, page_index=False)
    assert file_needs_rewrite(file_layout(str(p)), target) == "no page index"
    _write(p, table, [1500, 2500, 4000], page_index=True)  # splits episodes 1 and 3
    assert "share episode" in file_needs_rewrite(file_layout(str(p)), target)
    _write(p, table, [1000] * 8, page_index=True)  # one small group per episode
    assert "below" in file_needs_rewrite(file_layout(str(p)), target)
    _write(p, table, [8000], page_index=True)  # one huge group
    assert "MiB >" in file_needs_rewrite(file_layout(str(p)), target)


def _checksum(table: pa.Table, chunk: int) -> dict[str, str]:
    c = TableChecksum()
    for batch in table.to_batches(max_chunksize=chunk):
        c.update(batch)
    return c.digests()


def test_checksum_is_chunking_independent_and_sensitive():
    n = 1000
    rng = np.random.default_rng(0)
    vals = rng.standard_normal(n * 3).astype(np.float32)
    table = pa.table(
        {
            "state": pa.FixedSizeListArray.from_arrays(pa.array(vals), 3),
            "i": pa.array(np.arange(n), mask=np.arange(n) % 7 == 0),
            "s": pa.array([f"v{i % 13}" if i % 5 else None for i in range(n)]),
            "img": pa.StructArray.from_arrays(
                [pa.array([b"x" * (i % 4) for i in range(n)]), pa.nulls(n, pa.string())],
                names=["bytes", "path"],
            ),
            "events": pa.array([["a"] * (i % 3) for i in range(n)], pa.list_(pa.string())),
            "flag": pa.array(np.arange(n) % 2 == 0),
        }
    )
    ref = _checksum(table, 1000)
    assert ref == _checksum(table, 37) == _checksum(table.slice(0, n), 128)
    assert set(ref) == set(table.column_names)
    flipped = vals.copy()
    flipped[500] = np.nextafter(flipped[500], np.float32(10))
    t2 = table.set_column(0, "state", pa.FixedSizeListArray.from_arrays(pa.array(flipped), 3))
    d2 = _checksum(t2, 64)
    assert d2["state"] != ref["state"] and d2["i"] == ref["i"]
    # a null that becomes a value (same undefined bytes underneath) is caught
    t3 = table.set_column(1, "i", pa.array(np.arange(n)))
    assert _checksum(t3, 64)["i"] != ref["i"]
    # moving one string byte across a row boundary is caught (lengths are hashed)
    s = table["s"].to_pylist()
    s[1], s[2] = "v1v", "2"
    t4 = table.set_column(2, "s", pa.array(s))
    assert _checksum(t4, 64)["s"] != ref["s"]


def test_reader_untouched_by_leftover_temporaries(make_sample):
    root = make_sample(**SPECS["edited"])
    ds = open_dataset(str(root))
    tmp = root / Path(ds.data_files[0]).parent / f".file-000.parquet.tmp-{uuid.uuid4().hex}"
    shutil.copyfile(root / ds.data_files[0], tmp)
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, workers=1)
    assert report.removed_temporaries == 1 and not tmp.exists()


def test_word_sum_is_split_independent_and_catches_single_changes():
    rng = np.random.default_rng(1)
    data = rng.bytes(20_011)
    whole = WordSum()
    whole.update(data)
    for _ in range(10):
        cuts = np.sort(rng.integers(0, len(data), size=int(rng.integers(1, 20))))
        parts = WordSum()
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(data)]):
            parts.update(data[lo:hi])
        assert parts.digest() == whole.digest()
    for pos in (0, 7, 8, 9_999, len(data) - 1):
        changed = bytearray(data)
        changed[pos] ^= 0x80
        other = WordSum()
        other.update(bytes(changed))
        assert other.digest() != whole.digest(), pos
    swapped = bytearray(data)
    swapped[0:8], swapped[8:16] = data[8:16], data[0:8]
    other = WordSum()
    other.update(bytes(swapped))
    assert other.digest() != whole.digest()
