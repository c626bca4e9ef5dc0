"""`episodekit edit --images-to-video` against LeRobot 0.6.1's `convert_image_to_video_dataset` on
the same image dataset (images stored in the data rows), in interleaved rounds.

Usage: python scripts/bench_images_to_video.py ROOT --lerobot-python PY [--rounds 3] [--dir DIR]
ROOT: a LeRobot v3.0 root with image features (e.g. written by
`tests/fixtures/lerobot/tools/make_lerobot_dataset.py ROOT --images ...`); PY: a Python with
`lerobot[dataset]==0.6.1` (run with HF_HUB_OFFLINE=1).

Per round and tool: the work's own seconds (ours: `edit --json`'s `seconds`, which includes the
frame-by-frame verification LeRobot does not do; LeRobot: opening the dataset and the
conversion, imports excluded) and the process's wall and CPU seconds (user + sys of the child).
Prints the medians and the ratios ours / LeRobot. Outputs go under DIR (removed after).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

LEROBOT = """
import sys, time
from pathlib import Path
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.dataset_tools import convert_image_to_video_dataset
t0 = time.perf_counter()
ds = LeRobotDataset("local/source", root=sys.argv[1])
convert_image_to_video_dataset(ds, output_dir=Path(sys.argv[2]), repo_id="local/converted")
print("SECONDS", time.perf_counter() - t0)
"""


def run(argv: list[str], env: dict) -> tuple[str, float, float]:
    """(stdout, wall seconds, child CPU seconds) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit(f"{argv[0]} failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.stdout, wall, cpu


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--lerobot-python", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/bench_images_to_video")
    args = ap.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    times: dict[str, dict[str, list[float]]] = {
        t: {"work": [], "wall": [], "cpu": []} for t in ("ours", "lerobot")
    }
    for r in range(args.rounds):
        for tool in ("ours", "lerobot") if r % 2 == 0 else ("lerobot", "ours"):
            out = work / f"{tool}-{r}"
            if tool == "ours":
                argv = [sys.executable, "-m", "episodekit.cli", "edit", args.root, "--out",
                        str(out), "--images-to-video", "--json"]  # fmt: skip
                stdout, wall, cpu = run(argv, env)
                work_s = json.loads(stdout)["seconds"]
            else:
                argv = [args.lerobot_python, "-c", LEROBOT, args.root, str(out)]
                stdout, wall, cpu = run(argv, env)
                work_s = float(stdout.split("SECONDS")[-1])
            for k, v in (("work", work_s), ("wall", wall), ("cpu", cpu)):
                times[tool][k].append(v)
            print(f"round {r} {tool}: work {work_s:.1f} s, wall {wall:.1f} s, CPU {cpu:.1f} s")
            shutil.rmtree(out, ignore_errors=True)
    for k in ("work", "wall", "cpu"):
        a, b = statistics.median(times["ours"][k]), statistics.median(times["lerobot"][k])
        print(f"median {k}: ours {a:.1f} s, LeRobot {b:.1f} s, ours/LeRobot {a / b:.2f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
