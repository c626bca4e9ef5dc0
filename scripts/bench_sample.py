"""Benchmark the sample writer and `info` on a big sample (issue 2's "done when").

Writes `--episodes` episodes (default 20,000, >= 5M frames) with `write_sample`, then times:
- the write, against copying the written tree (`shutil.copytree`: the bytes-on-disk floor);
- `describe` (what `episodekit info` prints), against reading every data file's footer with
  `pq.read_metadata` (the floor of what `info` must read).
Both baselines are measured in the same run, so the ratios hold on a noisy machine.

    .venv/bin/python scripts/bench_sample.py [--episodes 20000] [--dir /tmp/bench_sample]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq

from episodekit.info import describe
from episodekit.sample import write_sample


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=20_000)
    p.add_argument("--dir", default="/tmp/bench_sample")
    a = p.parse_args()
    base = Path(a.dir)
    shutil.rmtree(base, ignore_errors=True)
    root = base / "big"
    t_write, _ = timed(lambda: write_sample(root, episodes=a.episodes))
    t_copy, _ = timed(lambda: shutil.copytree(root, base / "copy"))
    t_info, d = timed(lambda: describe(str(root)))
    files = sorted((root / "data").rglob("*.parquet"))
    t_footers, _ = timed(lambda: [pq.read_metadata(f) for f in files])
    print(
        f"{d['episodes']:,} episodes, {d['frames']:,} frames, {len(files)} data files, "
        f"{d['row_groups_total']:,} row groups"
    )
    print(
        f"write_sample {t_write:7.2f} s   copytree of the result {t_copy:6.2f} s   "
        f"ratio {t_write / t_copy:6.1f}x   ({d['frames'] / t_write / 1e6:.2f}M frames/s)"
    )
    print(
        f"info         {t_info:7.2f} s   read all footers       {t_footers:6.2f} s   "
        f"ratio {t_info / t_footers:6.1f}x"
    )
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
