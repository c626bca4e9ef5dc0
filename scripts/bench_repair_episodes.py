"""`episodekit repair`'s peak memory against the number of episodes: two crashed recordings of
the same shape but for the episode count (10,000 and 100,000 episodes of 10 frames), in one run.

    .venv/bin/python scripts/bench_repair_episodes.py [--episodes 10000 100000] [--length 10]
        [--dims 7] [--file-mb MB] [--rounds 3] [--dir DIR] [--baseline PYTHON]

The first run records and kills both recordings under DIR (the command that makes the data:
``DIR/e10000/crashed``, ``DIR/e100000/crashed``); every run then measures them (the same command
again reuses DIR). Default DIR: $EPISODEKIT_BENCH/repair-episodes, else
./bench-data/repair-episodes.

Each crash is made by ``scripts/bench_repair.py``'s recorder (LeRobot's recorder, 0.4.x-0.6.1:
one ``write_table`` per episode, so one row group each; the episodes' metadata rows with
LeRobot's per-episode stats 10 at a time; killed with ``os._exit``, the last <= 9 metadata
rows never written), with every episode ``--length`` frames long, into one data file and one
episodes file, both left without a footer (the shape of ``bench_repair.py``'s crash: the cost
measured is the footer-less files'). With ``--file-mb MB`` the recorder rolls both files over
at that size as LeRobot's does at ``data_files_size_in_mb`` (each full file closed, with its
footer): the crash then also has intact files whose footers list tens of thousands of row
groups, read whole by pyarrow (not made flat here; see docs/performance.md).

Measured alternately, each repair in a fresh process (after its imports), ``--rounds`` times:
``repair(ROOT, RepairOptions(out=OUT))`` of each crash (and, with ``--baseline``, the same run
by another interpreter whose episodekit is an older checkout: before/after in one run).
Reported per crash: wall time, peak RSS above the process's RSS after its imports (median over
rounds) and the peak reached by the end of each step (inspect, plan, build, verify, stats);
then the ratio of the larger crash's peak to the smaller's (the median of the per-round
ratios; the bar: <= 1.2x).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bench_repair import RECORD, TASKS

MEASURE = r"""
import json, sys, time
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
def now():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
from episodekit.writers import repair as repair_mod, repair_build
from episodekit.writers.repair import RepairOptions, repair
start = now()
steps = {}
def step(name, module, attr):  # the peak so far when each step ends
    inner = getattr(module, attr)
    def wrapped(*args, **kwargs):
        try:
            return inner(*args, **kwargs)
        finally:
            steps[name] = peak() - start
    setattr(module, attr, wrapped)
step("inspect", repair_mod, "inspect_root")
step("plan", repair_mod, "plan_repair")
step("build", repair_build, "build")
step("verify", repair_mod, "verify")
step("stats", repair_build, "build_stats")
t0 = time.perf_counter()
result = repair(sys.argv[1], RepairOptions(out=sys.argv[2]))
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "episodes": result.episodes, "frames": result.frames,
                  "startup": start, "grew": peak() - start, "steps": steps}))
"""


def child(code: str, *args: str, python: str = sys.executable) -> dict:
    p = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=7200)
    if p.returncode != 0:
        raise SystemExit(f"child failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def record(base: Path, episodes: int, length: int, dims: int, file_mb: float | None) -> Path:
    """The crash of ``episodes`` episodes of ``length`` frames under ``base`` (made once)."""
    root = base / "crashed"
    if not (root / "meta/info.json").exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        spec = {
            "root": str(root),
            "frames": episodes * length,
            "dims": dims,
            "tasks": TASKS,
            "length": [length, length],
            "file_mb": file_mb,
            "intact": False,
        }
        t0 = time.perf_counter()
        made = child(RECORD, json.dumps(spec))
        print(f"recorded and killed: {made} in {time.perf_counter() - t0:.0f}s")
    return root


def describe(root: Path) -> str:
    files = sorted(root.glob("data/*/*.parquet"))
    size = sum(f.stat().st_size for f in files)
    metas = sorted(root.glob("meta/episodes/*/*.parquet"))
    msize = sum(f.stat().st_size for f in metas)
    return (
        f"{len(files)} data file(s) ({size / 2**20:.0f} MB), {len(metas)} episodes file(s) "
        f"({msize / 2**20:.0f} MB), the last of each footer-less"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, nargs=2, default=[10_000, 100_000])
    ap.add_argument("--length", type=int, default=10, help="frames per episode")
    ap.add_argument("--dims", type=int, default=7)
    ap.add_argument(
        "--file-mb",
        type=float,
        default=None,
        help="roll the data and episodes files over at this size, as the recorder does at "
        "data_files_size_in_mb (default: one file each, footer-less)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    default = Path(os.environ.get("EPISODEKIT_BENCH", "bench-data")) / "repair-episodes"
    ap.add_argument("--dir", type=Path, default=default)
    ap.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="also run repair by this interpreter (one that imports an older episodekit), in "
        "the same rounds: before/after from one run",
    )
    args = ap.parse_args()
    small, large = args.episodes
    roots = {}
    for n in (small, large):
        roots[n] = record(args.dir / f"e{n}", n, args.length, args.dims, args.file_mb)
        print(f"{n:,} episodes of {args.length} frames: {describe(roots[n])}")
    runs = [("repair", sys.executable)]
    if args.baseline:
        runs.append(("baseline", args.baseline))
    got: dict[tuple[str, int], list[dict]] = {(w, n): [] for w, _ in runs for n in roots}
    for r in range(args.rounds):
        for what, python in runs:
            for n, root in roots.items():
                out = args.dir / f"out{r}"
                shutil.rmtree(out, ignore_errors=True)
                m = child(MEASURE, str(root), str(out), python=python)
                shutil.rmtree(out, ignore_errors=True)
                if m["episodes"] != n:
                    raise SystemExit(f"repair kept {m['episodes']} episodes of {n}")
                got[what, n].append(m)
                steps = ", ".join(f"{k} +{v / 2**20:.0f}" for k, v in m["steps"].items())
                print(
                    f"  round {r + 1} {what:8s} {n:>7,} episodes {m['seconds']:6.2f}s  peak RSS "
                    f"+{m['grew'] / 2**20:.0f} MB over start-up {m['startup'] / 2**20:.0f} MB "
                    f"(by the end of each step, MB: {steps})"
                )
    if not args.rounds:
        return
    for what, _ in runs:
        a, b = got[what, small], got[what, large]
        ratio = float(np.median([y["grew"] / x["grew"] for x, y in zip(a, b)]))
        mb = {n: float(np.median([m["grew"] for m in got[what, n]])) / 2**20 for n in roots}
        sec = {n: float(np.median([m["seconds"] for m in got[what, n]])) for n in roots}
        print(
            f"{what}: peak RSS above start-up (median of {args.rounds}) {small:,} episodes "
            f"{mb[small]:.0f} MB ({sec[small]:.1f}s), {large:,} episodes {mb[large]:.0f} MB "
            f"({sec[large]:.1f}s): {ratio:.2f}x (bar <= 1.2x)"
        )


if __name__ == "__main__":
    main()
