"""Benchmark dataset surgery (`episodekit edit`): data-only speed vs plain pyarrow, and the video
edit side by side with LeRobot's own `delete_episodes`, plus LeRobot reading our output.

    .venv/bin/python scripts/bench_surgery.py [--dir DIR] [--rounds 3] [--lerobot PYTHON]

1. Data only, on a >= 2M-frame root (`episodekit sample DIR/data2m --episodes 5700 --style edited
   --seed 7`, made on the first run): `edit --drop-episodes` of 3 episodes (staged, streamed,
   verified by reading the output back, stats, atomic publish) vs a baseline of pyarrow
   read_table + filter + write_table of the same files (default settings, no verification), in
   one process each, alternating rounds. The ratio baseline / ours is what counts (bar >= 0.8).
2. Video, on vid24 (written by LeRobot's recorder, tests/fixtures/lerobot) or --video-root:
   dropping 3 episodes with `episodekit edit` (packet copy) vs LeRobot's `delete_episodes`
   (decode + re-encode), each as a fresh process (wall seconds, imports included), and each call
   alone (after the imports: `edit()` in this process, `delete_episodes` timed inside LeRobot's
   process). Needs a LeRobot venv (--lerobot,
   default $LEROBOT_PYTHON; skipped without one). Then LeRobot's `LeRobotDataset` loads our
   output and every kept sample checked is compared with the source's (pixel-equal frames).
Everything is written under --dir (default: $EPISODEKIT_BENCH/surgery, else ./bench-data/surgery).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from episodekit.core.dataset import open_dataset
from episodekit.writers.edit import EditSpec, edit

REPO = Path(__file__).resolve().parents[1]
EK = [sys.executable, "-m", "episodekit.cli"]
DATA_DROP = (10, 2500, 5690)
VIDEO_DROP = (3, 7, 12)

LEROBOT_DELETE = r"""
import sys, time, shutil
from pathlib import Path
t0 = time.perf_counter()
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.dataset_tools import delete_episodes
t1 = time.perf_counter()
src, dst, drop = sys.argv[1], Path(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")]
ds = LeRobotDataset("bench/src", root=src)
out = delete_episodes(ds, episode_indices=drop, output_dir=dst, repo_id="bench/edited")
print(f"{time.perf_counter() - t1:.3f} {out.meta.total_episodes} {out.meta.total_frames}")
"""

LEROBOT_PARITY = r"""
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
src, out, drop = sys.argv[1], sys.argv[2], {int(x) for x in sys.argv[3].split(",")}
a = LeRobotDataset("bench/src", root=src, video_backend="pyav")
b = LeRobotDataset("bench/out", root=out, video_backend="pyav")
ep = a.meta.episodes
kept = [e for e in range(a.meta.total_episodes) if e not in drop]
frm, to = ep["dataset_from_index"], ep["dataset_to_index"]
rows = np.concatenate([np.arange(frm[e], to[e]) for e in kept])
rng = np.random.default_rng(0)
idx = sorted(set(rng.integers(0, len(b), 60).tolist()) | {0, len(b) - 1})
worst, checked, keys = 0.0, 0, set()
for i in idx:
    sa, sb = a[int(rows[i])], b[i]
    for k, v in sa.items():
        if k in ("index", "episode_index", "task_index"):
            continue
        if hasattr(v, "numpy"):
            x, y = v.numpy().astype(np.float64), sb[k].numpy().astype(np.float64)
            worst = max(worst, float(np.max(np.abs(x - y))) if x.size else 0.0)
        elif v != sb[k]:
            worst = float("inf")
        keys.add(k)
    checked += 1
print(json.dumps({"samples": checked, "max_abs_diff": worst, "keys": sorted(keys), "len": len(b)}))
"""


def baseline(src: Path, dst: Path, drop: tuple[int, ...]) -> float:
    """pyarrow read_table + filter + write_table of every data file (no verification)."""
    t0 = time.perf_counter()
    ds = open_dataset(str(src))
    for rel in ds.data_files:
        t = pq.read_table(src / rel)
        keep = pc.invert(pc.is_in(t["episode_index"], pa.array(drop, pa.int64())))
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t.filter(keep), dst / rel)
    return time.perf_counter() - t0


def ours(src: Path, dst: Path, drop: tuple[int, ...]) -> float:
    t0 = time.perf_counter()
    result = edit(str(src), dst, EditSpec(drop_episodes=drop))
    assert result.write.status == "written"
    return time.perf_counter() - t0


def bench_data(folder: Path, rounds: int) -> dict:
    root = folder / "data2m"
    if not root.exists():
        cmd = ["sample", str(root), "--episodes", "5700", "--style", "edited", "--seed", "7"]
        print("$ episodekit " + " ".join(cmd), flush=True)
        subprocess.run([*EK, *cmd], check=True)
    ds = open_dataset(str(root))
    times: dict[str, list[float]] = {"episodekit edit": [], "pyarrow read+write": []}
    for r in range(rounds):
        for name, fn in (("episodekit edit", ours), ("pyarrow read+write", baseline)):
            dst = folder / f"out-{name.split()[0]}"
            shutil.rmtree(dst, ignore_errors=True)
            times[name].append(fn(root, dst, DATA_DROP))
            print(f"round {r + 1}: {name} {times[name][-1]:.2f}s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "frames": ds.num_frames,
        "episodes": ds.num_episodes,
        "data_files": len(ds.data_files),
        "median_seconds": med,
        "ratio_baseline_over_ours": med["pyarrow read+write"] / med["episodekit edit"],
    }
    print(json.dumps(out, indent=2), flush=True)
    return out


def _timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{cmd[:3]} failed:\n{r.stderr[-3000:]}")
    return time.perf_counter() - t0, r.stdout


def bench_video(folder: Path, video_root: Path, lerobot: str | None, rounds: int) -> dict:
    src = folder / video_root.name
    if not src.exists():
        shutil.copytree(video_root, src)
    drop = ",".join(map(str, VIDEO_DROP))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_LEROBOT_HOME": str(folder / "hf")}
    res: dict[str, list[float]] = {"episodekit edit (process)": [], "lerobot delete_episodes": []}
    lr_inner: list[float] = []
    ek_inner: list[float] = []
    for r in range(rounds):
        call_out = folder / "vid-ek-call"
        shutil.rmtree(call_out, ignore_errors=True)
        ek_inner.append(ours(src, call_out, VIDEO_DROP))
        ek_out = folder / "vid-ek"
        shutil.rmtree(ek_out, ignore_errors=True)
        t, _ = _timed([*EK, "edit", str(src), "--out", str(ek_out), "--drop-episodes", drop])
        res["episodekit edit (process)"].append(t)
        if lerobot:
            lr_out = folder / "vid-lr"
            shutil.rmtree(lr_out, ignore_errors=True)
            t, text = _timed([lerobot, "-c", LEROBOT_DELETE, str(src), str(lr_out), drop], env)
            res["lerobot delete_episodes"].append(t)
            lr_inner.append(float(text.split()[0]))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in res.items() if v))
    med = {k: statistics.median(v) for k, v in res.items() if v}
    out: dict = {"root": str(video_root), "dropped": list(VIDEO_DROP), "median_seconds": med}
    out["episodekit_edit_call_seconds"] = statistics.median(ek_inner)
    if lerobot:
        out["lerobot_delete_call_seconds"] = statistics.median(lr_inner)
        out["speedup_process"] = med["lerobot delete_episodes"] / med["episodekit edit (process)"]
        out["speedup_call"] = (
            out["lerobot_delete_call_seconds"] / out["episodekit_edit_call_seconds"]
        )
        _, text = _timed(
            [lerobot, "-c", LEROBOT_PARITY, str(src), str(folder / "vid-ek"), drop], env
        )
        out["lerobot_reads_our_output"] = json.loads(text.strip().splitlines()[-1])
    print(json.dumps(out, indent=2), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    base = Path(os.environ.get("EPISODEKIT_BENCH", "bench-data"))
    ap.add_argument("--dir", default=str(base / "surgery"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lerobot", default=os.environ.get("LEROBOT_PYTHON"))
    ap.add_argument("--video-root", default=str(REPO / "tests/fixtures/lerobot/vid24"))
    ap.add_argument("--only", choices=["data", "video"], default=None)
    args = ap.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "data"):
        bench_data(folder, args.rounds)
    if args.only in (None, "video"):
        bench_video(folder, Path(args.video_root), args.lerobot, args.rounds)


if __name__ == "__main__":
    main()
