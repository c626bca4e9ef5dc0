"""Benchmark: CLI start-up, and a fresh (everything skipped) `prepare`, as ratios to baselines
measured in the same run (the machine is noisy; rounds are interleaved, medians reported).

- `episodekit --help` / `--version` vs `python -c "import click"` (bar: <= 2x);
- a skipped `episodekit prepare ROOT` on the demo root (2,500 episodes, ~1M frames, prepared
  first) vs `episodekit --version` (bar: <= 2x: the no-op answers from the validation stamp);
  `episodekit prepare --help` and the import of everything the steps need shown for reference.

    .venv/bin/python scripts/bench_startup.py [--rounds 7] [--root ./demo-data]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
EPISODEKIT = str(BIN / "episodekit")
PREPARE_IMPORTS = (
    "import episodekit.cli, episodekit.prepare, episodekit.prep, episodekit.metadata.costs, "
    "episodekit.metadata.plans.build, episodekit.metadata.speed, episodekit.validate.runner"
)


def wall(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--root", default=None, help="A prepared (or to-be-prepared) demo root.")
    p.add_argument("--episodes", type=int, default=2500)
    a = p.parse_args()
    tmp = None
    if a.root is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-startup-")
        root = Path(tmp.name) / "demo"
    else:
        root = Path(a.root)
    if not (root / "meta/info.json").exists():
        args = ["sample", str(root), "--episodes", str(a.episodes), "--style", "edited"]
        subprocess.run([EPISODEKIT, *args], check=True)
    subprocess.run([EPISODEKIT, "prepare", str(root)], check=True, stdout=subprocess.DEVNULL)

    cases = {
        "python -c 'import click'": [sys.executable, "-c", "import click"],
        "episodekit --version": [EPISODEKIT, "--version"],
        "episodekit --help": [EPISODEKIT, "--help"],
        "episodekit prepare --help": [EPISODEKIT, "prepare", "--help"],
        "prepare start-up (imports)": [sys.executable, "-c", PREPARE_IMPORTS],
        "episodekit prepare (all skipped)": [EPISODEKIT, "prepare", str(root)],
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    for case in cases.values():  # warm the page cache once
        wall(case)
    for _ in range(a.rounds):
        for name, argv in cases.items():
            times[name].append(wall(argv))
    med = {k: statistics.median(v) for k, v in times.items()}
    click_s = med["python -c 'import click'"]
    startup = med["prepare start-up (imports)"]
    print(f"root {root}: {a.rounds} rounds, median wall seconds")
    for name, t in med.items():
        print(f"  {name:<36} {t:6.3f} s   min {min(times[name]):6.3f}")
    print(f"--help    / import click   = {med['episodekit --help'] / click_s:.2f}x  (bar: <= 2)")
    print(f"--version / import click   = {med['episodekit --version'] / click_s:.2f}x  (bar: <= 2)")
    skipped = med["episodekit prepare (all skipped)"]
    version = med["episodekit --version"]
    print(f"skipped prepare / --version = {skipped / version:.2f}x  (bar: <= 2)")
    print(f"skipped prepare / the steps' imports = {skipped / startup:.2f}x")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
