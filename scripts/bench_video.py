"""Benchmark decoded video in the loader and the stream (issue 15's bars), ratios in one run.

loader: random ``ds[i]`` with a 2-frame window on one camera plus the current frame of a second
  camera, on a LeRobot-style AV1 sample (GOP 2, 96x128, several episodes per mp4):
  ``FrameDataset(..., video_backend="pyav")`` against LeRobot's ``decode_video_frames_pyav``
  (huggingface/lerobot@7427f318, src/lerobot/datasets/video_utils.py), re-implemented here step for
  step because lerobot cannot be installed next to this environment (it pins torch < 2.12 and
  numpy < 2.3, and its datasets package imports ``datasets``): one call per camera and item, each
  opening the file, seeking 1 tick before the first query, decoding forward to the last and
  converting every decoded frame to a CHW torch tensor, then the closest frame within tolerance
  and float32 / 255. Its queries are precomputed (LeRobot's parquet/``datasets`` work per item is
  not timed: the baseline is faster than LeRobotDataset); ours is timed end to end. Torch runs one
  thread (as in DataLoader workers); the baseline with FFmpeg's default decoder threads and with
  one. The variants run interleaved in rounds so that load on the shared machine hits all alike.
  Bar: >= 5x the faster baseline.
stream: one epoch of ``ShardedLoader`` (one camera, 640x480; AV1 GOP 2 and h264 GOP 250) with
  ``PyAVBackend(episode_cache_mb=E)``: each episode of a pool decoded once, in one sequential pass,
  frames served shuffled from memory; against a per-frame loop over the same frames in the same
  order (seek to the keyframe before each, decode forward to it, convert; files kept open) on the
  first ``--loop-frames`` of the epoch. With one decoder thread everywhere, and with the default
  (ours: FFmpeg's choice for the sequential pass; the loop: PyAV's default). ``floor``: decoding
  every frame of the file once, in order, without conversion (no stream can beat it).
  Bar: >= 5x.

    .venv/bin/python scripts/bench_video.py [--part loader|stream|all] [--samples 1000]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import av
import numpy as np
import torch

from episodekit.core.video import decode_all
from episodekit.loaders.frames import FrameDataset
from episodekit.loaders.video import STREAM_EPISODE_CACHE_MB
from episodekit.sample import write_sample

CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"


def lerobot_decode(path: str, timestamps: list[float], tolerance_s: float, threads: int | None):
    """LeRobot's ``decode_video_frames_pyav`` (lerobot@7427f318), step for step; ``threads``
    sets the decoder's thread count (None: PyAV's default, as LeRobot leaves it)."""
    first_ts, last_ts = min(timestamps), max(timestamps)
    loaded_frames, loaded_ts = [], []
    with av.open(path) as container:
        stream = container.streams.video[0]
        if threads is not None:
            stream.codec_context.thread_count = threads
        container.seek(
            round(first_ts / stream.time_base) - 1, backward=True, any_frame=False, stream=stream
        )
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            current_ts = float(frame.pts * stream.time_base)
            arr = frame.to_ndarray(format="rgb24")
            loaded_frames.append(torch.from_numpy(arr).permute(2, 0, 1).contiguous())
            loaded_ts.append(current_ts)
            if current_ts >= last_ts:
                break
    query_ts = torch.tensor(timestamps)
    loaded_ts_t = torch.tensor(loaded_ts)
    dist = torch.cdist(query_ts[:, None], loaded_ts_t[:, None], p=1)
    min_, argmin_ = dist.min(1)
    if not (min_ <= tolerance_s).all():
        raise RuntimeError("FrameTimestampError")
    closest_frames = torch.stack([loaded_frames[idx] for idx in argmin_])
    return closest_frames.type(torch.float32) / 255


class Clock:
    """Accumulated wall and CPU seconds of one variant over interleaved rounds."""

    def __init__(self):
        self.wall = self.cpu = 0.0
        self.n = 0

    def run(self, n: int, fn, *args) -> None:
        w, c = time.perf_counter(), time.process_time()
        fn(*args)
        self.wall += time.perf_counter() - w
        self.cpu += time.process_time() - c
        self.n += n

    @property
    def rate(self) -> float:
        return self.n / self.wall

    @property
    def cpu_rate(self) -> float:
        return self.n / self.cpu


def bench_loader(base: Path, n: int, rounds: int) -> None:
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
    torch.set_num_threads(1)
    fds = FrameDataset(root, delta_timestamps=window, speed=False, video_backend="pyav")

    def baseline(part, threads):
        for p0, t0s, p1, t1s in part:
            lerobot_decode(p0, t0s, 1e-4, threads)
            lerobot_decode(p1, t1s, 1e-4, threads)

    def ours(part):
        for i in part:
            fds[i]

    clocks = {"default": Clock(), "one": Clock(), "ours": Clock()}
    for r in range(rounds):
        sl = slice(r * n // rounds, (r + 1) * n // rounds)
        m = sl.stop - sl.start
        clocks["default"].run(m, baseline, queries[sl], None)
        clocks["one"].run(m, baseline, queries[sl], 1)
        clocks["ours"].run(m, ours, idx[sl].tolist())
    d, o, mine = clocks["default"], clocks["one"], clocks["ours"]
    best = max(d.rate, o.rate)
    best_cpu = max(d.cpu_rate, o.cpu_rate)
    print(
        f"loader: {len(plain)} frames, 200 episodes, {n_files} mp4s (AV1 GOP 2, 96x128), "
        f"{n} random ds[i] (2-frame window on cam0 + cam1 current), {rounds} interleaved rounds, "
        f"torch 1 thread:\n"
        f"  LeRobot decode_video_frames_pyav per camera: {d.rate:.1f} samples/s (FFmpeg default "
        f"threads), {o.rate:.1f} (1 decoder thread)\n"
        f"  FrameDataset(video_backend='pyav'): {mine.rate:.1f} samples/s  ->  "
        f"{mine.rate / d.rate:.1f}x the default-thread baseline, {mine.rate / o.rate:.1f}x the "
        f"one-thread baseline; {mine.rate / best:.1f}x the faster (bar >= 5x)\n"
        f"  CPU time: baseline {d.cpu_rate:.1f} / {o.cpu_rate:.1f}, ours {mine.cpu_rate:.1f} "
        f"samples per CPU-second -> {mine.cpu_rate / best_cpu:.1f}x"
    )


def per_frame_loop(path_of, seconds: np.ndarray, frames: np.ndarray, threads: int | None) -> int:
    """The baseline: for each frame (in the given order), seek to the keyframe before it and
    decode forward to it, convert it to RGB; containers kept open (one per file)."""
    open_files: dict[str, tuple] = {}
    n = 0
    for g, t in zip(frames.tolist(), seconds.tolist()):
        path = path_of[g]
        if path not in open_files:
            c = av.open(path)
            st = c.streams.video[0]
            if threads is not None:
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


def stream_epoch(loader, cache_mb: float, threads: int | None, total: int) -> None:
    from episodekit.loaders.video import PyAVBackend

    n = 0
    for batch in loader(PyAVBackend(episode_cache_mb=cache_mb, threads=threads)):
        n += len(batch[CAM0])
    assert n == total


def frames_loop(path_of, ref, order, threads: int | None) -> None:
    done = per_frame_loop(path_of, ref["timestamp"], order[: len(ref["timestamp"])], threads)
    assert done == len(ref["timestamp"])


def decode_floor(mp4: list, threads: int | None) -> None:
    for f in mp4:
        decode_all(f, threads=0 if threads is None else threads)


def bench_stream(base: Path, episodes: int, loop_frames: int, cache_mb: float, rounds: int):
    from episodekit.loaders import ShardedLoader
    from episodekit.loaders.video import PyAVBackend
    from episodekit.metadata.plans.build import ensure_plans

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
        total = int(np.sum(plain.episode_lengths))
        mp4 = sorted(root.glob("videos/*/*/*.mp4"))

        def loader(backend, root=root):
            return ShardedLoader(
                root,
                rank=0,
                world_size=1,
                num_workers=1,
                worker=0,
                batch_size=32,
                speed=False,
                video_backend=backend,
            )

        probe_loader = loader(PyAVBackend(episode_cache_mb=cache_mb))
        order = np.concatenate(list(probe_loader.frame_order(0)))
        pools = probe_loader.bin_order(0, 0).num_pools
        ref = plain.get_frames(order[:loop_frames])[CAM0]
        path_of = dict(zip(order[:loop_frames].tolist(), ref["path"].tolist()))
        for threads in (1, None):
            ours, loop, floor = Clock(), Clock(), Clock()

            for _ in range(rounds):
                ours.run(total, stream_epoch, loader, cache_mb, threads, total)
                loop.run(len(ref["timestamp"]), frames_loop, path_of, ref, order, threads)
                floor.run(total, decode_floor, mp4, threads)
            label = "1 decoder thread" if threads == 1 else "default threads"
            print(
                f"stream {codec} GOP {gop} 640x480, {len(mp4)} mp4, {total} frames, {pools} "
                f"pool(s), {label}, {rounds} rounds: ShardedLoader(PyAVBackend(episode_cache_mb="
                f"{cache_mb:g})) {ours.rate:.1f} frames/s; per-frame seek loop (first "
                f"{len(ref['timestamp'])} frames of the epoch) {loop.rate:.1f} -> "
                f"{ours.rate / loop.rate:.1f}x (bar >= 5x); floor (decode every frame in order, "
                f"no RGB) {floor.rate:.1f} = {floor.rate / loop.rate:.1f}x the loop; CPU time: "
                f"ours {ours.cpu_rate:.1f}, loop {loop.cpu_rate:.1f} frames per CPU-second -> "
                f"{ours.cpu_rate / loop.cpu_rate:.1f}x"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("loader", "stream", "all"), default="all")
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (loader)")
    p.add_argument("--episodes", type=int, default=6, help="episodes of the stream samples")
    p.add_argument("--loop-frames", type=int, default=300, help="frames of the per-frame loop")
    p.add_argument(
        "--episode-cache-mb",
        type=float,
        default=STREAM_EPISODE_CACHE_MB,
        help='the stream\'s episode cache (default: what video_backend="pyav" gets)',
    )
    p.add_argument("--stream-rounds", type=int, default=2)
    p.add_argument("--dir", default="/tmp/bench_video")
    a = p.parse_args()
    base = Path(a.dir)
    if a.part in ("loader", "all"):
        bench_loader(base, a.samples, a.rounds)
    if a.part in ("stream", "all"):
        bench_stream(base, a.episodes, a.loop_frames, a.episode_cache_mb, a.stream_rounds)


if __name__ == "__main__":
    main()
