"""Benchmark decoded video in the stream (issue 15's bar), ratios in one run.

The random-access loader against LeRobot is ``scripts/bench_lerobot.py``: it runs LeRobot 0.6.1
itself (``LeRobotDataset``, its DataLoader) on video LeRobot recorded, instead of the
re-implementation of its decoder this script had.

stream: one epoch of ``ShardedLoader`` (one camera, 640x480; AV1 GOP 2 and h264 GOP 250) with
  ``PyAVBackend(episode_cache_mb=E)``: each episode of a pool decoded once, in one sequential pass,
  frames served shuffled from memory; against a per-frame loop over the same frames in the same
  order (seek to the keyframe before each, decode forward to it, convert; files kept open) on the
  first ``--loop-frames`` of the epoch. With one decoder thread everywhere, and with the default
  (ours: FFmpeg's choice for the sequential pass; the loop: PyAV's default). ``floor``: decoding
  every frame of the file once, in order, without conversion (no stream can beat it).
  Bar: >= 5x.

    .venv/bin/python scripts/bench_video.py [--episodes 6] [--loop-frames 300]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import av
import numpy as np

from episodekit.core.video import decode_all
from episodekit.loaders.frames import FrameDataset
from episodekit.loaders.video import STREAM_EPISODE_CACHE_MB
from episodekit.sample import write_sample

CAM0, CAM1 = "observation.images.cam0", "observation.images.cam1"


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
    bench_stream(base, a.episodes, a.loop_frames, a.episode_cache_mb, a.stream_rounds)


if __name__ == "__main__":
    main()
