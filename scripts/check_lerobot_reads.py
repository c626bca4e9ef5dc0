"""Check that LeRobot reads ``episodekit import``'s output of every import fixture with the
source's values.

Two steps, two Pythons (LeRobot's venv has no zarr / rosbags; ours has no LeRobot):

    # 1. the source's values, read with the format's own library (h5py, zarr + imagecodecs,
    #    rosbags + Pillow: episodekit's venv; TFDS for RLDS: a venv with tensorflow-datasets)
    python scripts/check_lerobot_reads.py dump SRC /tmp/src.npz
    # 2. the output through LeRobot 0.6.1's LeRobotDataset (LeRobot's venv)
    LEROBOT_PY scripts/check_lerobot_reads.py check OUT /tmp/src.npz
    # every fixture under tests/fixtures/import: import with our CLI, dump, check (`make
    # lerobot-reads LEROBOT_PY=... [TFDS_PY=...]`; RLDS is dumped by TFDS_PY, default LEROBOT_PY)
    .venv/bin/python scripts/check_lerobot_reads.py all --lerobot-python LEROBOT_PY \
        [--tfds-python TFDS_PY]
    # any root without cameras (a repaired one): LeRobot's frames against the data parquet
    LEROBOT_PY scripts/check_lerobot_reads.py root ROOT

``dump`` writes, per output feature of the built-in map, the source's values in the order the
import writes episodes (``episode_N`` / ``demo_N`` by N, zarr by ``episode_ends``, bags by name,
TFDS by shard and record), each episode's length, and the task per frame where the source has
one (robomimic's env name, RLDS's ``language_instruction``, a bag's ``/task``). A ROS bag's values
are those of its messages at the grid's ticks by the documented rule (``tests/importers/
test_rosbag.py``'s ``expected``: rosbags' own reading, a bisect per tick). ``check`` loads OUT with
``LeRobotDataset(repo_id, root=OUT)``, reads every frame, and compares each numeric feature bit
for bit with the source's values cast to the dtype the output declares and then to the dtype
LeRobot hands out (its loader gives float64 columns as float32 tensors), episode lengths,
tasks, timestamps (frame_index / fps), and each camera's decoded frames against the source's
images (uint8, JPEG / PNG / JPEG-XL decoded by their library): the worst PSNR, at least
``MIN_PSNR_DB``. Exit 0 when all agree. Not a CI test: LeRobot is not in CI.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "import"
# RGB PSNR of a decoded frame against its source image: AV1 crf 30 in yuv420p (LeRobot's
# settings) halves the chroma, which on the fixtures' 24x32 frames with colour noise costs the
# most: 27.3 dB worst measured (the rosbag fixtures' 10 Hz JPEG wrist camera). A frame shifted
# by one (printed for scale) or with swapped channels is far below.
MIN_PSNR_DB = 25.0
ROSBAG_FPS = RLDS_FPS = ZARR_FPS = 10
# fixture -> extra `episodekit import` arguments (sources that record no rate need --fps)
FIXTURES = {
    "aloha_raw": [],
    "aloha_jpeg": [],
    "robomimic.hdf5": [],
    "rlds/ek_rlds_fixture/1.0.0": ["--fps", str(RLDS_FPS)],
    "pusht_v2.zarr": ["--fps", str(ZARR_FPS)],
    "pusht_v3.zarr": ["--fps", str(ZARR_FPS)],
    "umi.zarr.zip": ["--fps", str(ZARR_FPS)],
    "rosbag_mcap": ["--fps", str(ROSBAG_FPS)],
    "rosbag_sqlite3": ["--fps", str(ROSBAG_FPS)],
    "rosbag_ros1": ["--fps", str(ROSBAG_FPS)],
}


def _decode(data: bytes) -> np.ndarray:
    """A JPEG / PNG frame as RGB uint8, decoded by Pillow."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _by_number(paths, prefix: str) -> list:
    return sorted(paths, key=lambda p: int(str(p).rsplit(prefix, 1)[1].split(".")[0]))


