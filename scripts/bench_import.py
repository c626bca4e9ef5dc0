"""`episodekit import` of an RLDS dataset against what users run today, in one run: TFDS reading +
LeRobot 0.6.1's `LeRobotDataset.create` / `add_frame` / `save_episode` / `finalize` (the
openx2lerobot / lerobot `examples/port_datasets` way, `scripts/lerobot_import_rlds.py`, run by
LeRobot's own python with tensorflow-datasets installed next to it), and against the encode-only
floor: PyAV encoding the same decoded frames with the same settings (AV1 libsvtav1, g 2, crf 30,
yuv420p, preset 12: LeRobot's), one process per camera, both at once.

    make the data (once, in a venv with tensorflow-cpu + tensorflow-datasets):
        TFDS_PY/bin/python tests/fixtures/import/rlds/make_rlds_fixture.py \
            --episodes 1000 --steps 20 --size 64 --shards 8 --out DIR --no-expected
    measure (LR61: a venv with lerobot[dataset]==0.6.1, tensorflow-cpu, tensorflow-datasets):
        .venv/bin/python scripts/bench_import.py DIR/ek_rlds_fixture/1.0.0 \
            --lerobot-python LR61/bin/python [--fps 10] [--jobs 1] [--skip-lerobot]

Each tool runs once, under `scripts/peak_rss.py`'s poller: wall seconds of the process, the CPU
seconds of its process tree (user + system, every process it waited for) and the largest sum of
RSS over the tree (LeRobot's image-writer threads and encoder, our camera and `--jobs`
processes). `--base-python MAIN_PY` runs the same import with another install too (a
before/after in one run); `--our-encoder` times the import's own encoder settings (low-delay
prediction, a keyframe per episode) on the same frames beside the floor. The encode floor's
frames are decoded first (not timed) into one raw file per camera; its time is that of the two
encoder processes reading those files. Prints one table (tool, wall s, CPU s, peak RSS MiB,
ratios vs ours), the ratios to the floors and a JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peak_rss import measure  # noqa: E402

HERE = Path(__file__).resolve().parent
LEROBOT_SIDE = HERE / "lerobot_import_rlds.py"
# LeRobot 0.6.1's encoder: RGBEncoderConfig() and its get_codec_options() (configs/video.py)
CODEC, PIX_FMT = "libsvtav1", "yuv420p"
OPTIONS = {"g": "2", "crf": "30", "preset": "12", "svtav1-params": "fast-decode=0"}


def timed(cmd: list[str]) -> dict:
    """:func:`peak_rss.measure` of ``cmd`` plus ``cpu_s``: the user + system seconds of its
    whole process tree (every process it waited for), a figure other load changes less than
    the wall time."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = measure(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {**out, "cpu_s": round(cpu, 1)}


def ratio(a: float, b: float) -> float:
    """``a / b`` rounded to 3 places (0 when ``b`` is 0)."""
    return round(a / b, 3) if b else 0.0


def table(rows: list[dict], ours: dict) -> str:
    """The result table: tool, wall s, peak RSS MiB, and each ratio vs ours (theirs / ours for
    time, ours / theirs for memory)."""
    lines = [
        "| tool | wall s | CPU s (tree) | peak RSS MiB (tree) | its time / ours "
        "| ours' RSS / its |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tool']} | {r['seconds']:.1f} | {r['cpu_s']:.1f} | {r['tree_mib']:.0f} | "
            f"{ratio(r['seconds'], ours['seconds']):.2f}x | "
            f"{ratio(ours['tree_mib'], r['tree_mib']):.3f} |"
        )
    return "\n".join(lines)


