"""How close LeRobot's default video encoding (AV1 CRF 30, yuv420p: what `edit --images-to-video`
writes) comes to the images it encodes: the worst frame's PSNR against the encoder's input (the
codec's loss, what `edit` verifies) and against the RGB image (what LeRobot's loader returns
against the source: 4:2:0 chroma included), plus the 4:2:0 round trip alone.

Usage: python scripts/probe_image_video_psnr.py [--photo FILE] [--frames 30] [--crf 30 ...]
Contents: synthetic gradients (plain, Gaussian noise sigma 8 and 30) at 96x128 and 640x480, and
with --photo a photo panned over the frames (any JPEG/PNG at least ~900x700 px), at both sizes.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from episodekit.core.video import require_av
from episodekit.core.video_writer import VideoWriter
from episodekit.writers.image_video import LEROBOT_RGB, psnr_db

SIZES = ((96, 128), (480, 640))


def gradients(n: int, h: int, w: int, sigma: float, rng: np.random.Generator) -> list:
    yy, xx = np.mgrid[0:h, 0:w]
    out = []
    for i in range(n):
        img = np.zeros((h, w, 3))
        img[..., 0] = 128 + 100 * np.sin(xx / 17 + i / 5)
        img[..., 1] = 128 + 100 * np.cos(yy / 13 - i / 7)
        img[..., 2] = (xx + yy + 3 * i) % 255
        img += rng.normal(0, sigma, img.shape) if sigma else 0
        out.append(np.clip(img, 0, 255).astype(np.uint8))
    return out


def panned(photo: str, n: int, h: int, w: int) -> list:
    from PIL import Image

    big = (int(w * 1.4), int(h * 1.9))  # room to pan
    img = np.asarray(Image.open(photo).convert("RGB").resize(big))
    hh, ww = img.shape[:2]
    return [
        np.ascontiguousarray(img[(2 * i) % (hh - h) :][:h, (3 * i) % (ww - w) :][:, :w])
        for i in range(n)
    ]


def measure(frames: list, crf: int, path: str = "/tmp/probe_image_video.mp4") -> tuple:
    """(worst codec PSNR, worst RGB PSNR, worst 4:2:0 round trip alone) over ``frames``."""
    av = require_av()
    h, w = frames[0].shape[:2]
    with VideoWriter(path, w, h, 30, replace(LEROBOT_RGB, crf=crf)) as vw:
        for j, f in enumerate(frames):
            vw.write(f[None], keyframe_first=j == 0)
    codec, rgb, trip = [], [], []
    with av.open(path) as c:
        for fr, src in zip(c.decode(video=0), frames):
            given = av.VideoFrame.from_ndarray(src, format="rgb24").reformat(format="yuv420p")
            codec.append(psnr_db(fr.to_ndarray(), given.to_ndarray()))
            rgb.append(psnr_db(fr.to_ndarray(format="rgb24"), src))
            trip.append(psnr_db(given.to_ndarray(format="rgb24"), src))
    return min(codec), min(rgb), min(trip)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--photo", help="a photo to pan over (JPEG/PNG)")
    ap.add_argument("--frames", type=int, default=30)
    ap.add_argument("--crf", type=int, nargs="+", default=[30])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| content | size | CRF | worst codec dB | worst RGB dB | 4:2:0 alone dB |")
    print("|---|---|---|---|---|---|")
    for h, w in SIZES:
        cases = [(f"gradients sigma {s}", gradients(args.frames, h, w, s, rng)) for s in (0, 8, 30)]
        if args.photo:
            cases.append(("photo panned", panned(args.photo, args.frames, h, w)))
        for name, frames in cases:
            for crf in args.crf:
                c, r, t = measure(frames, crf)
                print(f"| {name} | {w}x{h} | {crf} | {c:.1f} | {r:.1f} | {t:.1f} |")


if __name__ == "__main__":
    main()
