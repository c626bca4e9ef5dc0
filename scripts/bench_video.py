"""Benchmark decoded video in the loader and the stream (issue 15's bars), ratios in one run.

loader: random ``ds[i]`` with a 2-frame window on one camera plus the current frame of a second
  camera, on a LeRobot-style AV1 sample (GOP 2, 96x128, several episodes per mp4):
  ``FrameDataset(..., video_backend="pyav")`` against LeRobot's per-query algorithm
  (``decode_video_frames_torchvision`` with the pyav backend, re-implemented here with PyAV
  because lerobot is not installed: open the file, seek to the keyframe before the first query,
  decode forward to the last, pick the closest frame within tolerance, convert to float32/255),
  with FFmpeg's default decoder threads and with one thread. The baseline gets the queries
  precomputed (its parquet reads are not timed); ours is timed end to end. Bar: >= 5x.
stream: one epoch of ``ShardedLoader`` (one camera, 640x480; AV1 GOP 2 and h264 GOP 250) with
  ``PyAVBackend(episode_cache_mb=600)``: each episode of the pool decoded once in timestamp order
  (``decode_episode``), frames served shuffled from memory; against a per-frame loop over the same
  frames in the same order (seek to the keyframe before each, decode forward to it; files kept
  open). One decoder thread everywhere (DataLoader workers). Bar: >= 5x.

    .venv/bin/python scripts/bench_video.py [--part loader|stream|all] [--samples 400]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import av
import numpy as np

from episodekit.loaders.frames import FrameDataset
from episodekit.loaders.video import decode_episode
from episodekit.sample import write_sample

CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"


def lerobot_decode(path: str, timestamps: list[float], tolerance_s: float, threads: int | None):
    """LeRobot's pyav path, one call per query: open, seek, decode forward, closest frame."""
    container = av.open(path)
    stream = container.streams.video[0]
    if threads is not None:
        stream.codec_context.thread_count = threads
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
    if (dist.min(1) > tolerance_s).any():
        raise RuntimeError("FrameTimestampError")
    return np.stack([frames[i] for i in dist.argmin(1)]).astype(np.float32) / 255


def bench_loader(base: Path, n: int) -> None:
    root = base / "loader_av1_gop2_96x128"
    if not (root / "meta/info.json").exists():
        write_sample(
            root,
            episodes=200,
            mean_length=100,
            videos=2,
            video_size=(96, 128),
            video_files_size_in_mb=1.2,
            seed=3,
        )
    n_files = len(list(root.glob("videos/*/*/*.mp4")))
    window = {CAM0: [-1 / 30, 0.0]}
    plain = FrameDataset(root, delta_timestamps=window, speed=False)
    idx = np.random.default_rng(0).integers(0, len(plain), n)
    queries = []
    for i in idx.tolist():
        s = plain[i]
        queries.append(
            (
                s[CAM0]["path"],
                s[CAM0]["timestamp"].tolist(),
                s[CAM1]["path"],
                [float(s[CAM1]["timestamp"])],
            )
        )

    def baseline(threads):
        t0 = time.perf_counter()
        for p0, t0s, p1, t1s in queries:
            lerobot_decode(p0, t0s, 1e-4, threads)
            lerobot_decode(p1, t1s, 1e-4, threads)
        return n / (time.perf_counter() - t0)

    def ours():
        fds = FrameDataset(root, delta_timestamps=window, speed=False, video_backend="pyav")
        t0 = time.perf_counter()
        for i in idx.tolist():
            fds[i]
        return n / (time.perf_counter() - t0)

    base_default, base_one, mine = baseline(None), baseline(1), ours()
    best = max(base_default, base_one)
    print(
        f"loader: {len(plain)} frames, 200 episodes, {n_files} mp4s (AV1 GOP 2, 96x128), "
        f"{n} random ds[i] (2-frame window on cam0 + cam1 current):\n"
        f"  LeRobot algorithm per query: {base_default:.1f} samples/s (default threads), "
        f"{base_one:.1f} (1 thread)\n"
        f"  FrameDataset(video_backend='pyav'): {mine:.1f} samples/s  ->  "
        f"{mine / best:.1f}x the faster baseline (bar >= 5x)"
    )


