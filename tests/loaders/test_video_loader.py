"""Decoded video in the loader: FrameDataset(video_backend="pyav") returns the frame LeRobot's
pyav algorithm returns (pixel for pixel), windows pad like numeric windows, tolerance errors,
bounded decoder cache, resize/CHW; decode_episode decodes in timestamp order."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.loaders.frames import FrameDataset

av = pytest.importorskip("av")

from episodekit.core.video import VideoFile  # noqa: E402
from episodekit.loaders.video import FrameTimestampError, PyAVBackend, decode_episode  # noqa: E402
from episodekit.sample import read_frame_code  # noqa: E402

FPS = 30
CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"
SPEC = dict(episodes=6, tasks=2, seed=7, mean_length=10, videos=2, video_files_size_in_mb=0.005)
WINDOW = [-2 / FPS, -1 / FPS, 0.0, 1 / FPS]


def lerobot_decode(path: str, timestamps: list[float], tolerance_s: float) -> np.ndarray:
    """LeRobot's pyav algorithm: seek to the keyframe before the first query, decode forward to
    the last, pick the closest decoded frame of each query within tolerance."""
    container = av.open(path)
    stream = container.streams.video[0]
    first, last = min(timestamps), max(timestamps)
    container.seek(int(first / stream.time_base), stream=stream, backward=True, any_frame=False)
    frames, times = [], []
    for frame in container.decode(stream):
        t = float(frame.pts * stream.time_base)
        frames.append(frame.to_ndarray(format="rgb24"))
        times.append(t)
        if t >= last:
            break
    container.close()
    dist = np.abs(np.asarray(timestamps)[:, None] - np.asarray(times)[None, :])
    assert (dist.min(1) <= tolerance_s).all()
    return np.stack([frames[i] for i in dist.argmin(1)])


@pytest.mark.parametrize("codec,gop", [("av1", 2), ("h264", 7)], ids=["av1_gop2", "h264_gop7"])
def test_frames_match_lerobot_pyav_decode_pixel_for_pixel(make_sample, codec, gop):
    root = make_sample(copy=False, video_codec=codec, gop=gop, **SPEC)
    plain = FrameDataset(root, delta_timestamps={CAM0: WINDOW}, speed=False, video_backend="paths")
    fds = FrameDataset(root, delta_timestamps={CAM0: WINDOW}, speed=False, video_backend="pyav")
    rng = np.random.default_rng(0)
    for i in [0, len(fds) - 1, *rng.integers(0, len(fds), 25).tolist()]:
        ref, got = plain[i], fds[i]
        for key in (CAM0, CAM1):
            ts = np.atleast_1d(ref[key]["timestamp"]).tolist()
            want = lerobot_decode(ref[key]["path"], ts, 1e-4)
            np.testing.assert_array_equal(got[key], want if key == CAM0 else want[0])
        assert got[CAM0].dtype == np.uint8 and got[CAM0].shape == (4, 48, 64, 3)
        np.testing.assert_array_equal(got[f"{CAM0}_is_pad"], ref[f"{CAM0}_is_pad"])


def test_windows_pad_at_episode_edges_like_numeric_windows(make_sample):
    root = make_sample(copy=False, **SPEC)
    deltas = {CAM0: WINDOW, "index": WINDOW}
    fds = FrameDataset(root, delta_timestamps=deltas, speed=False, video_backend="pyav")
    ds = open_dataset(str(root))
    starts = ds.column("dataset_from_index")
    ends = ds.column("dataset_to_index")
    edges = sorted({*starts.tolist(), *(starts + 1).tolist(), *(ends - 1).tolist()})
    for i in edges:
        s = fds[i]
        # The frame code written into the pixels is the dataset index of the decoded frame.
        codes = [read_frame_code(img) for img in s[CAM0]]
        assert codes == s["index"].tolist()  # clamped like the numeric window (edge repeats)
        np.testing.assert_array_equal(s[f"{CAM0}_is_pad"], s["index_is_pad"])
        assert read_frame_code(s[CAM1]) == i
    assert fds[0][f"{CAM0}_is_pad"].tolist() == [True, True, False, False]
    # get_batch decodes the same frames as ds[i].
    idx = [0, 3, len(fds) - 1, 5]
    batch = fds.get_batch(idx)
    assert batch[CAM0].shape == (4, 4, 48, 64, 3) and batch[CAM1].shape == (4, 48, 64, 3)
    for j, i in enumerate(idx):
        np.testing.assert_array_equal(batch[CAM0][j], fds[i][CAM0])
        np.testing.assert_array_equal(batch[CAM1][j], fds[i][CAM1])


def test_resize_channels_first_and_bounded_cache(make_sample):
    root = make_sample(copy=False, **SPEC)
    backend = PyAVBackend(size=(24, 32), channels_first=True, max_open=1)
    fds = FrameDataset(root, speed=False, video_backend=backend)
    plain = FrameDataset(root, speed=False, video_backend="paths")
    for i in range(0, len(fds), 7):
        s = fds[i]
        assert s[CAM0].shape == (3, 24, 32) and s[CAM0].dtype == np.uint8
        assert len(backend._files) <= 1
        ref = plain[i][CAM1]
        container = av.open(ref["path"])
        stream = container.streams.video[0]
        want = next(
            f.to_ndarray(format="rgb24", width=32, height=24)
            for f in container.decode(stream)
            if abs(float(f.pts * stream.time_base) - ref["timestamp"]) < 1e-4
        )
        container.close()
        np.testing.assert_array_equal(np.moveaxis(s[CAM1], 0, -1), want)
    # A pickled backend (DataLoader workers) carries no open files.
    clone = pickle.loads(pickle.dumps(backend))
    assert len(clone._files) == 0 and clone.size == (24, 32)


def test_query_off_the_frame_grid_raises_frame_timestamp_error(make_sample):
    root = make_sample(**SPEC)
    path = next(root.glob("meta/episodes/*/*.parquet"))
    t = pq.read_table(path)
    col = f"videos/{CAM0}/from_timestamp"
    shifted = t[col].to_numpy() + 0.3 / FPS
    pq.write_table(t.set_column(t.column_names.index(col), col, pa.array(shifted)), path)
    fds = FrameDataset(root, speed=False, video_backend="pyav")
    with pytest.raises(FrameTimestampError, match="tolerance_s"):
        fds[0]
    # A looser tolerance (LeRobot's knob) accepts the closest frame.
    loose = FrameDataset(root, speed=False, video_backend="pyav", tolerance_s=0.5 / FPS)
    assert read_frame_code(loose[3][CAM0]) == 3


def test_unknown_backend_is_a_clear_error(make_sample):
    root = make_sample(copy=False, **SPEC)
    with pytest.raises(ValueError, match="video_backend"):
        FrameDataset(root, speed=False, video_backend="torchvision")


def test_decode_episode_is_one_seek_per_run_and_keeps_query_order(make_sample):
    root = make_sample(copy=False, **{**SPEC, "gop": 4})
    plain = FrameDataset(root, speed=False, video_backend="paths")
    ds = open_dataset(str(root))
    lo, hi = int(ds.column("dataset_from_index")[1]), int(ds.column("dataset_to_index")[1])
    ref = plain.get_batch(np.arange(lo, hi))[CAM0]
    path, ts = ref["path"][0], ref["timestamp"]
    vf = VideoFile(path)
    frames = decode_episode(vf, ts)
    assert [read_frame_code(f) for f in frames] == list(range(lo, hi))
    assert vf.seeks == 1 and vf.decoded == hi - lo
    # Unsorted queries come back in query order; still decoded in timestamp order.
    order = np.random.default_rng(1).permutation(hi - lo)
    again = decode_episode(path, ts[order])
    assert [read_frame_code(f) for f in again] == (lo + order).tolist()


@pytest.mark.parametrize("gop", [2, 250])
def test_sharded_loader_decodes_through_the_backend_in_timestamp_order(make_sample, gop):
    from episodekit.loaders import ShardedLoader
    from episodekit.metadata.plans.build import ensure_plans

    root = make_sample(**{**SPEC, "gop": gop})
    ensure_plans(str(root), [1], 1)
    backend = PyAVBackend(episode_cache_mb=16)
    loader = ShardedLoader(
        root,
        rank=0,
        world_size=1,
        num_workers=1,
        worker=0,
        batch_size=16,
        speed=False,
        video_backend=backend,
    )
    seen = 0
    for batch in loader:
        codes = [read_frame_code(f) for f in batch[CAM0]]
        assert codes == batch["index"].tolist()
        seen += len(codes)
    assert seen == len(loader)
    vfs = list(backend._files.values())
    decoded = sum(vf.decoded for vf in vfs if "cam0" in vf.path)
    seeks = sum(vf.seeks for vf in vfs if "cam0" in vf.path)
    # The pool's episodes are decoded whole, once, in timestamp order: one seek per episode.
    n_episodes = len(open_dataset(str(root)).column("length"))
    assert seeks <= n_episodes and decoded == seen


def test_stream_pool_fits_the_episode_cache_and_a_small_cache_falls_back(make_sample):
    from episodekit.loaders import ShardedLoader
    from episodekit.metadata.plans.build import ensure_plans

    root = make_sample(**{**SPEC, "gop": 250, "episodes": 12})
    ensure_plans(str(root), [1], 1)
    ds = open_dataset(str(root))
    keys = [CAM0, CAM1]
    # Bytes a frame of both cameras holds decoded (measured by the backend on a real frame).
    per_row = 2**30 // PyAVBackend(episode_cache_mb=1024).pool_rows(ds, keys)
    assert per_row >= 2 * 48 * 64 * 3 // 2

    def loader(backend):
        return ShardedLoader(
            root,
            rank=0,
            world_size=1,
            num_workers=1,
            worker=0,
            batch_size=8,
            speed=False,
            video_backend=backend,
        )

    # The pool holds no more frames than the episode cache holds decoded (>= the longest episode).
    rows = 2 * int(ds.column("length").max())
    backend = PyAVBackend(episode_cache_mb=rows * per_row / 2**20)
    stream = loader(backend)
    assert stream.pool_rows == rows and stream.bin_order(0, 0).num_pools > 1
    seen = 0
    for batch in stream:
        assert [read_frame_code(f) for f in batch[CAM0]] == batch["index"].tolist()
        seen += len(batch["index"])
    assert seen == int(ds.column("length").sum()) and backend.episode_cache
    # A cache smaller than one episode: episodes evicted unserved; after a few, one warning and
    # per-batch decoding, with the same frames.
    tiny = PyAVBackend(episode_cache_mb=1e-6)
    with pytest.warns(UserWarning, match="episode cache"):
        for batch in loader(tiny):
            assert [read_frame_code(f) for f in batch[CAM0]] == batch["index"].tolist()
    assert not tiny.episode_cache


def test_episode_cache_frames_equal_random_reads(make_sample):
    root = make_sample(copy=False, **{**SPEC, "gop": 4})
    cached = FrameDataset(root, speed=False, video_backend=PyAVBackend(episode_cache_mb=64))
    direct = FrameDataset(root, speed=False, video_backend=PyAVBackend(threads=1))
    order = np.random.default_rng(3).permutation(len(cached))
    for i in order[:40].tolist():
        a, b = cached[i], direct[i]
        np.testing.assert_array_equal(a[CAM0], b[CAM0])
        np.testing.assert_array_equal(a[CAM1], b[CAM1])


def test_sharded_loader_by_name_gets_the_stream_episode_cache(make_sample):
    """``video_backend="pyav"`` on the stream decodes whole episodes once (the episode cache is on
    by default there), and its frames are the same as a random read's."""
    from episodekit.loaders import ShardedLoader
    from episodekit.loaders.video import STREAM_EPISODE_CACHE_MB
    from episodekit.metadata.plans.build import ensure_plans

    root = make_sample(**SPEC)
    ensure_plans(str(root), [1], 1)
    loader = ShardedLoader(
        root, rank=0, world_size=1, num_workers=1, worker=0, batch_size=16, speed=False,
        video_backend="pyav",
    )  # fmt: skip
    backend = loader.frames.video_backend
    assert backend.episode_cache and backend.episode_cache_bytes == STREAM_EPISODE_CACHE_MB << 20
    seen = 0
    for batch in loader:
        assert [read_frame_code(f) for f in batch[CAM0]] == batch["index"].tolist()
        seen += len(batch["index"])
    assert seen == len(loader)
