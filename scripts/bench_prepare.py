"""Benchmark: a first `prepare` on an edited-style sample vs a second one on the same root.

The bar: the second run does no rewriting and takes < 10% of the first run's time. Both runs are
measured in this one script run, so the ratio holds on a noisy machine.

    .venv/bin/python scripts/bench_prepare.py [--episodes 2500] [--dir /tmp/bench_prepare]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from episodekit.prepare import prepare
from episodekit.sample import write_sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--episodes", type=int, default=2500)
    p.add_argument("--dir", default="/tmp/bench_prepare")
    p.add_argument("--executor", default="local", choices=["local", "ray"])
    a = p.parse_args()
    root = Path(a.dir) / "sample"
    shutil.rmtree(a.dir, ignore_errors=True)
    write_sample(root, episodes=a.episodes, style="edited")

    def timed() -> tuple[float, object]:
        t0 = time.perf_counter()
        r = prepare(str(root), world_sizes=(8, 64), num_workers=4, executor=a.executor)
        return time.perf_counter() - t0, r

    t1, first = timed()
    t2, second = timed()
    rewritten = second.step("rowgroups").detail["counts"]["rewritten"]
    print(f"root {first.work_root}: {a.episodes} episodes, edited style")
    print(f"first prepare   {t1:8.2f} s  ok={first.ok}  changed={len(first.changed)} files")
    print(
        f"second prepare  {t2:8.2f} s  ok={second.ok}  changed={len(second.changed)} files, "
        f"rewritten={rewritten}"
    )
    print(f"ratio second/first = {t2 / t1:.3f}  (bar: < 0.10)")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