def decode_frames(src: str, work: Path) -> dict[str, tuple[Path, int, tuple]]:
    """Every frame of every camera as the import decodes it (``Images.frames()``), written raw
    to ``work/<camera>.rgb``: camera -> (file, frames, frame shape). Not timed."""
    from episodekit.importers.rlds import RldsReader

    reader = RldsReader(src)
    files: dict[str, Any] = {}
    counts: dict[str, int] = {}
    shapes: dict[str, tuple] = {}
    lengths: dict[str, list[int]] = {}
    for ref in reader.episodes():
        for cam, images in reader.read(ref).images.items():
            if cam not in files:
                files[cam] = open(work / f"{cam.replace('/', '_')}.rgb", "wb")  # noqa: SIM115
            n = 0
            for arr in images.frames():
                shapes[cam] = arr.shape
                files[cam].write(np.ascontiguousarray(arr, dtype=np.uint8).tobytes())
                n += 1
            counts[cam] = counts.get(cam, 0) + n
            lengths.setdefault(cam, []).append(n)
    for cam, f in files.items():
        f.close()
        np.save(Path(f.name).with_suffix(".lengths.npy"), np.array(lengths[cam], np.int64))
    return {cam: (Path(f.name), counts[cam], shapes[cam]) for cam, f in files.items()}


def encode_raw(raw: str, out: str, h: int, w: int, fps: int) -> None:
    """Encode a raw RGB file into one mp4 with LeRobot's settings (:data:`OPTIONS`): a child."""
    import av

    size = h * w * 3
    # as LeRobot's encode_video_frames: options given to add_stream, no pts set
    with open(raw, "rb") as f, av.open(out, "w") as container:
        stream = container.add_stream(CODEC, fps, options=dict(OPTIONS))
        stream.pix_fmt, stream.width, stream.height = PIX_FMT, w, h
        frames = packets = 0
        while chunk := f.read(size * 256):  # 256 frames at a time: the floor's memory is its own
            for img in np.frombuffer(chunk, np.uint8).reshape(-1, h, w, 3):
                frames += 1
                for packet in stream.encode(av.VideoFrame.from_ndarray(img, "rgb24")):
                    container.mux(packet)
                    packets += 1
        for packet in stream.encode():
            container.mux(packet)
            packets += 1
    if packets != frames:  # one packet a frame, or the floor did not encode what ours did
        sys.exit(f"{out}: {packets} packets for {frames} frames")