def dump_aloha(src: Path) -> list[dict]:
    import h5py

    eps = []
    for path in _by_number(src.glob("episode_*.hdf5"), "episode_"):
        with h5py.File(path) as f:
            ep = {"observation.state": f["observations/qpos"][()], "action": f["action"][()]}
            for key, feat in (("qvel", "velocity"), ("effort", "effort")):
                if f"observations/{key}" in f:
                    ep[f"observation.{feat}"] = f[f"observations/{key}"][()]
            for cam, d in f["observations/images"].items():
                rows = d[()]  # raw (T, H, W, 3), or JPEG bytes in zero-padded rows (T, pad)
                imgs = rows if rows.ndim == 4 else np.stack([_decode(r.tobytes()) for r in rows])
                ep[f"observation.images.{cam}"] = imgs
        eps.append(ep)
    return eps


def dump_robomimic(src: Path) -> list[dict]:
    import h5py

    eps = []
    with h5py.File(src) as f:
        task = json.loads(f["data"].attrs["env_args"])["env_name"]
        for name in _by_number(f["data"].keys(), "demo_"):
            g = f["data"][name]
            n = len(g["actions"])
            eps.append({
                "observation.state": np.concatenate(
                    [g["obs/robot0_eef_pos"][()], g["obs/robot0_gripper_qpos"][()]], axis=1),
                "observation.environment_state": g["states"][()],
                "action": g["actions"][()],
                "next.reward": g["rewards"][()].reshape(n, 1),
                "next.done": g["dones"][()].reshape(n, 1),
                "observation.images.agentview": g["obs/agentview_image"][()],
                "task": np.array([task] * n),
            })  # fmt: skip
    return eps


def dump_zarr(src: Path) -> list[dict]:
    import zarr
    from imagecodecs.numcodecs import register_codecs

    register_codecs()  # UMI's camera0_rgb: imagecodecs_jpegxl chunks
    store = zarr.storage.ZipStore(src, mode="r") if src.suffix == ".zip" else src
    g = zarr.open_group(store, mode="r")
    ends = g["meta/episode_ends"][()]
    data = g["data"]
    if "state" in data:  # diffusion policy's pusht
        feats = {
            "observation.state": ["state"],
            "action": ["action"],
            "observation.images.img": ["img"],
        }
    else:  # UMI: the eef position, rotation and gripper width of robot 0
        state = ["robot0_eef_pos", "robot0_eef_rot_axis_angle", "robot0_gripper_width"]
        feats = {"observation.state": state, "observation.images.camera0_rgb": ["camera0_rgb"]}
    whole = {f: np.concatenate([data[k][()] for k in keys], axis=-1) for f, keys in feats.items()}
    starts = np.concatenate([[0], ends[:-1]])
    return [{f: v[a:b] for f, v in whole.items()} for a, b in zip(starts, ends)]


def dump_rosbag(src: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from tests.importers.test_rosbag import expected  # the documented grid rule, by rosbags

    bags = sorted(src.iterdir()) if src.is_dir() and not (src / "metadata.yaml").exists() else [src]
    eps = []
    for bag in bags:
        e = expected(bag, fps=ROSBAG_FPS, latched=("/task",))
        js = e["/joint_states"]
        eps.append({
            "observation.state": np.array([m.position for m in js]),
            "observation.velocity": np.array([m.velocity for m in js]),
            "observation.effort": np.array([m.effort for m in js]),
            "action": np.array([m.data for m in e["/cmd"]]),
            "observation.images.camera": np.stack(
                [np.asarray(m.data).reshape(m.height, m.width, 3) for m in e["/camera/image_raw"]]),
            "observation.images.wrist": np.stack(
                [_decode(bytes(m.data)) for m in e["/wrist/image/compressed"]]),
            "task": np.array([m.data for m in e["/task"]]),
        })  # fmt: skip
    return eps


def dump_rlds(src: Path) -> list[dict]:
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(src))
    eps = []
    for split in builder.info.splits:
        for episode in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)):
            steps = list(episode["steps"])
            obs = [s["observation"] for s in steps]
            eps.append({
                "observation.state": np.stack([o["state"] for o in obs]),
                "action": np.stack([s["action"] for s in steps]),
                "observation.images.image": np.stack([o["image"] for o in obs]),
                "observation.images.wrist_image": np.stack([o["wrist_image"] for o in obs]),
                "next.reward": np.array([s["reward"] for s in steps]).reshape(-1, 1),
                "task": np.array([s["language_instruction"].decode() for s in steps]),
            })  # fmt: skip
    return eps


