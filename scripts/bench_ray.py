"""Peak memory of `prepare --executor ray` as frames grow: the driver's and the largest task's.

    .venv/bin/python scripts/bench_ray.py [--dir DIR] [--sizes 2m,8m] [--ray-address ADDR]

For each size, writes (once) an edited-style sample under DIR (default $EPISODEKIT_BENCH, else
./bench-data): 2m = 5,600 episodes (~2.0M frames), 8m = 22,400 (~7.9M), 10m = 28,000, 40m =
112,000; then runs `prepare --out ... --executor ray --stats recompute --frames` (every step:
rewrite, stats, validation with quality.*, frame store) under scripts/peak_rss.py, which polls the
process tree: the driver is the `episodekit` process, a task's peak is the largest peak of a Ray
worker process (`ray::...`). Prints both per size and the ratio between consecutive sizes.
Bars (issue 28): each <= 512 MiB, and <= 1.15x when the frames grow 4x (judged on 2m -> 8m and
10m -> 40m; the issue's bar is the 2m -> 8m pair). The samples' episodes grow with their frames,
so what the driver holds per episode shows in these ratios too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak_rss import measure  # noqa: E402

EK = [sys.executable, "-m", "episodekit.cli"]
EPISODES = {"2m": 5_600, "8m": 22_400, "10m": 28_000, "40m": 112_000}
BAR_MIB, BAR_RATIO = 512, 1.15


def sample(folder: Path, size: str) -> Path:
    """The size's source sample (written once, kept)."""
    root = folder / f"s{size}"
    if not root.exists():
        n = str(EPISODES[size])
        cmd = [*EK, "sample", str(root), "--episodes", n, "--style", "edited", "--seed", "7"]
        subprocess.run(cmd, check=True)
    return root


def run(src: Path, address: str | None) -> dict:
    """One `prepare --executor ray` into a temporary copy; its peaks (MiB)."""
    with tempfile.TemporaryDirectory(dir=src.parent) as tmp:
        cmd = [*EK, "prepare", str(src), "--out", f"{tmp}/out", "--executor", "ray", "-q"]
        cmd += ["--stats", "recompute", "--frames"]
        if address:
            cmd += ["--ray-address", address]
        os.environ["EPISODEKIT_CACHE"] = f"{tmp}/cache"
        res = measure(cmd)
        shutil.rmtree(tmp, ignore_errors=True)
    if res["exit"] != 0:
        raise SystemExit(f"prepare failed (exit {res['exit']}) on {src}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("EPISODEKIT_BENCH", "bench-data"))
    ap.add_argument("--sizes", default="2m,8m")
    ap.add_argument("--ray-address", default=None)
    args = ap.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in args.sizes.split(","):
        res = run(sample(folder, size), args.ray_address)
        rows.append((size, res))
        print(
            f"{size:>4}: driver {res['driver_mib']:7.1f} MiB  max task (worker) "
            f"{res['worker_mib']:7.1f} MiB  ({res['workers']} workers, {res['seconds']} s)",
            flush=True,
        )
        for name, (d, w) in res["steps"].items():
            print(f"      {name:<10} driver {d:7.1f} MiB  max worker {w:7.1f} MiB", flush=True)
        ray_own = ", ".join(f"{n} {m:.0f}" for n, m in res["others"].items())
        print(f"      Ray's own processes (peak MiB each): {ray_own}", flush=True)
        print(f"      whole process tree at its largest: {res['tree_mib']:.0f} MiB", flush=True)
    for size, res in rows:
        ok = res["driver_mib"] <= BAR_MIB and res["worker_mib"] <= BAR_MIB
        print(f"{size}: each <= {BAR_MIB} MiB: {'met' if ok else 'NOT met'}")
    for (a, ra), (b, rb) in zip(rows, rows[1:]):
        d = rb["driver_mib"] / ra["driver_mib"]
        w = rb["worker_mib"] / max(ra["worker_mib"], 1e-9)
        line = f"{a} -> {b}: driver x{d:.2f}, max task x{w:.2f}"
        if EPISODES[b] == 4 * EPISODES[a]:  # the bar is judged where the frames grow 4x
            ok = d <= BAR_RATIO and w <= BAR_RATIO
            line += f"  (<= {BAR_RATIO}x per 4x frames: {'met' if ok else 'NOT met'})"
        print(line)


if __name__ == "__main__":
    main()
