"""Benchmark ``prep videos`` (issue 15's bar: a GOP-250 source re-encoded to GOP <= 4 decodes
random frames >= 3x faster, frame count exact, PSNR reported).

Writes a sample whose camera is h264 with GOP 250 (episodes start on keyframes, as LeRobot's
recorder writes them), copies it, runs ``rewrite_videos`` (default: AV1, GOP 2, CRF 30,
faststart) on the copy, then times random single-frame access (each frame sought, RGB
conversion included, one decoder thread) on every file before and after, in the same run.

    .venv/bin/python scripts/bench_video_prep.py [--episodes 8] [--size 480x640] [--gop 2]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from episodekit.core.video import probe, random_access_seconds
from episodekit.prep.videos import format_result, rewrite_videos
from episodekit.sample import write_sample


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--mean-length", type=float, default=300)
    p.add_argument("--size", default="480x640")
    p.add_argument("--gop", type=int, default=2)
    p.add_argument("--codec", default="av1")
    p.add_argument("--frames", type=int, default=48, help="random frames timed per file")
    p.add_argument("--dir", default="/tmp/bench_video_prep")
    a = p.parse_args()
    h, w = (int(x) for x in a.size.split("x"))
    base = Path(a.dir)
    src = base / f"src_h264_gop250_{h}x{w}_{a.episodes}"
    if not (src / "meta/info.json").exists():
        write_sample(
            src,
            episodes=a.episodes,
            mean_length=a.mean_length,
            videos=1,
            video_size=(h, w),
            video_codec="h264",
            gop=250,
            seed=5,
        )
    dst = base / "prepared"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    files = sorted(p.relative_to(dst) for p in dst.glob("videos/*/*/*.mp4"))
    before = {f: probe(dst / f) for f in files}
    t0 = time.perf_counter()
    result = rewrite_videos(str(dst), codec=a.codec, gop=a.gop, timing_frames=0)
    elapsed = time.perf_counter() - t0
    print(format_result(result))
    assert not result.failed
    for f in files:
        after = probe(dst / f)
        assert (after.pts == before[f].pts).all() and after.num_frames == before[f].num_frames
        slow = random_access_seconds(src / f, a.frames)
        fast = random_access_seconds(dst / f, a.frames)
        gop_before = before[f].num_frames / max(1, before[f].keyframe.sum())
        gop_after = after.num_frames / max(1, after.keyframe.sum())
        size_b, size_a = (src / f).stat().st_size, (dst / f).stat().st_size
        psnr = next(x.psnr_db for x in result.files if x.file == f.as_posix())
        print(
            f"{f}: {after.num_frames} frames (exact, same pts), mean GOP {gop_before:.0f} -> "
            f"{gop_after:.1f}, PSNR {psnr:.1f} dB, {size_b / 1e6:.2f} -> {size_a / 1e6:.2f} MB; "
            f"random access {1 / slow:.1f} -> {1 / fast:.1f} frames/s = {slow / fast:.1f}x "
            f"(bar >= 3x); re-encode took {elapsed:.1f}s"
        )


if __name__ == "__main__":
    main()