def dump(src: Path, npz: Path) -> None:
    if (src / "dataset_info.json").exists():
        fmt = "rlds"
    elif src.is_dir() and any(src.glob("episode_*.hdf5")):
        fmt = "aloha"
    elif src.suffix == ".hdf5":
        fmt = "robomimic"
    elif src.name.endswith((".zarr", ".zarr.zip")):
        fmt = "zarr"
    else:
        fmt = "rosbag"
    eps = globals()[f"dump_{fmt}"](src)
    out = {k: np.concatenate([ep[k] for ep in eps]) for k in eps[0]}
    out["lengths"] = np.array([len(ep["action"] if "action" in ep else ep["observation.state"])
                               for ep in eps])  # fmt: skip
    np.savez(npz, **out)
    print(f"wrote {npz}: {fmt}, {len(eps)} episodes, {sorted(out)}")


def psnr_min(got: np.ndarray, want: np.ndarray) -> float:
    """The worst frame's PSNR (dB) of ``got`` against ``want``, both (N, H, W, 3)."""
    diff = got.astype(np.float64) - want.astype(np.float64)
    mse = (diff**2).reshape(len(got), -1).mean(axis=1).max()
    return float(10 * np.log10(255.0**2 / mse)) if mse > 0 else float("inf")


def psnr_mean(got: np.ndarray, want: np.ndarray) -> float:
    """PSNR (dB) of the mean squared error over all of ``got`` against ``want``."""
    mse = ((got.astype(np.float64) - want.astype(np.float64)) ** 2).mean()
    return float(10 * np.log10(255.0**2 / mse)) if mse > 0 else float("inf")


def check(root: Path, npz: Path) -> int:
    import lerobot
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    want = np.load(npz)
    ds = LeRobotDataset("local/imported", root=root)
    n = len(ds)
    print(f"lerobot {lerobot.__version__}: {ds.num_episodes} episodes, {n} frames, fps {ds.fps}")
    items = [ds[i] for i in range(n)]
    table = ds.hf_dataset.data.table  # datasets' Arrow table: the stored column values
    bad = 0
    lengths = np.bincount([int(it["episode_index"]) for it in items])
    ok = np.array_equal(lengths, want["lengths"])
    print(f"episode lengths {lengths.tolist()}: {'equal' if ok else 'DIFFERENT'}")
    bad += not ok
    for feat in want.files:
        if feat == "lengths":
            continue
        src = want[feat]
        if feat == "task":
            got = np.array([it["task"] for it in items])
            ok = np.array_equal(got, src)
            print(f"task: {sorted(set(got.tolist()))} per frame {'equal' if ok else 'DIFFERENT'}")
        elif feat.startswith("observation.images."):
            got = np.stack([it[feat].numpy() for it in items])  # (N, C, H, W) float in [0, 1]
            got = np.round(got.transpose(0, 2, 3, 1) * 255)
            ok = got.shape == src.shape and (worst := psnr_min(got, src)) >= MIN_PSNR_DB
            if got.shape == src.shape:  # against the wrong frames, for scale
                off = psnr_mean(got[1:], src[:-1])
                print(f"{feat}: {n} frames decoded, min PSNR {worst:.2f} dB (each against "
                      f"the next source frame: mean {off:.2f} dB)")  # fmt: skip
            else:
                print(f"{feat}: decoded {got.shape} != source {src.shape}")
        else:
            declared = ds.meta.features[feat]["dtype"]
            want_stored = src.reshape(n, -1).astype(declared)
            # what LeRobot's datasets table holds, before its torch transform
            stored = np.array(table.column(feat).to_pylist(), dtype=declared).reshape(n, -1)
            got = np.stack([it[feat].numpy() for it in items]).reshape(n, -1)
            cast = want_stored.astype(got.dtype)
            ok = stored.tobytes() == want_stored.tobytes() and got.shape == cast.shape
            ok = ok and got.tobytes() == cast.tobytes()
            print(f"{feat}: source {src.dtype} -> declared {declared} (stored values "
                  f"{'equal' if stored.tobytes() == want_stored.tobytes() else 'DIFFERENT'}) "
                  f"-> LeRobot's tensors {got.dtype} {got.shape}: "
                  f"{'equal bit for bit' if ok else 'DIFFERENT'}")  # fmt: skip
        bad += not ok
    ts = np.array([float(it["timestamp"]) for it in items], dtype=np.float32)
    fi = np.array([int(it["frame_index"]) for it in items])
    ok = np.array_equal(ts, (fi / ds.fps).astype(np.float32))
    print(f"timestamp == frame_index / fps: {ok}")
    bad += not ok
    print("OK" if not bad else f"{bad} checks failed")
    return 1 if bad else 0


