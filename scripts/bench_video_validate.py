"""Benchmark the ``video.*`` checks (issue 15's bar: <= 2x the same validation without them).

Writes (or reuses) a LeRobot-style sample with ``--episodes`` episodes x 2 AV1 cameras (GOP 2,
several episodes per mp4), then times ``validate(root)`` with every default check and the same
run with ``-video``, alternating, best of ``--repeat``; both in the same run.

    .venv/bin/python scripts/bench_video_validate.py [--episodes 1000] [--mean-length 100]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from episodekit.sample import write_sample
from episodekit.validate.runner import validate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=1000)
    p.add_argument("--mean-length", type=float, default=100)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default="/tmp/bench_video_validate")
    a = p.parse_args()
    root = Path(a.dir) / f"ep{a.episodes}_len{int(a.mean_length)}"
    if not (root / "meta/info.json").exists():
        t0 = time.perf_counter()
        write_sample(
            root, episodes=a.episodes, mean_length=a.mean_length, videos=2, video_files_size_in_mb=2
        )
        print(f"wrote {root} in {time.perf_counter() - t0:.1f}s")
    n_mp4 = len(list(root.glob("videos/*/*/*.mp4")))
    with_video, without = [], []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        r1 = validate(str(root))
        with_video.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        r2 = validate(str(root), checks="all,-video")
        without.append(time.perf_counter() - t0)
    assert not r1.errors and not r2.errors, (r1.errors[:3], r2.errors[:3])
    frames = sum(1 for _ in root.glob("data/*/*.parquet"))
    print(
        f"{a.episodes} episodes x 2 cameras, {n_mp4} mp4s, {frames} data files: "
        f"validate with video {min(with_video):.3f}s, without {min(without):.3f}s, "
        f"ratio {min(with_video) / min(without):.2f}x (bar <= 2x)"
    )


if __name__ == "__main__":
    main()
