"""Benchmark the smart cut: dropping 10 frames inside one episode of a large video dataset costs
the packet copy of the rest plus re-encoding the GOPs the cuts fall in, not a re-encode of files.

    .venv/bin/python scripts/bench_smart_cut.py [--dir DIR] [--size-mb 500] [--rounds 3]
                                                [--full-frames 20000]

The root is built once (cached under --dir, default $EPISODEKIT_BENCH/smart_cut, else
./bench-data/smart_cut): vid24 (LeRobot's recorder: AV1, GOP 2, two cameras; from
tests/fixtures/lerobot) with `video_files_size_in_mb` raised to 200, merged with itself until the
videos reach --size-mb (`episodekit merge`: packet copy). Then, alternating, --rounds times, in
this process (imports excluded), each into a fresh --out:

- copy: `edit --drop-episodes E` (every other packet copied: the baseline, what any edit costs);
- cut: `edit --drop-frames E:21-30` on the same episode (frames 21..30 of 120+; the rest resumes
  at frame 31, off a keyframe: one GOP re-encoded per camera). Its report splits the video stage
  (`video_cut.video_seconds`) into re-encoding (`reencode_seconds`: decoding, re-encoding and
  checking the GOPs) and the packet copy (the rest);
- full: decoding and re-encoding the mp4 (per camera) that holds episode E, with LeRobot's encoder
  settings (libsvtav1, crf 30, g 2, yuv420p): what a cut that re-encodes the file costs (LeRobot's
  editor re-encodes whole episodes' frames). With --full-frames N only its first N frames are
  re-encoded and the file's time is that rate times its frames (printed as such); 0: all.

Prints one JSON line per run and medians.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "lerobot" / "vid24"


def build_root(folder: Path, size_mb: float) -> Path:
    """vid24 merged with itself up to ``size_mb`` of video (cached)."""
    from episodekit.writers.merge import merge

    big = folder / f"vid24x{int(size_mb)}mb"
    if (big / "meta/info.json").exists():
        return big
    base = folder / "vid24-200mb"
    if not base.exists():
        shutil.copytree(FIXTURE, base)
        info = json.loads((base / "meta/info.json").read_text())
        info["video_files_size_in_mb"] = 200
        (base / "meta/info.json").write_text(json.dumps(info, indent=4))
    per = sum(p.stat().st_size for p in (base / "videos").rglob("*.mp4")) / 2**20
    copies = max(1, math.ceil(size_mb / per))
    print(f"building {big.name}: {copies} copies of vid24 ({per:.1f} MB of video each)")
    merge([str(base)] * copies, big)
    return big


def episode_file(root: Path, episode: int, key: str) -> Path:
    from episodekit.core.dataset import open_dataset

    ds = open_dataset(str(root))
    row = ds.episodes.slice(episode, 1).to_pylist()[0]
    rel = ds.video_path(key, row[f"videos/{key}/chunk_index"], row[f"videos/{key}/file_index"])
    return root / rel


def full_reencode(src: Path, out: Path, limit: int = 0) -> tuple[float, int, int]:
    """Decode the frames of ``src`` (its first ``limit``; 0: all) and encode them again
    (LeRobot's settings); seconds, frames re-encoded, frames in the file."""
    import av

    t0 = time.perf_counter()
    n = 0
    with av.open(str(src)) as inp, av.open(str(out), "w") as dst:
        s = inp.streams.video[0]
        total = int(s.frames or 0)
        o = dst.add_stream("libsvtav1", rate=s.average_rate, options={"crf": "30", "g": "2"})
        o.width, o.height, o.pix_fmt = s.width, s.height, "yuv420p"
        for frame in inp.decode(s):
            frame.pict_type = av.video.frame.PictureType.NONE
            dst.mux(o.encode(frame))
            n += 1
            if limit and n >= limit:
                break
        dst.mux(o.encode(None))
    return time.perf_counter() - t0, n, max(total, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Path(os.environ.get("EPISODEKIT_BENCH", "bench-data")) / "smart_cut"
    ap.add_argument("--dir", type=Path, default=default)
    ap.add_argument("--size-mb", type=float, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full-frames", type=int, default=0, help="frames of the full re-encode")
    args = ap.parse_args()
    from episodekit.core.dataset import open_dataset
    from episodekit.writers.edit import EditSpec, edit
    from episodekit.writers.frames import parse_frame_spec

    args.dir.mkdir(parents=True, exist_ok=True)
    root = build_root(args.dir, args.size_mb)
    ds = open_dataset(str(root))
    video_mb = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4")) / 2**20
    lengths = ds.column("length")
    episode = int(next(e for e in range(ds.num_episodes // 2, ds.num_episodes) if lengths[e] > 40))
    keys = ds.video_keys
    print(json.dumps({"root": str(root), "video_mb": round(video_mb, 1), "episodes":
                      ds.num_episodes, "frames": ds.num_frames, "episode": episode}))  # fmt: skip
    runs = ("copy", "cut", "packet_copy", "reencode", "full")
    times: dict[str, list[float]] = {k: [] for k in runs}
    out = args.dir / "out"
    for r in range(args.rounds):
        for what in ("copy", "cut", "full"):
            shutil.rmtree(out, ignore_errors=True)
            if what == "full":
                secs, done, frames = 0.0, 0, 0
                for key in keys:
                    src = episode_file(root, episode, key)
                    s, n, total = full_reencode(src, args.dir / "full.mp4", args.full_frames)
                    secs, done, frames = secs + s * total / n, done + n, frames + total
                times["full"].append(secs)
                print(json.dumps({"round": r, "run": "full", "seconds": round(secs, 2),
                                  "frames_reencoded": done, "frames_in_files": frames,
                                  "extrapolated": done < frames}))  # fmt: skip
                continue
            spec = (EditSpec(drop_episodes=(episode,)) if what == "copy"
                    else EditSpec(drop_frames=parse_frame_spec(f"{episode}:21-30")))  # fmt: skip
            t0 = time.perf_counter()
            res = edit(str(root), out, spec).as_dict()
            secs = time.perf_counter() - t0
            times[what].append(secs)
            line = {"round": r, "run": what, "seconds": round(secs, 2)}
            if what == "cut":
                cut = res["video_cut"]
                line["video_cut"], line["stats"] = cut, res["stats"]
                times["reencode"].append(cut["reencode_seconds"])
                times["packet_copy"].append(cut["video_seconds"] - cut["reencode_seconds"])
            print(json.dumps(line))
    shutil.rmtree(out, ignore_errors=True)
    (args.dir / "full.mp4").unlink(missing_ok=True)
    med = {k: statistics.median(v) for k, v in times.items() if v}
    print(
        f"median seconds on {video_mb:.0f} MB of video: copy edit {med['copy']:.2f}; cut edit "
        f"{med['cut']:.2f}, of which video {med['packet_copy'] + med['reencode']:.2f} = packet "
        f"copy {med['packet_copy']:.2f} + GOP re-encoding {med['reencode']:.3f}; cut / copy "
        f"{med['cut'] / med['copy']:.2f}x; re-encoding the episode's files instead: "
        f"{med['full']:.1f} ({med['full'] / max(med['reencode'], 1e-9):.0f}x the GOPs, "
        f"{med['full'] / med['cut']:.1f}x the whole cut)"
    )


if __name__ == "__main__":
    sys.exit(main())