def check_root(root: Path, samples: int = 300) -> int:
    """Load ROOT (any v3.0 root without cameras: a repaired one, say) with LeRobot and compare
    ``samples`` random frames plus the first and last with the data parquet's rows, and
    ``meta/episodes``' ``dataset_from_index`` / ``dataset_to_index`` with the data's episodes."""
    import lerobot
    import pyarrow.parquet as pq
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("local/root", root=root)
    table = pq.read_table(sorted((root / "data").glob("*/*.parquet")))
    n = table.num_rows
    print(f"lerobot {lerobot.__version__}: {ds.num_episodes} episodes, {len(ds)} frames")
    idx = np.unique(np.r_[np.random.default_rng(0).integers(0, n, samples), 0, n - 1])
    bad = int(len(ds) != n)
    for i in idx.tolist():
        item = ds[i]
        for col in table.column_names:
            want = np.asarray(table[col][i].as_py())
            got = np.asarray(item[col]).reshape(want.shape).astype(want.dtype)
            if not np.array_equal(got, want):
                bad += 1
                print(f"frame {i} {col}: LeRobot {got} != stored {want}")
    ep = table["episode_index"].to_numpy()
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    ends = np.r_[starts[1:], n]
    meta = ds.meta.episodes
    ok = np.array_equal(np.asarray(meta["dataset_from_index"]), starts)
    ok = ok and np.array_equal(np.asarray(meta["dataset_to_index"]), ends)
    print(f"{len(idx)} frames compared, {bad} different; episodes' index ranges "
          f"{'equal' if ok else 'DIFFERENT'} ({len(starts)} episodes)")  # fmt: skip
    return 1 if bad or not ok else 0


def run_all(lerobot_py: str, work: Path, tfds_py: str | None = None) -> int:
    """Import every fixture with our CLI, dump its source, check the output in LeRobot's venv
    (RLDS dumped by ``tfds_py``, default ``lerobot_py``); a fixture that fails any step is
    named at the end, the others still run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    failed = []
    for fixture, extra in FIXTURES.items():
        name = fixture.split("/")[0].split(".")[0]
        src, out, npz = FIX / fixture, work / name, work / f"{name}.npz"
        print(f"== {fixture}", flush=True)
        subprocess.run([sys.executable, "-m", "episodekit.cli", "import", str(src), "--out",
                        str(out), *extra], check=True, capture_output=True)  # fmt: skip
        dumper = (tfds_py or lerobot_py) if name == "rlds" else sys.executable  # needs TFDS
        if subprocess.run([dumper, __file__, "dump", str(src), str(npz)], env=env).returncode:
            failed.append(f"{fixture} (dump by {dumper})")
        else:
            checked = subprocess.run([lerobot_py, __file__, "check", str(out), str(npz)], env=env)
            if checked.returncode:
                failed.append(fixture)
    print(f"{len(FIXTURES) - len(failed)} of {len(FIXTURES)} fixtures read back equal by LeRobot"
          + (f"; failed: {failed}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="the source's values, by the format's own library")
    d.add_argument("src", type=Path)
    d.add_argument("npz", type=Path)
    c = sub.add_parser("check", help="read OUT with LeRobot and compare (LeRobot's venv)")
    c.add_argument("out", type=Path)
    c.add_argument("npz", type=Path)
    r = sub.add_parser("root", help="read a root without cameras with LeRobot, compare frames")
    r.add_argument("root", type=Path)
    a = sub.add_parser("all", help="every fixture: import, dump, check")
    a.add_argument("--lerobot-python", default=os.environ.get("LEROBOT_PY"), required=False)
    a.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp dir)")
    a.add_argument(
        "--tfds-python",
        default=None,
        help="a python with tensorflow-datasets, to dump RLDS (default: LeRobot's)",
    )
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.src, args.npz)
    elif args.cmd == "check":
        sys.exit(check(args.out, args.npz))
    elif args.cmd == "root":
        sys.exit(check_root(args.root))
    else:
        if not args.lerobot_python:
            sys.exit("give --lerobot-python (LeRobot 0.6.1's venv python, with TFDS for RLDS)")
        work = args.work or Path(tempfile.mkdtemp(prefix="lerobot-reads-"))
        work.mkdir(parents=True, exist_ok=True)
        sys.exit(run_all(args.lerobot_python, work, args.tfds_python))


if __name__ == "__main__":
    main()
