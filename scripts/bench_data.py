"""Write the benchmark roots the figures in docs/performance.md were measured on.

    .venv/bin/python scripts/bench_data.py [--dir DIR] [NAME ...]   # default: every root

DIR defaults to $EPISODEKIT_BENCH, else ./bench-data (git-ignored); the benchmark scripts read
their roots from the same place. Each root is made by the `episodekit` commands printed as it
runs (so a reader can also type them), with fixed seeds: the same bytes on every machine.
A root that exists is kept (delete it to remake it). Sizes: big10m ~10.1M frames (~4 GB of
parquet + a 1.4 GB frame store), quality-2m ~2M frames, v21-2m ~3.9M frames in v2.1 (one file
per episode), v21-vid 200 v2.1 episodes with two cameras, video-av1 40 episodes with two AV1
cameras at 240x320. (scripts/bench_image_stats.py writes its own small video root, images-vid,
on its first run.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

EK = [sys.executable, "-m", "episodekit.cli"]

# name -> the commands that make it ({d}: the root's folder, {dir}: the benchmark folder)
ROOTS: dict[str, list[list[str]]] = {
    # 38,000 episodes (~10.1M frames; 25,000 gave 10.2M before the sample's lengths changed to
    # a mean of ~266) as LeRobot's editing tools leave them, then prepared:
    # 32 MiB row groups, plans for 8 x 2, 8 x 4 and 64 x 4, the canonical plan.
    "big10m": [
        ["sample", "{d}", "--episodes", "38000", "--style", "edited", "--seed", "5"],
        ["prepare", "{d}", "--world-size", "8,64", "--workers", "2", "--canonical-bins", "auto"],
        ["metadata", "plan", "{d}", "--world-size", "8,64", "--workers", "4"],
    ],
    # big10m's frame store, published next to it (bench_store, bench_mixture --store)
    "store-big10m": [["prep", "frames", "{dir}/big10m", "--store", "{d}"]],
    # 5,000 episodes (~2M frames) for the data-quality and stats passes
    "quality-2m": [
        ["sample", "{d}", "--episodes", "5000", "--style", "edited", "--seed", "7"],
        ["prepare", "{d}"],
    ],
    # 40 episodes, two AV1 cameras (LeRobot's encoding: libsvtav1, GOP 2) at 240x320, plans
    # for 1 x 1, 2 and 4 workers (bench_workers: decoding dominates)
    "video-av1": [
        ["sample", "{d}", "--episodes", "40", "--videos", "2", "--video-size", "240x320"],
        ["prepare", "{d}", "--world-size", "1", "--workers", "2"],
        ["metadata", "plan", "{d}", "--world-size", "1", "--workers", "1"],
        ["metadata", "plan", "{d}", "--world-size", "1", "--workers", "4"],
    ],
    "stats-root": [["sample", "{d}", "--episodes", "5000", "--style", "edited", "--seed", "8"]],
    # v2.1 (one parquet per episode, meta/*.jsonl): 10,000 episodes (~3.9M frames) for convert
    "v21-2m": [
        ["sample", "{d}", "--episodes", "10000", "--codebase-version", "v2.1", "--seed", "11"]
    ],
    # v2.1 with two AV1 cameras (96x128, one mp4 per episode and camera) for convert
    "v21-vid": [
        [
            "sample",
            "{d}",
            "--episodes",
            "200",
            "--codebase-version",
            "v2.1",
            "--videos",
            "2",
            "--video-size",
            "96x128",
            "--seed",
            "12",
        ],
    ],  # fmt: skip
}


def make(name: str, folder: Path) -> None:
    """Run ``name``'s commands unless its root exists."""
    d = folder / name
    if d.exists():
        print(f"{d}: exists, kept")
        return
    for cmd in ROOTS[name]:
        args = [a.format(d=d, dir=folder) for a in cmd]
        print("$ episodekit " + " ".join(args), flush=True)
        subprocess.run([*EK, *args], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("EPISODEKIT_BENCH", "bench-data"))
    ap.add_argument("names", nargs="*", choices=[[], *ROOTS], default=[], metavar="NAME")
    args = ap.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    for name in args.names or list(ROOTS):
        make(name, folder)


if __name__ == "__main__":
    main()