def encode_raw_ours(raw: str, out: str, h: int, w: int, fps: int) -> None:
    """Encode a raw RGB file as the import's camera process encodes it (``VideoWriter`` with
    LeRobot's settings and low-delay prediction, each episode starting on a keyframe; the
    episodes' lengths from ``RAW.lengths.npy``): the encoder's own share of the import."""
    from episodekit.core.video_writer import LEROBOT_RGB, VideoWriter

    size = h * w * 3
    lengths = np.load(Path(raw).with_suffix(".lengths.npy"))
    writer = VideoWriter(out, w, h, fps, LEROBOT_RGB, preset=LEROBOT_RGB.preset)
    with open(raw, "rb") as f:
        for n in lengths.tolist():
            frames = np.frombuffer(f.read(size * n), np.uint8).reshape(n, h, w, 3)
            writer.write(frames, keyframe_first=True)
    writer.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src", help="a TFDS dataset folder (…/NAME/VERSION)")
    ap.add_argument("--lerobot-python", default=os.environ.get("LEROBOT_PYTHON"))
    ap.add_argument("--fps", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=1, help="episodekit import --jobs")
    ap.add_argument("--skip-lerobot", action="store_true", help="ours and the encode floor only")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    ap.add_argument(
        "--base-python",
        help="also run the import with this python (another install: a before/after)",
    )
    ap.add_argument(
        "--our-encoder",
        action="store_true",
        help="also time the import's own encoder settings on the same frames "
        "(low-delay prediction, a keyframe per episode), one process per camera",
    )
    ap.add_argument(
        "--encode-child", nargs=5, metavar=("RAW", "OUT", "H", "W", "FPS"), help=argparse.SUPPRESS
    )
    ap.add_argument("--encode-ours-child", nargs=5, metavar=("RAW", "OUT", "H", "W", "FPS"),
                    help=argparse.SUPPRESS)  # fmt: skip
    args = ap.parse_args()
    if args.encode_child or args.encode_ours_child:
        raw, out, h, w, fps = args.encode_child or args.encode_ours_child
        encode = encode_raw if args.encode_child else encode_raw_ours
        encode(raw, out, int(h), int(w), int(fps))
        # the file is closed and checked; skip the interpreter's teardown, where SVT-AV1 4.1
        # (PyAV 18.1) was seen to hang now and then (a futex wait after the last packet)
        os._exit(0)
    if not args.skip_lerobot and not args.lerobot_python:
        sys.exit("give --lerobot-python (LeRobot 0.6.1's venv python) or --skip-lerobot")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-import-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.update(HF_HUB_OFFLINE="1", TQDM_DISABLE="1", TF_CPP_MIN_LOG_LEVEL="3", SVT_LOG="1")
    rows = []

    out = work / "episodekit"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "episodekit.cli", "import", args.src, "--out", str(out),
           "--fps", str(args.fps), "--jobs", str(args.jobs), "--json"]  # fmt: skip
    ours = {"tool": f"episodekit import --jobs {args.jobs}", **timed(cmd)}
    rows.append(ours)
    info = json.loads((out / "meta/info.json").read_text())
    base = None
    if args.base_python:  # the same import by another install (a before/after in one run)
        out = work / "episodekit-base"
        shutil.rmtree(out, ignore_errors=True)
        cmd[0], cmd[6] = args.base_python, str(out)
        base = {"tool": f"base: episodekit import --jobs {args.jobs}", **timed(cmd)}
        rows.append(base)
    frames, episodes = info["total_frames"], info["total_episodes"]

    if not args.skip_lerobot:
        out = work / "lerobot"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [args.lerobot_python, str(LEROBOT_SIDE), args.src, str(out), "--fps", str(args.fps)]
        lr = {"tool": "TFDS + LeRobot 0.6.1 add_frame/save_episode", **timed(cmd)}
        lr_info = json.loads((out / "meta/info.json").read_text())
        lr["frames"], lr["episodes"] = lr_info["total_frames"], lr_info["total_episodes"]
        rows.append(lr)

    raws = decode_frames(args.src, work)
    kinds = [("--encode-child", "encode only (PyAV, {} processes)")]
    if args.our_encoder:
        kinds.append(("--encode-ours-child", "encode only, ours' settings ({} processes)"))
    for flag, label in kinds:
        t0 = time.perf_counter()
        procs = [
            [sys.executable, __file__, args.src, flag, str(raw),
             str(work / f"{raw.stem}{flag}.mp4"), str(shape[0]), str(shape[1]), str(args.fps)]
            for raw, _, shape in raws.values()
        ]  # fmt: skip
        # both cameras at once (one process each), under one poller: a shell runs them
        shell = " & ".join(subprocess.list2cmdline(p) for p in procs) + " & wait"
        enc = {"tool": label.format(len(procs)), **timed(["sh", "-c", shell])}
        enc["wall_check"] = round(time.perf_counter() - t0, 1)
        rows.append(enc)

    print(f"{episodes} episodes, {frames} frames, cameras {sorted(raws)}; load: "
          f"{os.getloadavg()}")  # fmt: skip
    print(table(rows, ours))
    for r in rows[1:]:
        if r["tool"].startswith("TFDS"):
            r["speed_x"] = ratio(r["seconds"], ours["seconds"])
            r["rss_ratio"] = ratio(ours["tree_mib"], r["tree_mib"])
            print(f"vs LeRobot: {r['speed_x']}x faster (bar >= 5x), {r['rss_ratio']}x the peak "
                  "RSS (bar <= 0.25x)")  # fmt: skip
        elif r["tool"].startswith("encode"):
            r["ours_over_floor"] = ratio(ours["seconds"], r["seconds"])
            r["cpu_over_floor"] = ratio(ours["cpu_s"], r["cpu_s"])
            print(f"vs {r['tool']}: ours takes {r['ours_over_floor']}x its time (goal <= 1.3x), "
                  f"{r['cpu_over_floor']}x its CPU")  # fmt: skip
            if base is not None:
                r["base_over_floor"] = ratio(base["seconds"], r["seconds"])
                r["base_cpu_over_floor"] = ratio(base["cpu_s"], r["cpu_s"])
                print(f"    the base ({args.base_python}): {r['base_over_floor']}x its time, "
                      f"{r['base_cpu_over_floor']}x its CPU")  # fmt: skip
    print(json.dumps({"episodes": episodes, "frames": frames, "rows": rows}))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