def per_frame_loop(path_of, seconds: np.ndarray, frames: np.ndarray, threads: int) -> int:
    """The baseline: for each frame (in the given order), seek to the keyframe before it and
    decode forward to it; containers kept open (one per file)."""
    open_files: dict[str, tuple] = {}
    n = 0
    for g, t in zip(frames.tolist(), seconds.tolist()):
        path = path_of[g]
        if path not in open_files:
            c = av.open(path)
            st = c.streams.video[0]
            st.codec_context.thread_count = threads
            open_files[path] = (c, st)
        container, stream = open_files[path]
        container.seek(int(round(t / stream.time_base)), stream=stream, backward=True)
        for frame in container.decode(stream):
            if abs(float(frame.pts * stream.time_base) - t) < 1e-4:
                frame.to_ndarray(format="rgb24")
                n += 1
                break
    for c, _ in open_files.values():
        c.close()
    return n


def bench_stream(base: Path, episodes: int) -> None:
    from episodekit.loaders import ShardedLoader
    from episodekit.loaders.video import PyAVBackend
    from episodekit.metadata.plans import ensure_plans

    for codec, gop in (("av1", 2), ("h264", 250)):
        root = base / f"stream_{codec}_gop{gop}_640x480"
        if not (root / "meta/info.json").exists():
            write_sample(
                root,
                episodes=episodes,
                mean_length=120,
                videos=1,
                video_size=(480, 640),
                video_codec=codec,
                gop=gop,
                seed=4,
            )
        ensure_plans(str(root), [1], 1)
        plain = FrameDataset(root, speed=False)
        starts = np.concatenate([[0], np.cumsum(plain.episode_lengths)])
        total = int(starts[-1])

        def loader(backend, root=root):
            return ShardedLoader(
                root,
                rank=0,
                world_size=1,
                num_workers=1,
                worker=0,
                batch_size=32,
                pool_episodes=1,
                speed=False,
                video_backend=backend,
            )

        order = np.concatenate(list(loader(None).frame_order(0)))
        ref = plain.get_frames(order)[CAM0]
        path_of = dict(zip(order.tolist(), ref["path"].tolist()))
        t0 = time.perf_counter()
        n = 0
        for batch in loader(PyAVBackend(episode_cache_mb=600)):
            n += len(batch[CAM0])
        ours = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for e in range(len(starts) - 1):
            v = plain.get_batch(np.arange(starts[e], starts[e + 1]))[CAM0]
            decode_episode(v["path"][0], v["timestamp"])
        sequential = total / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        done = per_frame_loop(path_of, ref["timestamp"], order, threads=1)
        loop = done / (time.perf_counter() - t0)
        assert done == len(order) == n
        print(
            f"stream {codec} GOP {gop} 640x480, {len(starts) - 1} episodes, {total} frames, "
            f"1 decoder thread: ShardedLoader(video_backend=PyAVBackend(episode_cache_mb=600), "
            f"pool 1 episode) {ours:.1f} frames/s; decode_episode alone {sequential:.1f}; "
            f"per-frame seek loop in the loader's order {loop:.1f} -> {ours / loop:.1f}x "
            f"(bar >= 5x)"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("loader", "stream", "all"), default="all")
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--episodes", type=int, default=6, help="episodes of the stream samples")
    p.add_argument("--dir", default="/tmp/bench_video")
    a = p.parse_args()
    base = Path(a.dir)
    if a.part in ("loader", "all"):
        bench_loader(base, a.samples)
    if a.part in ("stream", "all"):
        bench_stream(base, a.episodes)


if __name__ == "__main__":
    main()
