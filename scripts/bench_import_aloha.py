"""`episodekit import` of an ALOHA HDF5 folder against openpi's converter, in one run: openpi's
``examples/aloha_real/convert_aloha_data_to_lerobot.py`` itself (h5py + LeRobot's
``LeRobotDataset.create`` / ``add_frame`` / ``save_episode``: what openpi's users run), under
LeRobot 0.6.1 through ``scripts/openpi/lerobot_compat.py`` (module aliases only: see
``scripts/openpi/README.md``), run by LeRobot's own python.

    make the data (our venv; openpi's script needs its four cameras):
        .venv/bin/python scripts/make_aloha_source.py SRC --episodes 50 --steps 100 \
            --size 480x640 --cameras cam_high,cam_low,cam_left_wrist,cam_right_wrist --jpeg 50
    measure (LR61: a venv with lerobot[dataset]==0.6.1, h5py, tyro, opencv-python):
        .venv/bin/python scripts/bench_import_aloha.py SRC --lerobot-python LR61/bin/python \
            [--jobs 1] [--mode video|image]

Both write AV1 videos at 50 fps with ``--mode video`` (the default here; openpi's own default is
``image``: PNGs embedded in the parquet files). Each tool runs once under ``scripts/peak_rss.py``'s
poller (wall seconds, the largest sum of RSS over the process tree: LeRobot's image-writer
processes and encoders, our ``--jobs`` processes). Prints one table, the ratios against the
issue's bars (>= 5x faster, <= 0.25x peak RSS) and a JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_import import ratio, table  # noqa: E402
from peak_rss import measure  # noqa: E402

OPENPI = Path(__file__).resolve().parent / "openpi" / "lerobot_compat.py"
REPO_ID = "local/aloha"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src", help="a folder of ALOHA episode_N.hdf5 files")
    ap.add_argument("--lerobot-python", default=os.environ.get("LEROBOT_PYTHON"), required=False)
    ap.add_argument("--jobs", type=int, default=1, help="episodekit import --jobs")
    ap.add_argument("--mode", choices=("video", "image"), default="video", help="openpi's --mode")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    args = ap.parse_args()
    if not args.lerobot_python:
        sys.exit("give --lerobot-python (LeRobot 0.6.1's venv python)")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-aloha-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.update(HF_HUB_OFFLINE="1", TQDM_DISABLE="1", SVT_LOG="1")
    load = [os.getloadavg()]

    out = work / "episodekit"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "episodekit.cli", "import", args.src, "--out", str(out),
           "--fps", "50", "--jobs", str(args.jobs), "--json"]  # fmt: skip
    ours = {"tool": f"episodekit import --jobs {args.jobs}", **measure(cmd)}
    info = json.loads((out / "meta/info.json").read_text())
    ours["frames"], ours["episodes"] = info["total_frames"], info["total_episodes"]
    load.append(os.getloadavg())

    home = work / "lerobot_home"
    shutil.rmtree(home, ignore_errors=True)
    os.environ["HF_LEROBOT_HOME"] = str(home)
    cmd = [args.lerobot_python, str(OPENPI), "--raw-dir", args.src, "--repo-id", REPO_ID,
           "--no-push-to-hub", "--mode", args.mode]  # fmt: skip
    theirs = {"tool": f"openpi convert_aloha (LeRobot 0.6.1, --mode {args.mode})", **measure(cmd)}
    lr_info = json.loads((home / REPO_ID / "meta/info.json").read_text())
    theirs["frames"], theirs["episodes"] = lr_info["total_frames"], lr_info["total_episodes"]
    load.append(os.getloadavg())
    for r in (ours, theirs):
        if r["exit"] != 0:
            sys.exit(f"{r['tool']} exited {r['exit']}")
    if (theirs["frames"], theirs["episodes"]) != (ours["frames"], ours["episodes"]):
        sys.exit(f"outputs differ in size: ours {ours['frames']} frames, theirs {theirs['frames']}")

    cams = [k for k, f in info["features"].items() if f["dtype"] == "video"]
    shape = info["features"][cams[0]]["shape"] if cams else None
    print(f"{ours['episodes']} episodes, {ours['frames']} frames, {len(cams)} cameras {shape}; "
          f"load (1, 5, 15 min) before / after ours / after openpi: {load}")  # fmt: skip
    print(table([ours, theirs], ours))
    theirs["speed_x"] = ratio(theirs["seconds"], ours["seconds"])
    theirs["rss_ratio"] = ratio(ours["tree_mib"], theirs["tree_mib"])
    print(f"vs openpi's converter: {theirs['speed_x']}x faster (bar >= 5x), "
          f"{theirs['rss_ratio']}x its peak RSS (bar <= 0.25x)")  # fmt: skip
    print(json.dumps({"load": load, "rows": [ours, theirs]}))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
