"""Reading LeRobot roots: both layouts, the fingerprint, and every bad-root error."""

from __future__ import annotations

import json
import shutil

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import (
    DatasetError,
    InconsistentDatasetError,
    MissingFileError,
    UnsupportedVersionError,
    compute_fingerprint,
    open_dataset,
)


def _episodes_file(root):
    return sorted((root / "meta/episodes").glob("*/*.parquet"))[0]


def _rewrite_episodes(root, fn):
    path = _episodes_file(root)
    t = pq.read_table(path)
    pq.write_table(fn(t), path)


def test_reads_v30_episode_table(small_root):
    ds = open_dataset(str(small_root))
    assert ds.version == "v3.0"
    assert ds.num_episodes == 40
    ep = ds.column("episode_index")
    assert ep.tolist() == list(range(40))
    frm, to, length = (
        ds.column("dataset_from_index"),
        ds.column("dataset_to_index"),
        ds.column("length"),
    )
    assert np.array_equal(to - frm, length)
    assert np.array_equal(frm[1:], to[:-1])
    info = json.loads((small_root / "meta/info.json").read_text())
    assert ds.num_frames == info["total_frames"]
    # task_index of tasks[0] matches the data files' task_index column.
    data = pq.read_table(small_root / ds.data_files[0], columns=["episode_index", "task_index"])
    first_rows = np.searchsorted(data["episode_index"].to_numpy(), ep)
    assert np.array_equal(data["task_index"].to_numpy()[first_rows], ds.column("task_index"))
    # Stats columns are not read.
    assert not any(c.startswith("stats/") for c in ds.episodes.column_names)


def test_reads_v21_layout_into_same_table(make_sample):
    v3 = open_dataset(str(make_sample(episodes=12, seed=3, copy=False)))
    v2 = open_dataset(str(make_sample(episodes=12, seed=3, version="v2.1", copy=False)))
    assert v2.version == "v2.1"
    for col in ("episode_index", "length", "dataset_from_index", "dataset_to_index", "task_index"):
        assert np.array_equal(v2.column(col), v3.column(col)), col
    assert v2.fingerprint == v3.fingerprint
    assert len(v2.data_files) == 12
    assert v2.data_files[3] == "data/chunk-000/episode_000003.parquet"


def test_reads_through_fsspec_urls(small_root):
    local = open_dataset(str(small_root))
    via_file = open_dataset(f"file://{small_root}")
    assert via_file.fingerprint == local.fingerprint
    mem = fsspec.filesystem("memory")
    for p in small_root.rglob("*"):
        if p.is_file():
            mem.pipe(f"/mem_root/{p.relative_to(small_root)}", p.read_bytes())
    via_mem = open_dataset("memory://mem_root")
    assert via_mem.fingerprint == local.fingerprint
    assert via_mem.data_files == local.data_files


def test_old_tasks_index_name_is_accepted(make_sample):
    new = open_dataset(str(make_sample(episodes=10, copy=False)))
    old_root = make_sample(episodes=10, tasks_index_name=None, copy=False)
    assert "__index_level_0__" in pq.read_schema(old_root / "meta/tasks.parquet").names
    old = open_dataset(str(old_root))
    assert old.task_strings() == new.task_strings()
    assert np.array_equal(old.column("task_index"), new.column("task_index"))


def test_files_and_chunks_roll_over(make_sample):
    root = make_sample(episodes=60, data_files_size_in_mb=1, chunks_size=2, copy=False)
    ds = open_dataset(str(root))
    assert len(ds.data_files) >= 4
    chunks = {f.split("/")[1] for f in ds.data_files}
    assert len(chunks) >= 2
    total = sum(pq.ParquetFile(root / f).metadata.num_rows for f in ds.data_files)
    assert total == ds.num_frames


