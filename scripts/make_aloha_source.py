"""Write N small ALOHA HDF5 episodes (``episode_{i}.hdf5``, record_episodes.py's layout) with
h5py, for the import benchmarks and the resume tests: ``import``'s memory and crash behaviour
measured on as many episodes as wanted without a real recording.

    .venv/bin/python scripts/make_aloha_source.py OUT --episodes 1000 [--steps 20] [--size 24x32]

Images are raw (gzip-filtered chunks), two cameras; values seeded per episode (equal on a
rerun). Needs h5py (the dev extras).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np

CAMS = ("cam_high", "cam_left_wrist")


def write_episode(path: Path, index: int, steps: int, h: int, w: int) -> None:
    """One episode file, ALOHA's layout (qpos, qvel, action 14-wide, images per camera)."""
    rng = np.random.default_rng(index)
    y, x = np.mgrid[0:h, 0:w] // 4 * 4
    t = np.arange(steps)[:, None, None]
    base = np.stack([(x * 6 + t * 3) % 256, (y * 8 + t * 2) % 256, ((x + y) * 4 + t) % 256], -1)
    with h5py.File(path, "w") as root:
        root.attrs["sim"] = False
        root.attrs["compress"] = False
        obs = root.create_group("observations")
        image = obs.create_group("images")
        for c in CAMS:
            noise = (rng.random(size=base.shape) < 1 / 64) * 40
            frames = np.clip(base + noise, 0, 255).astype(np.uint8)
            image.create_dataset(
                c, data=frames, chunks=(1, h, w, 3), compression="gzip", compression_opts=1
            )
        for key in ("qpos", "qvel"):
            obs.create_dataset(key, data=rng.normal(size=(steps, 14)))
        root.create_dataset("action", data=rng.normal(size=(steps, 14)))


def make_source(out: str | Path, episodes: int, steps: int = 20, size: str = "24x32") -> Path:
    """Write ``episodes`` episode files into ``out`` (created); returns it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    h, w = (int(v) for v in size.split("x"))
    for i in range(episodes):
        write_episode(out / f"episode_{i}.hdf5", i, steps, h, w)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--size", default="24x32", help="HxW of the images")
    a = ap.parse_args()
    make_source(a.out, a.episodes, a.steps, a.size)
    print(f"{a.episodes} episodes in {a.out}")


if __name__ == "__main__":
    main()
