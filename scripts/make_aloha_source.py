"""Write N ALOHA HDF5 episodes (``episode_{i}.hdf5``, record_episodes.py's layout) with h5py,
for the import benchmarks and the resume tests: ``import``'s speed, memory and crash behaviour
measured on as many episodes as wanted without a real recording.

    .venv/bin/python scripts/make_aloha_source.py OUT --episodes 1000 [--steps 20] [--size 24x32]
        [--cameras cam_high,cam_left_wrist] [--jpeg QUALITY]

Images are raw (gzip-filtered chunks) or, with ``--jpeg``, JPEG-compressed as ALOHA's
``COMPRESS`` recordings are (each frame's bytes in a zero-padded ``uint8`` row, ``/compress_len``
cameras x steps, the file attribute ``compress = True``; ALOHA encodes with cv2 at quality 50,
Pillow here). openpi's ``convert_aloha_data_to_lerobot.py`` reads the four cameras
``cam_high,cam_low,cam_left_wrist,cam_right_wrist`` at 480x640. Values are seeded per episode
(equal on a rerun). Needs h5py (the dev extras) and, for ``--jpeg``, Pillow.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import h5py
import numpy as np

CAMS = ("cam_high", "cam_left_wrist")


def _frames(rng: np.random.Generator, steps: int, h: int, w: int, cam: int) -> np.ndarray:
    """``(steps, h, w, 3)`` uint8: a moving pattern (4-pixel blocks) with sparse noise."""
    y, x = (np.mgrid[0:h, 0:w] // 4 * 4).astype(np.int32)
    out = np.empty((steps, h, w, 3), np.uint8)
    for t in range(steps):  # one frame at a time: 480x640 x hundreds of steps in int64 is GBs
        s = t + 7 * cam
        out[t, ..., 0] = (x * 6 + s * 3) % 256
        out[t, ..., 1] = (y * 8 + s * 2) % 256
        out[t, ..., 2] = ((x + y) * 4 + s) % 256
        noise = rng.random(size=(h, w, 3)) < 1 / 64
        np.add(out[t], 40, out=out[t], where=noise & (out[t] < 216))
    return out


def _jpeg(frames: np.ndarray, quality: int) -> list[bytes]:
    from PIL import Image

    encoded = []
    for frame in frames:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="JPEG", quality=quality)
        encoded.append(buf.getvalue())
    return encoded


def write_episode(
    path: Path,
    index: int,
    steps: int,
    h: int,
    w: int,
    cams: tuple[str, ...] = CAMS,
    jpeg: int | None = None,
) -> None:
    """One episode file, ALOHA's layout (qpos, qvel, action 14-wide, images per camera)."""
    rng = np.random.default_rng(index)
    with h5py.File(path, "w") as root:
        root.attrs["sim"] = False
        root.attrs["compress"] = jpeg is not None
        obs = root.create_group("observations")
        image = obs.create_group("images")
        encoded = {}
        for ci, c in enumerate(cams):
            frames = _frames(rng, steps, h, w, ci)
            if jpeg is None:
                image.create_dataset(
                    c, data=frames, chunks=(1, h, w, 3), compression="gzip", compression_opts=1
                )
            else:
                encoded[c] = _jpeg(frames, jpeg)
        if encoded:  # record_episodes.py: every camera padded to the longest frame of all
            pad = max(len(b) for frames in encoded.values() for b in frames)
            compress_len = np.zeros((len(cams), steps), dtype=np.float64)
            for ci, c in enumerate(cams):
                rows = np.zeros((steps, pad), np.uint8)
                for i, b in enumerate(encoded[c]):
                    rows[i, : len(b)] = np.frombuffer(b, np.uint8)
                    compress_len[ci, i] = len(b)
                image.create_dataset(c, data=rows, chunks=(1, pad))
            root.create_dataset("compress_len", data=compress_len)
        for key in ("qpos", "qvel"):
            obs.create_dataset(key, data=rng.normal(size=(steps, 14)))
        root.create_dataset("action", data=rng.normal(size=(steps, 14)))


def make_source(
    out: str | Path,
    episodes: int,
    steps: int = 20,
    size: str = "24x32",
    cams: tuple[str, ...] = CAMS,
    jpeg: int | None = None,
) -> Path:
    """Write ``episodes`` episode files into ``out`` (created); returns it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    h, w = (int(v) for v in size.split("x"))
    for i in range(episodes):
        write_episode(out / f"episode_{i}.hdf5", i, steps, h, w, cams, jpeg)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--size", default="24x32", help="HxW of the images")
    ap.add_argument("--cameras", default=",".join(CAMS), help="comma-separated camera names")
    ap.add_argument("--jpeg", type=int, default=None, metavar="QUALITY", help="JPEG, not raw")
    a = ap.parse_args()
    make_source(a.out, a.episodes, a.steps, a.size, tuple(a.cameras.split(",")), a.jpeg)
    print(f"{a.episodes} episodes in {a.out}")


if __name__ == "__main__":
    main()