def test_fingerprint_changes_only_with_episode_identity():
    ep = np.arange(5)
    length = np.array([10, 20, 30, 40, 50])
    tasks = pa.array([["a"], ["b"], ["a"], ["c"], ["a", "b"]])
    base = compute_fingerprint(ep, length, tasks)
    assert compute_fingerprint(ep, length.copy(), pa.array(tasks.to_pylist())) == base
    # Chunking/string flavour does not matter.
    large = pa.array(tasks.to_pylist(), pa.list_(pa.large_string()))
    assert compute_fingerprint(ep, length, large) == base
    changed_len = length.copy()
    changed_len[2] += 1
    assert compute_fingerprint(ep, changed_len, tasks) != base
    assert (
        compute_fingerprint(ep, length, pa.array([["a"], ["b"], ["b"], ["c"], ["a", "b"]])) != base
    )
    assert compute_fingerprint(ep, length, pa.array([["a"], ["b"], ["a"], ["c"], ["a"]])) != base
    # Moving a character between adjacent task strings changes it too.
    assert (
        compute_fingerprint(ep, length, pa.array([["a"], ["b"], ["a"], ["c"], ["ab", ""]])) != base
    )
    assert compute_fingerprint(np.arange(1, 6), length, tasks) != base


def test_fingerprint_ignores_file_layout(make_sample):
    a = open_dataset(str(make_sample(episodes=30, style="recorded", copy=False)))
    b = open_dataset(str(make_sample(episodes=30, style="edited", copy=False)))
    assert a.fingerprint == b.fingerprint


def test_missing_info_json(small_root):
    (small_root / "meta/info.json").unlink()
    with pytest.raises(MissingFileError, match="info.json"):
        open_dataset(str(small_root))


def test_unknown_codebase_version(small_root):
    p = small_root / "meta/info.json"
    info = json.loads(p.read_text())
    info["codebase_version"] = "v9.9"
    p.write_text(json.dumps(info))
    with pytest.raises(UnsupportedVersionError, match=r"info.json.*v9.9"):
        open_dataset(str(small_root))


def test_corrupt_info_json(small_root):
    (small_root / "meta/info.json").write_text("{not json")
    with pytest.raises(DatasetError, match="info.json"):
        open_dataset(str(small_root))


def test_episodes_not_contiguous(small_root):
    def shift(t):
        frm = t["dataset_from_index"].to_numpy().copy()
        to = t["dataset_to_index"].to_numpy().copy()
        frm[5:] += 3
        to[5:] += 3
        t = t.set_column(
            t.schema.get_field_index("dataset_from_index"), "dataset_from_index", pa.array(frm)
        )
        return t.set_column(
            t.schema.get_field_index("dataset_to_index"), "dataset_to_index", pa.array(to)
        )

    _rewrite_episodes(small_root, shift)
    with pytest.raises(InconsistentDatasetError, match="not contiguous: episode 5"):
        open_dataset(str(small_root))


def test_length_disagrees_with_range(small_root):
    def bump(t):
        length = t["length"].to_numpy().copy()
        length[7] += 1
        return t.set_column(t.schema.get_field_index("length"), "length", pa.array(length))

    _rewrite_episodes(small_root, bump)
    with pytest.raises(InconsistentDatasetError, match="episode 7: length"):
        open_dataset(str(small_root))


def test_totals_disagree_with_info(small_root):
    p = small_root / "meta/info.json"
    info = json.loads(p.read_text())
    info["total_frames"] += 10
    p.write_text(json.dumps(info))
    with pytest.raises(InconsistentDatasetError, match="total_frames"):
        open_dataset(str(small_root))


def test_missing_data_file(make_sample):
    root = make_sample(episodes=60, data_files_size_in_mb=1)
    victim = sorted((root / "data").rglob("*.parquet"))[-1]
    victim.unlink()
    with pytest.raises(MissingFileError, match=str(victim.name)):
        open_dataset(str(root))


def test_missing_tasks_and_episodes(small_root, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(small_root, other)
    (small_root / "meta/tasks.parquet").unlink()
    with pytest.raises(MissingFileError, match="tasks.parquet"):
        open_dataset(str(small_root))
    shutil.rmtree(other / "meta/episodes")
    with pytest.raises(MissingFileError, match="episodes"):
        open_dataset(str(other))


def test_corrupt_episodes_parquet(small_root):
    _episodes_file(small_root).write_bytes(b"PAR1 garbage")
    with pytest.raises(DatasetError, match="file-000.parquet"):
        open_dataset(str(small_root))
