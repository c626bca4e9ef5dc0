"""Check that LeRobot reads an ``episodekit import`` output with the source's values.

Two steps, two Pythons (LeRobot's venv has no h5py; ours has no LeRobot):

    # 1. the source's values, read with h5py (episodekit's venv)
    python scripts/check_lerobot_reads.py dump tests/fixtures/import/aloha_raw /tmp/src.npz
    # 2. the output through LeRobot 0.6.1's LeRobotDataset (LeRobot's venv)
    LEROBOT_PY scripts/check_lerobot_reads.py check OUT /tmp/src.npz

``check`` loads OUT with ``LeRobotDataset(repo_id, root=OUT)``, reads every frame, and compares
qpos / qvel / action (bit for bit; LeRobot's loader hands float64 columns out as float32
tensors, so those against the source cast to float32), timestamps (frame_index / fps), and
each camera's decoded frame against the source image (worst PSNR printed). Exit 0 when all
agree. Not a CI test: LeRobot is not in CI.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

CAMS = ("cam_high", "cam_left_wrist")
FEATURES = {
    "observation.state": "observations/qpos",
    "observation.velocity": "observations/qvel",
    "action": "action",
}


def dump(src: Path, npz: Path) -> None:
    import h5py

    out: dict[str, list] = {k: [] for k in (*FEATURES, *CAMS)}
    files = sorted(src.glob("episode_*.hdf5"), key=lambda p: int(p.stem.split("_")[1]))
    for path in files:
        with h5py.File(path) as f:
            for feat, key in FEATURES.items():
                out[feat].append(f[key][()])
            for c in CAMS:
                out[c].append(f[f"observations/images/{c}"][()])
    np.savez(npz, **{k: np.concatenate(v) for k, v in out.items()})
    print(f"wrote {npz}: {len(files)} episodes")


def check(root: Path, npz: Path) -> int:
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    want = np.load(npz)
    ds = LeRobotDataset("local/imported", root=root)
    n = len(ds)
    print(f"lerobot {lerobot.__version__}: {ds.num_episodes} episodes, {n} frames, fps {ds.fps}")
    bad = 0
    items = [ds[i] for i in range(n)]
    for feat in FEATURES:
        got = np.stack([it[feat].numpy() for it in items])
        src = want[feat]
        same = got.tobytes() == src.astype(got.dtype).tobytes()
        how = (
            "equal bit for bit"
            if got.dtype == src.dtype
            else f"equal to the source's {src.dtype} cast to {got.dtype}"
        )
        print(f"{feat}: {got.dtype} {got.shape} {how if same else 'DIFFERENT'}")
        bad += not same
    ts = np.array([float(it["timestamp"]) for it in items], dtype=np.float32)
    fi = np.array([int(it["frame_index"]) for it in items])
    ok = np.array_equal(ts, (fi / ds.fps).astype(np.float32))
    print(f"timestamp == frame_index / fps: {ok}")
    bad += not ok
    for c in CAMS:
        key = f"observation.images.{c}"
        got = np.stack([it[key].numpy() for it in items])  # (N, C, H, W) float in [0, 1]
        got = np.round(got.transpose(0, 2, 3, 1) * 255).astype(np.float64)
        mse = ((got - want[c].astype(np.float64)) ** 2).reshape(n, -1).mean(axis=1)
        worst = float(10 * np.log10(255.0**2 / mse.max())) if mse.max() > 0 else float("inf")
        print(f"{key}: {got.shape[0]} frames decoded, min PSNR {worst:.2f} dB")
        bad += worst < 28
    print("OK" if not bad else f"{bad} checks failed")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("dump", "check"):
        sys.exit(__doc__)
    if sys.argv[1] == "dump":
        dump(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(check(Path(sys.argv[2]), Path(sys.argv[3])))
