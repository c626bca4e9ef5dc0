"""The sample writer's output read back: layout, schemas, row-group styles, rollover."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.sample import write_sample


def test_v30_layout_and_schema(make_sample):
    root = make_sample(episodes=45, tasks=6, images=True, videos=1, copy=False)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    for key in (
        "fps",
        "features",
        "total_episodes",
        "total_frames",
        "total_tasks",
        "chunks_size",
        "data_files_size_in_mb",
        "video_files_size_in_mb",
        "data_path",
        "video_path",
        "splits",
        "robot_type",
    ):
        assert key in info, key
    assert (root / "meta/stats.json").exists()
    data = sorted((root / "data").rglob("*.parquet"))
    schema = pq.read_schema(data[0])
    assert schema.field("timestamp").type == pa.float32()
    for c in ("index", "episode_index", "frame_index", "task_index"):
        assert schema.field(c).type == pa.int64()
    assert schema.field("action").type == pa.list_(pa.float32(), 14)
    assert pa.types.is_fixed_size_list(schema.field("observation.state").type)
    img = schema.field("observation.images.wrist").type
    assert pa.types.is_struct(img) and img.names == ["bytes", "path"]
    hf = json.loads(schema.metadata[b"huggingface"])
    assert hf["info"]["features"]["action"]["_type"] == "Sequence"
    assert "observation.images.cam0" not in schema.names  # videos live in mp4 files
    ep_schema = pq.read_schema(next((root / "meta/episodes").rglob("*.parquet")))
    for c in (
        "stats/action/min",
        "stats/action/q99",
        "stats/timestamp/count",
        "videos/observation.images.cam0/from_timestamp",
        "meta/episodes/file_index",
    ):
        assert c in ep_schema.names, c
    tasks_meta = json.loads(pq.read_schema(root / "meta/tasks.parquet").metadata[b"pandas"])
    assert tasks_meta["index_columns"] == ["task"]


def test_frames_are_consistent(make_sample):
    root = make_sample(episodes=30, copy=False)
    ds = open_dataset(str(root))
    t = pq.read_table(root / ds.data_files[0])
    idx = t["index"].to_numpy()
    assert np.array_equal(idx, np.arange(len(idx)))
    ep = t["episode_index"].to_numpy()
    frame = t["frame_index"].to_numpy()
    starts = ds.column("dataset_from_index")
    assert np.array_equal(frame, idx - starts[ep])
    assert np.allclose(t["timestamp"].to_numpy(), frame / ds.fps, atol=1e-6)


@pytest.mark.parametrize("style,expect", [("recorded", "per_episode"), ("edited", "per_file")])
def test_row_group_styles(make_sample, style, expect):
    root = make_sample(episodes=60, data_files_size_in_mb=1, style=style, copy=False)
    ds = open_dataset(str(root))
    file_id = ds.column("file_id")
    for fid, rel in enumerate(ds.data_files):
        md = pq.ParquetFile(root / rel).metadata
        n_eps = int((file_id == fid).sum())
        assert md.num_row_groups == (n_eps if expect == "per_episode" else 1)
        assert md.row_group(0).column(0).has_column_index is False


def test_rare_tasks_and_spread_lengths(make_sample):
    ds = open_dataset(str(make_sample(episodes=400, tasks=8, copy=False)))
    counts = np.bincount(ds.column("task_index"), minlength=8)
    assert (counts < 10).sum() >= 2
    med = [
        np.median(ds.column("length")[ds.column("task_index") == t])
        for t in range(8)
        if counts[t] >= 10
    ]
    assert max(med) / min(med) > 3


def test_deterministic_by_seed(tmp_path):
    a = write_sample(tmp_path / "a", episodes=10, seed=5)
    b = write_sample(tmp_path / "b", episodes=10, seed=5)
    c = write_sample(tmp_path / "c", episodes=10, seed=6)
    fa, fb, fc = (open_dataset(str(p)).fingerprint for p in (a, b, c))
    assert fa == fb != fc
    ta = pq.read_table(a / "data/chunk-000/file-000.parquet")
    tb = pq.read_table(b / "data/chunk-000/file-000.parquet")
    assert ta.equals(tb)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="style"):
        write_sample(tmp_path / "x", style="weird")
    with pytest.raises(ValueError, match="episodes"):
        write_sample(tmp_path / "x", episodes=0)
