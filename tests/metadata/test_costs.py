"""Episode cost table: values by hand on tiny datasets, freshness, idempotence, bad input."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from episodekit.cli import main
from episodekit.core.dataset import MissingFileError, open_dataset
from episodekit.metadata.costs import (
    COST_FILE,
    compute_costs,
    costs_meta,
    ensure_costs,
    read_costs,
    verify_costs,
    write_costs,
)
from episodekit.sample import write_sample


def _row_group_bytes(path) -> list[int]:
    meta = pq.ParquetFile(path).metadata
    return [
        sum(meta.row_group(i).column(j).total_compressed_size for j in range(meta.num_columns))
        for i in range(meta.num_row_groups)
    ]


def test_costs_by_hand_recorded_with_videos(make_sample):
    root = make_sample(episodes=5, tasks=2, images=True, videos=2, data_files_size_in_mb=0.05)
    ds = open_dataset(root)
    t = compute_costs(ds, "frames")
    length = ds.column("length")
    assert t["episode_index"].to_pylist() == list(range(5))
    assert t["task_index"].to_pylist() == ds.column("task_index").tolist()
    assert t["length"].to_pylist() == length.tolist()
    assert t["num_cameras"].to_pylist() == [3] * 5  # one image feature + two video cameras
    assert t["action_dim"].to_pylist() == [14] * 5
    assert t["cost"].to_pylist() == length.astype(float).tolist()
    # Recorded style: one row group per episode, so an episode's bytes are its row group's.
    expected = []
    for rel in ds.data_files:
        expected += _row_group_bytes(root / rel)
    assert t["data_bytes"].to_pylist() == expected
    # One mp4 per camera (default 200 MB files): each episode's share is prorated by duration.
    sizes = [p.stat().st_size for p in sorted(root.glob("videos/*/*/*.mp4"))]
    assert len(sizes) == 2
    share = sum(sizes) * length / length.sum()
    assert np.abs(t["video_bytes"].to_numpy() - share).max() <= 2
    assert t["video_bytes"].to_numpy().sum() == sum(sizes)
    compute = compute_costs(ds, "compute")["cost"].to_numpy()
    assert compute.tolist() == (length * 14 * 3).astype(float).tolist()
    by_bytes = compute_costs(ds, "bytes")
    assert by_bytes["cost"].to_pylist() == [
        float(a + b) for a, b in zip(expected, t["video_bytes"].to_pylist())
    ]
    assert costs_meta(by_bytes) == {"fingerprint": ds.fingerprint, "model": "bytes", "version": 1}


def test_edited_style_prorates_one_row_group_by_rows(make_sample):
    root = make_sample(episodes=6, tasks=2, style="edited")
    ds = open_dataset(root)
    assert len(ds.data_files) == 1
    (total,) = _row_group_bytes(root / ds.data_files[0])
    got = compute_costs(ds)["data_bytes"].to_numpy()
    length = ds.column("length")
    assert got.sum() == total  # shares add up to the file exactly
    np.testing.assert_allclose(got, total * length / length.sum(), atol=1.0)


def test_v21_episode_owns_its_file(make_sample):
    root = make_sample(episodes=3, tasks=2, version="v2.1")
    ds = open_dataset(root)
    got = compute_costs(ds)["data_bytes"].to_pylist()
    assert got == [sum(_row_group_bytes(root / rel)) for rel in ds.data_files]


def test_ensure_costs_is_idempotent_and_tracks_model(make_sample):
    root = make_sample(episodes=8, tasks=2)
    table, changed = ensure_costs(root, "frames")
    assert changed and (root / COST_FILE).exists()
    before = (root / COST_FILE).read_bytes()
    _, changed = ensure_costs(root, "frames")
    assert not changed and (root / COST_FILE).read_bytes() == before
    _, changed = ensure_costs(root, "compute")
    assert changed and costs_meta(read_costs(root))["model"] == "compute"
    _, changed = ensure_costs(root, "compute", force=True)
    assert changed
    assert read_costs(root).equals(compute_costs(root, "compute"))


def test_stale_cost_table_detected(make_sample):
    root = make_sample(episodes=8, tasks=2, seed=3)
    write_costs(root, "frames")
    ds = open_dataset(root)
    assert verify_costs(read_costs(root), ds) == []
    old = (root / COST_FILE).read_bytes()
    write_sample(root, episodes=8, tasks=2, seed=4)  # other lengths, same root
    ds2 = open_dataset(root)
    assert read_costs(root) is None  # the rewrite replaced the whole root
    (root / COST_FILE).write_bytes(old)  # an old table under the new dataset
    problems = verify_costs(read_costs(root), ds2)
    assert any("stale" in p for p in problems)
    table, changed = ensure_costs(root, "frames")
    assert changed and verify_costs(table, ds2) == []


def test_missing_video_file_is_named(make_sample):
    root = make_sample(episodes=4, tasks=2, videos=1)
    victim = next((root / "videos").rglob("*.mp4"))
    victim.unlink()
    with pytest.raises(MissingFileError, match=victim.name):
        compute_costs(root, "bytes")


def test_unknown_model_is_rejected(make_sample):
    root = make_sample(episodes=4, tasks=2, copy=False)
    with pytest.raises(ValueError, match="unknown cost model 'gpu'"):
        compute_costs(root, "gpu")


def test_cli_costs(make_sample):
    root = make_sample(episodes=6, tasks=2)
    runner = CliRunner()
    res = runner.invoke(main, ["metadata", "costs", str(root), "--model", "compute"])
    assert res.exit_code == 0, res.output
    assert "written" in res.output and "6 episodes" in res.output
    assert costs_meta(read_costs(root))["model"] == "compute"
    res = runner.invoke(main, ["metadata", "costs", str(root), "--model", "compute"])
    assert "fresh, kept" in res.output
    res = runner.invoke(main, ["metadata", "costs", str(root / "nope")])
    assert res.exit_code == 2 and "no such folder" in res.output
    meta = json.loads(pq.read_schema(root / COST_FILE).metadata[b"episodekit.costs"])
    assert meta["model"] == "compute"


def test_absent_videos_are_null_unless_the_model_needs_them(make_sample):
    root = make_sample(episodes=4, tasks=2, videos=1)
    import shutil

    shutil.rmtree(root / "videos")  # e.g. a root prepared into a separate folder
    t = compute_costs(root, "frames")
    assert t["video_bytes"].null_count == 4
    assert t["cost"].to_pylist() == t["length"].to_numpy().astype(float).tolist()
    with pytest.raises(MissingFileError, match="video file"):
        compute_costs(root, "bytes")
