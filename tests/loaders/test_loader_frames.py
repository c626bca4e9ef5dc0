"""FrameDataset: LeRobot delta-window semantics, row-group reading, errors, videos, subsets."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.loaders import FrameDataset

FPS = 30
WINDOWS = {
    "action": [k / FPS for k in range(-1, 5)],  # negative, zero and positive deltas
    "observation.state": [-2 / FPS, -1 / FPS, 0.0],
    "timestamp": [0.0, 3 / FPS],
}


def read_all(root) -> dict[str, np.ndarray]:
    """Every data file concatenated in episode order: row r = global frame r (the reference)."""
    ds = open_dataset(str(root))
    table = pa.concat_tables([pq.read_table(ds.data_path(i)) for i in range(len(ds.data_files))])
    out = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(col.type):
            out[name] = col.values.to_numpy().reshape(len(col), -1)
        elif pa.types.is_struct(col.type):
            out[name] = col.field("bytes").to_numpy(zero_copy_only=False)
        elif name != "language_events":
            out[name] = col.to_numpy()
    return out


def lerobot_window(ref, ds, g: int, deltas: list[float]) -> tuple[list[int], list[bool]]:
    """LeRobot's _get_query_indices, literally: bounds from the frame's episode_index row."""
    ep = int(ref["episode_index"][g])
    row = ds.episode_rows(np.array([ep]))[0]
    start = int(ds.column("dataset_from_index")[row])
    end = int(ds.column("dataset_to_index")[row])
    idx = int(ref["index"][g])
    delta_idx = [round(d * ds.fps) for d in deltas]
    query = [max(start, min(end - 1, idx + d)) for d in delta_idx]
    pad = [(idx + d < start) | (idx + d >= end) for d in delta_idx]
    return query, pad


def check_sample(sample, ref, ds, g, windows):
    for key, deltas in windows.items():
        query, pad = lerobot_window(ref, ds, g, deltas)
        np.testing.assert_array_equal(sample[key], ref[key][query])
        np.testing.assert_array_equal(sample[f"{key}_is_pad"], pad)
    for key in ("observation.state", "action", "frame_index", "episode_index", "index"):
        if key not in windows:
            np.testing.assert_array_equal(sample[key], ref[key][g])


@pytest.mark.parametrize(
    "spec",
    [
        dict(episodes=8, tasks=2, seed=3, mean_length=40),
        dict(
            episodes=8, tasks=2, seed=3, mean_length=40, style="edited", data_files_size_in_mb=0.01
        ),
        dict(episodes=6, tasks=2, seed=4, mean_length=30, version="v2.1"),
    ],
    ids=["recorded", "edited-multifile", "v2.1"],
)
def test_windows_match_lerobot_semantics_on_every_frame(make_sample, spec):
    root = make_sample(copy=False, **spec)
    ds = open_dataset(str(root))
    ref = read_all(root)
    fds = FrameDataset(root, delta_timestamps=WINDOWS, speed=False)
    assert len(fds) == ds.num_frames == len(ref["index"])
    for i in range(len(fds)):
        check_sample(fds[i], ref, ds, i, WINDOWS)
    batch = fds.get_batch(np.arange(len(fds))[::-1])
    for key in WINDOWS:
        for j, i in enumerate(range(len(fds) - 1, -1, -1)):
            query, pad = lerobot_window(ref, ds, i, WINDOWS[key])
            np.testing.assert_array_equal(batch[key][j], ref[key][query])
            np.testing.assert_array_equal(batch[f"{key}_is_pad"][j], pad)
    tasks = dict(zip(ds.tasks["task_index"].to_pylist(), ds.tasks["task"].to_pylist()))
    assert batch["task"] == [tasks[t] for t in ref["task_index"][::-1].tolist()]


def test_pads_at_episode_edges_repeat_the_edge_frame(make_sample):
    root = make_sample(copy=False, episodes=4, tasks=1, seed=5, mean_length=20)
    ds = open_dataset(str(root))
    ref = read_all(root)
    fds = FrameDataset(root, delta_timestamps={"action": [-2 / FPS, 0, 2 / FPS]}, speed=False)
    first, last = int(ds.column("dataset_from_index")[1]), int(ds.column("dataset_to_index")[1])
    s = fds[first]  # first frame of episode 1: the past is padded with frame `first`
    np.testing.assert_array_equal(s["action_is_pad"], [True, False, False])
    np.testing.assert_array_equal(s["action"], ref["action"][[first, first, first + 2]])
    s = fds[last - 1]  # last frame: the future is padded with frame `last - 1`
    np.testing.assert_array_equal(s["action_is_pad"], [False, False, True])
    np.testing.assert_array_equal(s["action"], ref["action"][[last - 3, last - 1, last - 1]])
    s = fds[first + 1]
    np.testing.assert_array_equal(s["action_is_pad"], [True, False, False])
    np.testing.assert_array_equal(s["action"], ref["action"][[first, first + 1, first + 3]])
    assert s["action"].shape == (3, 14) and s["action"].dtype == np.float32
    assert np.shape(s["observation.state"]) == (14,) and np.ndim(s["timestamp"]) == 0


def test_episode_subset_and_negative_index(make_sample):
    root = make_sample(copy=False, episodes=8, tasks=2, seed=3, mean_length=40)
    ref = read_all(root)
    ds = open_dataset(str(root))
    fds = FrameDataset(root, delta_timestamps=WINDOWS, episodes=[6, 2, 5], speed=False)
    rows = ds.episode_rows(np.array([2, 5, 6]))
    frames = np.concatenate(
        [
            np.arange(a, b)
            for a, b in zip(
                ds.column("dataset_from_index")[rows], ds.column("dataset_to_index")[rows]
            )
        ]
    )
    assert len(fds) == len(frames)
    for i in range(len(fds)):
        check_sample(fds[i], ref, ds, int(frames[i]), WINDOWS)
    np.testing.assert_array_equal(fds[-1]["index"], frames[-1])
    np.testing.assert_array_equal(fds.get_batch([-1, 0])["index"], frames[[-1, 0]])
    # only the selected episodes' files are opened (8 episodes in 8 files here? no: one file)
    assert set(fds.reader.file_ids.tolist()) == set(ds.column("file_id")[rows].tolist())


def test_episode_split_across_row_groups_and_tiny_cache(make_sample):
    """Files whose row groups cut episodes, and a pool too small for a batch: same values."""
    root = make_sample(episodes=6, tasks=2, seed=7, mean_length=40)
    ds = open_dataset(str(root))
    for i in range(len(ds.data_files)):
        path = ds.data_path(i)
        pq.write_table(pq.read_table(path), path, row_group_size=17)
    ref = read_all(root)
    fds = FrameDataset(root, delta_timestamps=WINDOWS, cache_mb=0, speed=False)
    assert (fds._ep_rg < 0).any()  # some episode spans several row groups
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(fds), 64)
    batch = fds.get_batch(idx)
    for j, i in enumerate(idx.tolist()):
        for key in WINDOWS:
            query, pad = lerobot_window(ref, ds, i, WINDOWS[key])
            np.testing.assert_array_equal(batch[key][j], ref[key][query])
            np.testing.assert_array_equal(batch[f"{key}_is_pad"][j], pad)
        check_sample(fds[i], ref, ds, i, WINDOWS)
    assert fds.reader.capacity == 17  # cache_mb=0: the pool holds just one row group


def test_reads_only_the_needed_row_group(make_sample):
    root = make_sample(copy=False, episodes=8, tasks=2, seed=3, mean_length=40)
    fds = FrameDataset(root, speed=False)
    assert len(fds.reader.rg_start) == 8  # recorded: one row group per episode
    fds[len(fds) - 1]
    assert fds.reader.row_groups_read == 1
    fds[len(fds) - 2]  # same episode, cached
    assert fds.reader.row_groups_read == 1
    fds.get_batch([0, 1, 2])
    assert fds.reader.row_groups_read == 2


def test_videos_images_and_undeclared_columns(make_sample):
    root = make_sample(
        copy=False,
        episodes=5,
        tasks=2,
        seed=2,
        mean_length=30,
        videos=2,
        images=True,
        extra_column=True,
    )
    ds = open_dataset(str(root))
    ref = read_all(root)
    key = "observation.images.cam1"
    fds = FrameDataset(
        root, delta_timestamps={key: [-1 / FPS, 0.0]}, speed=False, video_backend="paths"
    )
    assert "language_events" not in fds[0]
    for i in (0, 1, len(fds) - 1, int(ds.column("dataset_from_index")[3]) + 2):
        s = fds[i]
        row = ds.episode_rows(np.array([int(ref["episode_index"][i])]))[0]
        for cam in ("observation.images.cam0", key):
            chunk = int(ds.column(f"videos/{cam}/chunk_index")[row])
            fidx = int(ds.column(f"videos/{cam}/file_index")[row])
            assert s[cam]["path"] == ds.join(ds.video_path(cam, chunk, fidx))
        start = float(ds.column(f"videos/{key}/from_timestamp")[row])
        query, pad = lerobot_window(ref, ds, i, [-1 / FPS, 0.0])
        np.testing.assert_allclose(s[key]["timestamp"], start + ref["timestamp"][query])
        np.testing.assert_array_equal(s[f"{key}_is_pad"], pad)
        start0 = float(ds.column("videos/observation.images.cam0/from_timestamp")[row])
        assert s["observation.images.cam0"]["timestamp"] == pytest.approx(
            start0 + float(ref["timestamp"][i])
        )
        assert s["observation.images.wrist"] == ref["observation.images.wrist"][i]
        assert s["observation.images.wrist"].startswith(b"\x89PNG")
    batch = fds.get_batch([0, len(fds) - 1])
    assert batch[key]["timestamp"].shape == (2, 2)
    assert list(batch["observation.images.wrist"]) == [ref["observation.images.wrist"][0]] * 2


def test_speed_bucket_from_the_artifact(make_sample):
    from episodekit.metadata.speed import ensure_speed_file, episode_buckets

    root = make_sample(episodes=60, tasks=2, seed=11, mean_length=30)
    rows, _ = ensure_speed_file(str(root))
    ds = open_dataset(str(root))
    buckets = episode_buckets(ds, rows)
    assert len(set(buckets.tolist())) > 3  # the artifact really sorts episodes into buckets
    fds = FrameDataset(root)
    starts = ds.column("dataset_from_index")
    got = [fds[int(s)]["speed"] for s in starts]
    assert got == buckets.tolist()
    np.testing.assert_array_equal(fds.get_batch(starts)["speed"], buckets)
    assert FrameDataset(root, speed=False)[0]["speed"] == 50


def test_fsspec_memory_url(make_sample):
    fsspec = pytest.importorskip("fsspec")
    root = make_sample(copy=False, episodes=4, tasks=1, seed=9, mean_length=20)
    fs = fsspec.filesystem("memory")
    fs.put(str(root), "/h4loader", recursive=True)
    ref = read_all(root)
    fds = FrameDataset("memory:///h4loader", delta_timestamps=WINDOWS, speed=False)
    ds = fds.ds
    assert not ds.is_local
    for i in (0, 5, len(fds) - 1):
        check_sample(fds[i], ref, ds, i, WINDOWS)
    fs.rm("/h4loader", recursive=True)


def test_bad_inputs_give_clear_errors(make_sample):
    root = make_sample(copy=False, episodes=4, tasks=1, seed=9, mean_length=20)
    with pytest.raises(ValueError, match="'nope' is not a feature"):
        FrameDataset(root, delta_timestamps={"nope": [0.0]}, speed=False)
    with pytest.raises(ValueError, match="not a multiple of 1/fps"):
        FrameDataset(root, delta_timestamps={"action": [0.0, 0.05]}, speed=False)
    with pytest.raises(ValueError, match="is empty"):
        FrameDataset(root, delta_timestamps={"action": []}, speed=False)
    # within tolerance is accepted, like LeRobot (1e-4 s by default)
    FrameDataset(root, delta_timestamps={"action": [1 / FPS + 5e-5]}, speed=False)
    fds = FrameDataset(root, speed=False)
    n = len(fds)
    with pytest.raises(IndexError, match=f"out of range for {n} frames"):
        fds[n]
    with pytest.raises(IndexError, match="out of range"):
        fds[-n - 1]
    with pytest.raises(IndexError, match=f"frame index {n + 3} out of range"):
        fds.get_batch([0, n + 3])
    with pytest.raises(KeyError, match="not in dataset"):
        FrameDataset(root, episodes=[99], speed=False)


def test_missing_feature_column_names_the_file(make_sample):
    root = make_sample(episodes=3, tasks=1, seed=9, mean_length=20)
    info_path = root / "meta/info.json"
    info = json.loads(info_path.read_text())
    info["features"]["observation.extra"] = {"dtype": "float32", "shape": [1], "names": None}
    info_path.write_text(json.dumps(info))
    with pytest.raises(Exception, match=r"file-000\.parquet.*lacks feature columns"):
        FrameDataset(root, speed=False)


def test_data_file_out_of_step_with_episodes_table_is_an_error(make_sample):
    root = make_sample(episodes=4, tasks=1, seed=9, mean_length=20)
    ds = open_dataset(str(root))
    path = ds.data_path(0)
    t = pq.read_table(path)
    t = t.set_column(t.schema.get_field_index("index"), "index", pa.array(np.arange(len(t)) + 7))
    pq.write_table(t, path)
    with pytest.raises(Exception, match=r"file-000\.parquet.*index 7.*frame 0"):
        FrameDataset(root, speed=False)


def test_pickled_dataset_starts_with_an_empty_pool(make_sample):
    import pickle

    root = make_sample(copy=False, episodes=4, tasks=1, seed=9, mean_length=20)
    fds = FrameDataset(root, delta_timestamps=WINDOWS, speed=False)
    before = fds.get_batch(np.arange(len(fds)))
    clone = pickle.loads(pickle.dumps(fds))
    assert clone.reader.pool == {} and (clone.reader.slot < 0).all()
    after = clone.get_batch(np.arange(len(fds)))
    for key in ("action", "observation.state", "index", "action_is_pad"):
        np.testing.assert_array_equal(before[key], after[key])


def test_open_files_are_bounded_by_the_footer_budget(make_sample):
    spec = dict(episodes=8, tasks=2, seed=3, mean_length=40, data_files_size_in_mb=0.01)
    root = make_sample(copy=False, **spec)
    ref = read_all(root)
    fds = FrameDataset(root, delta_timestamps=WINDOWS, footer_mb=0, speed=False)
    n_files = len(fds.reader.file_ids)
    assert n_files > 3 and len(fds.reader._handles) == 1
    batch = fds.get_batch(np.arange(len(fds)))  # touches every file again
    assert len(fds.reader._handles) == 1 and fds.reader.files_opened >= 2 * n_files - 1
    np.testing.assert_array_equal(batch["action"][:, 1], ref["action"])
    roomy = FrameDataset(root, speed=False)
    assert len(roomy.reader._handles) == n_files  # small footers: all stay open


def test_an_empty_batch_has_every_key_with_zero_rows(tmp_path):
    """get_batch([]) (a sampler's last, empty slice) gives the batch's keys, dtypes and frame
    shapes with 0 rows, decoded video included, instead of a KeyError deep in the reader."""
    import shutil
    from pathlib import Path

    root = tmp_path / "vid24"
    shutil.copytree(Path(__file__).parents[1] / "fixtures/lerobot/vid24", root)
    ds = FrameDataset(root, speed="memory", video_backend="pyav")
    one, empty = ds.get_batch([0]), ds.get_batch([])
    assert empty.keys() == one.keys()
    for name, value in one.items():
        if isinstance(value, np.ndarray):
            assert empty[name].shape == (0, *value.shape[1:]) and empty[name].dtype == value.dtype
        else:
            assert list(empty[name]) == []
