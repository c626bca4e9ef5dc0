"""`episodekit convert` next to LeRobot's own v2.1 -> v3.0 converter, in one run: wall time, peak
RSS, and whether LeRobot's `LeRobotDataset` reads both outputs with equal samples.

    .venv/bin/python scripts/bench_data.py v21-2m v21-vid          # the v2.1 roots (fixed seeds)
    .venv/bin/python scripts/bench_convert.py --lerobot-python lr61/bin/python [--root v21-2m]

LeRobot (0.6.1, in its own venv: see tests/fixtures/lerobot/README.md) converts in place, so it
gets a fresh copy of the root (the copy is not timed); it runs as
`convert_dataset(repo_id, root=COPY, push_to_hub=False, force_conversion=True)`, i.e. its
`lerobot.scripts.convert_dataset_v21_to_v30`. Ours: `episodekit convert ROOT --out DIR`. Both run
under /usr/bin/time -v (peak RSS of the process). Then a child in LeRobot's venv opens both outputs
with `LeRobotDataset(..., delta_timestamps=...)` and compares `--samples` random indices plus every
episode's first and last frame, key by key (tensors equal, padding flags equal, task strings equal).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

EK = [sys.executable, "-m", "episodekit.cli"]

LEROBOT_CONVERT = """
import sys
from lerobot.scripts.convert_dataset_v21_to_v30 import convert_dataset
convert_dataset("bench/" + sys.argv[1].rsplit("/", 1)[-1], root=sys.argv[1], push_to_hub=False,
                force_conversion=True)
"""

# Run in LeRobot's venv: open both outputs with LeRobotDataset and compare samples.
LEROBOT_COMPARE = """
import json, sys
import numpy as np, torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
a_root, b_root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
info = json.load(open(a_root + "/meta/info.json"))
fps = info["fps"]
delta = {"action": [i / fps for i in range(10)], "observation.state": [-2 / fps, -1 / fps, 0.0]}
for k, f in info["features"].items():
    if f["dtype"] == "video":
        delta[k] = [-1 / fps, 0.0]
kw = dict(delta_timestamps=delta, video_backend="pyav")
a = LeRobotDataset("bench/a", root=a_root, **kw)
b = LeRobotDataset("bench/b", root=b_root, **kw)
assert len(a) == len(b), (len(a), len(b))
rng = np.random.default_rng(0)
eps = a.meta.episodes
edges = sorted({int(x) for e in range(a.meta.total_episodes)
                for x in (eps[e]["dataset_from_index"], eps[e]["dataset_to_index"] - 1)})
idx = sorted(set(rng.integers(0, len(a), n).tolist()) | set(edges))
bad = []
for i in idx:
    x, y = a[i], b[i]
    if set(x) != set(y):
        bad.append((i, "keys", sorted(set(x) ^ set(y))))
        continue
    for k in x:
        u, v = x[k], y[k]
        same = torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v
        if not same:
            bad.append((i, k))
print(json.dumps({"samples": len(idx), "equal": len(idx) - len({b_[0] for b_ in bad}),
                  "first_differences": bad[:5], "frames": len(a)}))
"""


def timed(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd`` under /usr/bin/time -v: wall seconds and peak RSS (MiB); raise on failure."""
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    h, m, s = (float(g) if g else 0.0 for g in wall.groups())
    return {"seconds": round(h * 3600 + m * 60 + s, 2), "peak_rss_mib": int(rss.group(1)) // 1024}


def frames_of(root: Path) -> int:
    return int(json.loads((root / "meta/info.json").read_text())["total_frames"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("EPISODEKIT_BENCH", "bench-data"))
    ap.add_argument("--root", action="append", help="bench root name(s) (default: v21-2m, v21-vid)")
    ap.add_argument("--lerobot-python", default=os.environ.get("LEROBOT_PYTHON"), required=False)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    args = ap.parse_args()
    if not args.lerobot_python:
        sys.exit("give --lerobot-python (LeRobot 0.6.1's venv python) or set LEROBOT_PYTHON")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-convert-"))
    for name in args.root or ["v21-2m", "v21-vid"]:
        src = Path(args.dir) / name
        if not src.is_dir():
            sys.exit(f"{src}: missing (make it with scripts/bench_data.py {name})")
        lr_root, ours = work / f"{name}-lerobot", work / f"{name}-episodekit"
        for p in (lr_root, ours, work / f"{name}-lerobot_old"):
            shutil.rmtree(p, ignore_errors=True)
        shutil.copytree(src, lr_root)
        lr = timed([args.lerobot_python, "-c", LEROBOT_CONVERT, str(lr_root)], env)
        ek = timed([*EK, "convert", str(src), "--out", str(ours)], env)
        compare = [args.lerobot_python, "-c", LEROBOT_COMPARE, str(lr_root), str(ours)]
        cmp = subprocess.run([*compare, str(args.samples)], capture_output=True, text=True, env=env)
        same = json.loads(cmp.stdout.strip().splitlines()[-1]) if cmp.returncode == 0 else None
        print(json.dumps({
            "root": name, "frames": frames_of(src), "lerobot_0.6.1": lr, "episodekit": ek,
            "speed_x": round(lr["seconds"] / max(ek["seconds"], 1e-9), 2),
            "rss_ratio": round(ek["peak_rss_mib"] / max(lr["peak_rss_mib"], 1), 3),
            "lerobot_reads_ours": same or cmp.stderr[-2000:],
        }, indent=1), flush=True)  # fmt: skip
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
