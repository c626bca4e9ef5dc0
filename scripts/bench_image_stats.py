"""Time `metadata stats` with and without --images on a video sample (same run, same root).

.venv/bin/python scripts/bench_image_stats.py [ROOT]   (default $EPISODEKIT_BENCH/images-vid)
Writes a 10-episode sample (~300 frames each, 240x320 AV1) unless ROOT already holds one.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from episodekit.metadata.stats import ensure_stats
from episodekit.sample import write_sample

# Where scripts/bench_data.py wrote the benchmark roots (EPISODEKIT_BENCH, default ./bench-data).
BENCH = os.environ.get("EPISODEKIT_BENCH", "bench-data")

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=os.path.join(BENCH, "images-vid"))
    root = Path(ap.parse_args().root)
    if not (root / "meta/info.json").exists():
        write_sample(
            root, episodes=10, tasks=1, seed=1, mean_length=300, videos=1, video_size=(240, 320)
        )
    res, wall = None, {}
    for images in (False, True):
        t = time.perf_counter()
        res, status = ensure_stats(root, force=True, images=images, jobs=2)
        wall[images] = time.perf_counter() - t
        print(f"images={images}: {status}, {wall[images]:.2f} s wall")
    sampled = int(res.images.samples.sum())
    print(f"frames {int(res.episode_count.sum())}, sampled {sampled}")
    print(
        f"--images: {wall[True] / wall[False]:.1f}x the numeric stats of the same root (baseline, "
        f"same run); {sampled / max(wall[True] - wall[False], 1e-9):,.0f} sampled frames/s decoded"
    )
