"""Benchmark: a first `prepare` on the demo root vs a second one on the same root.

The demo root is what `make demo` writes: 2,500 episodes, ~1M frames, `edited` style (one row
group per file). Both runs are measured in this one script run, as a user runs them (the
`episodekit` command in a fresh process, start-up included) and in-process (the library call
alone), so the ratios hold on a noisy machine. The bar: the second run rewrites nothing, starts
no process pool, and takes < 10% of the first run's time.

    .venv/bin/python scripts/bench_prepare.py [--episodes 2500] [--dir /tmp/bench_prepare]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from episodekit.prepare import prepare
from episodekit.sample import write_sample

EPISODEKIT = str(Path(sys.executable).parent / "episodekit")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--episodes", type=int, default=2500)
    p.add_argument("--dir", default="/tmp/bench_prepare")
    p.add_argument("--executor", default="local", choices=["local", "ray"])
    a = p.parse_args()
    root = Path(a.dir) / "sample"
    cli_root = Path(a.dir) / "sample-cli"
    shutil.rmtree(a.dir, ignore_errors=True)
    write_sample(root, episodes=a.episodes, style="edited")
    shutil.copytree(root, cli_root)

    def in_process() -> tuple[float, object]:
        t0 = time.perf_counter()
        r = prepare(str(root), executor=a.executor)  # the defaults: world sizes 8,64 x 4
        return time.perf_counter() - t0, r

    def as_a_user() -> float:
        t0 = time.perf_counter()
        cmd = [EPISODEKIT, "prepare", str(cli_root), "--executor", a.executor, "-q"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - t0

    c1 = as_a_user()
    c2 = as_a_user()
    t1, first = in_process()
    t2, second = in_process()
    counts = second.step("rowgroups").detail["counts"]
    print(f"root {root}: {a.episodes} episodes, edited style, default world sizes")
    print(f"first prepare   {t1:8.2f} s  ok={first.ok}  changed={len(first.changed)} files")
    print(
        f"second prepare  {t2:8.2f} s  ok={second.ok}  changed={len(second.changed)} files, "
        f"rewritten={counts['rewritten']}, statuses={[s.status for s in second.steps]}"
    )
    print(f"in-process  ratio second/first = {t2 / t1:.3f}  (bar: < 0.10)")
    print(f"episodekit prepare (CLI): first {c1:.2f} s, second {c2:.2f} s")
    print(f"as a user   ratio second/first = {c2 / c1:.3f}  (start-up included)")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
