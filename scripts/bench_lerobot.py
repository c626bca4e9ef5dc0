"""Our loaders against LeRobot 0.6.1 itself, on video LeRobot recorded (480x640, two cameras).

    .venv/bin/python scripts/bench_lerobot.py --lerobot-python LR/bin/python \\
        [--dir /tmp/bench_lerobot] [--episodes 12] [--rounds 3] [--samples 48]

``LR`` is a venv with ``lerobot[dataset]==0.6.1`` (recipe: tests/fixtures/lerobot/README.md);
nothing of LeRobot is re-implemented here, every LeRobot figure is LeRobot's own code running in
a subprocess of that venv.

1. **Record** (once; kept when ``DIR/lr480`` exists): ``LeRobotDataset.create`` +
   ``add_frame`` / ``save_episode`` / ``finalize`` in the LeRobot venv, two ``video`` cameras at
   480x640 (LeRobot's default encoding), 14-dim state and action, 30 fps, ``--episodes`` episodes
   of 80-160 frames (synthetic moving textures: the content only has to cost a real decode).
2. **Measure**, in ``--rounds`` interleaved rounds (every case once per round, each in a fresh
   subprocess; start-up and the first item or batch are not timed), samples per second of:
   - ``LeRobot ds[i]``: ``LeRobotDataset(root)[i]`` on random indices, one process;
   - ``LeRobot DataLoader 2``: ``DataLoader(LeRobotDataset(root), batch_size, random order,
     num_workers=2)``, timed after each worker's first batch (its start-up);
   - ``ours ds[i]``: ``FrameDataset(root)[i]`` on the same indices (video decoded by default);
   - ``ours make_loader 2``: ``make_loader(root, None, batch_size, 2, access="random")``, timed
     the same way (``--loader-samples`` samples for both loaders);
   - ``decode limit``: PyAV decoding every frame of every mp4 in order to RGB with one thread,
     in samples per second (a sample needs one frame per camera): what one core can give at
     best, random access included.
   The figures are ratios to ``LeRobot ds[i]`` (and to the decode limit) of the same round, and
   their median over rounds. Both sides read the recorded root as it is (no ``prepare``; our
   speed artifact is kept in memory so the root stays as LeRobot wrote it).
3. **Pixels**: the first ``--check`` indices of round 1 are compared, ours against LeRobot's
   (its float CHW x 255, rounded, to HWC uint8): every camera pixel and every numeric column.

Top-level imports are the standard library and numpy only: the same file runs in both venvs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from bench_workers import cpu_seconds  # stdlib only: imports in LeRobot's venv too

FPS = 30
H, W = 480, 640
CAMERAS = ("observation.images.top", "observation.images.wrist")
NUMERIC = ("index", "episode_index", "frame_index", "timestamp", "task_index", "action")
TASKS = ["pick up the red cube", "open the drawer", "fold the towel"]
WARM = 2  # loaders: batches before the clock starts (each of the 2 workers' first)
CASES = ("LeRobot ds[i]", "LeRobot DataLoader 2", "ours ds[i]", "ours make_loader 2")


class Clock:
    """Wall and CPU seconds (this process and ``pids``) from :meth:`start` to :meth:`result`."""

    def start(self, pids: list[int] = ()) -> None:
        self.pids = [os.getpid(), *pids]
        self.t, self.c = time.perf_counter(), cpu_seconds(self.pids)

    def result(self, n: int, **extra: object) -> dict:
        wall, cpu = time.perf_counter() - self.t, cpu_seconds(self.pids) - self.c
        return {"rate": n / wall, "per_cpu": n / max(cpu, 1e-9), **extra}


# --- in the LeRobot venv ------------------------------------------------------------------------


def time_items(ds, idx: list[int], **extra: object) -> dict:
    """``ds[i]`` over ``idx``, the first untimed (its start-up): :meth:`Clock.result`."""
    ds[idx[0]]
    clock = Clock()
    clock.start()
    for i in idx[1:]:
        ds[i]
    return clock.result(len(idx) - 1, **extra)


def frame_images(ep: int, i: int, base: np.ndarray) -> dict[str, np.ndarray]:
    """Two 480x640 RGB frames: a textured gradient scrolling 4 px/frame with a moving bar (top),
    the same texture transposed and tinted by episode, scrolling down (wrist)."""
    top = np.roll(base, 4 * i, axis=1).copy()
    top[:, (7 * i) % W : (7 * i) % W + 12] = 255
    wrist = np.roll(base[::-1, ::-1], 3 * i, axis=0).copy()
    wrist[..., ep % 3] //= 2
    return {CAMERAS[0]: top, CAMERAS[1]: wrist}


def record(root: Path, episodes: int, seed: int) -> None:
    """Write ``root`` with LeRobot's own recorder (runs in the LeRobot venv)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    rng = np.random.default_rng(seed)
    names = [f"j{k}" for k in range(14)]
    features = {
        "observation.state": {"dtype": "float32", "shape": (14,), "names": names},
        "action": {"dtype": "float32", "shape": (14,), "names": names},
    }
    for cam in CAMERAS:
        names = ["height", "width", "channels"]
        features[cam] = {"dtype": "video", "shape": (H, W, 3), "names": names}
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    texture = np.kron(rng.integers(-12, 13, size=(H // 8, W // 8)), np.ones((8, 8)))
    grad = np.stack([xx / W * 200 + 30, yy / H * 160 + 40, (1 - xx / W) * 180 + 40], axis=-1)
    base = np.clip(grad + texture[..., None], 0, 255).astype(np.uint8)
    ds = LeRobotDataset.create(
        repo_id="bench/lr480", fps=FPS, features=features, root=root, robot_type="aloha",
        use_videos=True, image_writer_threads=4,
    )  # fmt: skip
    for ep in range(episodes):
        n = int(rng.integers(80, 161))
        state = np.cumsum(rng.normal(0, 0.01, size=(n, 14)).astype(np.float32), axis=0)
        for i in range(n):
            frame = {"observation.state": state[i], "action": state[min(i + 1, n - 1)]}
            frame.update(frame_images(ep, i, base))
            ds.add_frame({**frame, "task": TASKS[ep % len(TASKS)]})
        ds.save_episode()
    ds.finalize()
    print(f"recorded {ds.meta.total_episodes} episodes, {ds.meta.total_frames} frames")


def lerobot_measure(root: Path, mode: str, idx: list[int], batch: int, dump: str | None) -> dict:
    """LeRobot 0.6.1's samples/s on ``idx`` (the first item or batch untimed)."""
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("bench/lr480", root=root)
    backend = getattr(ds, "_video_backend", None)
    if mode == "item":
        if dump:
            rows = [ds[i] for i in idx]
            out = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in NUMERIC}
            for cam in CAMERAS:
                f = np.stack([r[cam].numpy() for r in rows]) * 255.0
                out[cam] = np.moveaxis(np.round(f).astype(np.uint8), 1, -1)
            np.savez(dump, **out)
        return time_items(ds, idx, backend=backend)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=idx, num_workers=2)
    n, clock, it = 0, Clock(), iter(dl)
    for i, b in enumerate(it):
        if i == WARM - 1:  # after each worker's first batch (its start-up)
            clock.start([int(w.pid) for w in it._workers])
        elif i >= WARM:
            n += len(b["index"])
            if i == len(dl) - 1:  # (read the workers' CPU before they exit)
                return clock.result(n, backend=backend)
    raise RuntimeError(f"too few samples for {WARM + 1} batches")


# --- in our venv --------------------------------------------------------------------------------


def ours_measure(root: Path, mode: str, idx: list[int], batch: int, dump: str | None) -> dict:
    """Our samples/s on ``idx`` (item) or ``len(idx)`` random samples (make_loader)."""
    if mode == "item":
        from episodekit.loaders import FrameDataset

        ds = FrameDataset(root, speed="memory")
        if dump:
            rows = [ds[i] for i in idx]
            out = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in (*NUMERIC, *CAMERAS)}
            np.savez(dump, **out)
        return time_items(ds, idx)
    from episodekit.loaders.torch import make_loader

    n, clock = 0, Clock()
    with make_loader(root, None, batch, 2, access="random", speed="memory") as loader:
        for i, b in enumerate(loader):
            if i == WARM - 1:  # after each worker's first batch (its start-up)
                clock.start(loader.pool.pids)
            elif i >= WARM:
                n += len(b["index"])
                if n >= len(idx) - WARM * batch:
                    break
        return clock.result(n)


def decode_limit(root: Path) -> dict:
    """Every frame of every mp4 decoded in order to RGB, one thread: samples/s."""
    import av

    files = sorted(root.glob("videos/*/*/*.mp4"))
    frames, clock = 0, Clock()
    clock.start()
    for f in files:
        with av.open(str(f)) as c:
            s = c.streams.video[0]
            s.codec_context.thread_count = 1
            for fr in c.decode(s):
                fr.to_ndarray(format="rgb24")
                frames += 1
    return clock.result(frames // len(CAMERAS))


# --- the driver ---------------------------------------------------------------------------------


def child(argv: list[str]) -> None:
    """``_record ROOT EPISODES SEED`` or ``_measure SIDE MODE ROOT IDX_JSON BATCH [DUMP]``."""
    if argv[0] == "_record":
        record(Path(argv[1]), int(argv[2]), int(argv[3]))
        return
    side, mode, root, idx, batch = argv[1], argv[2], Path(argv[3]), json.loads(argv[4]), argv[5]
    dump = argv[6] if len(argv) > 6 else None
    if side == "limit":
        got = decode_limit(root)
    else:
        fn = lerobot_measure if side == "lerobot" else ours_measure
        got = fn(root, mode, idx, int(batch), dump)
    print("RESULT " + json.dumps(got), flush=True)


def run(python: str, *args: object) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [python, os.path.abspath(__file__), *map(str, args)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd[:4])}...\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def compare(lerobot_npz: str, ours_npz: str) -> str:
    a, b = np.load(lerobot_npz), np.load(ours_npz)
    bad = []
    for k in (*NUMERIC, *CAMERAS):
        x, y = a[k], b[k].reshape(a[k].shape)
        if not np.array_equal(x, y):
            diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
            bad.append(f"{k}: {int((diff > 0).sum())} values differ, max {diff.max():g}")
    n = len(a["index"])
    px = n * len(CAMERAS) * H * W * 3
    return f"{n} samples, {px:,} pixel values: " + ("equal" if not bad else "; ".join(bad))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lerobot-python", required=True, help="python of a lerobot 0.6.1 venv")
    ap.add_argument("--dir", default="/tmp/bench_lerobot")
    ap.add_argument("--episodes", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=48, help="random ds[i] per case and round")
    ap.add_argument("--loader-samples", type=int, default=160, help="per loader case and round")
    ap.add_argument("--batch", type=int, default=8, help="batch size of both loaders")
    ap.add_argument("--check", type=int, default=12, help="samples compared pixel for pixel")
    a = ap.parse_args()
    root = Path(a.dir) / "lr480"
    root.parent.mkdir(parents=True, exist_ok=True)
    if not (root / "meta/info.json").exists():
        t = time.perf_counter()
        cmd = [a.lerobot_python, os.path.abspath(__file__), "_record", root, a.episodes, a.seed]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        subprocess.run(list(map(str, cmd)), env=env, check=True)
        print(f"recorded with LeRobot in {time.perf_counter() - t:.0f} s")
    info = json.loads((root / "meta/info.json").read_text())
    total = int(info["total_frames"])
    vi = info["features"][CAMERAS[0]].get("info", {})
    print(
        f"{root}: {info['total_episodes']} episodes, {total} frames, 2 cameras {H}x{W} "
        f"({vi.get('video.codec')}, {vi.get('video.pix_fmt')}); {os.cpu_count()} cpus, "
        f"load average {os.getloadavg()[0]:.1f} at start",
        flush=True,
    )
    ours, lr = sys.executable, a.lerobot_python
    rates: dict[str, list[float]] = {c: [] for c in (*CASES, "decode limit")}
    ratios: dict[str, list[float]] = {c: [] for c in rates}
    cpu_ratios: dict[str, list[float]] = {c: [] for c in rates}
    for r in range(a.rounds):
        rng = np.random.default_rng(100 + r)
        idx = rng.choice(total, a.samples + 1, replace=False).tolist()
        ij = json.dumps(idx)
        lj = json.dumps(rng.choice(total, a.loader_samples, replace=False).tolist())
        dumps = (f"{a.dir}/lerobot_{r}.npz", f"{a.dir}/ours_{r}.npz") if r == 0 else (None, None)
        got = {
            CASES[0]: run(lr, "_measure", "lerobot", "item", root, ij, a.batch),
            CASES[1]: run(lr, "_measure", "lerobot", "loader", root, lj, a.batch),
            CASES[2]: run(ours, "_measure", "ours", "item", root, ij, a.batch),
            CASES[3]: run(ours, "_measure", "ours", "loader", root, lj, a.batch),
            "decode limit": run(ours, "_measure", "limit", "-", root, "[]", 0),
        }
        if r == 0:
            chk = json.dumps(idx[: a.check])
            run(lr, "_measure", "lerobot", "item", root, chk, a.batch, dumps[0])
            run(ours, "_measure", "ours", "item", root, chk, a.batch, dumps[1])
            print(f"pixels: {compare(*dumps)}; LeRobot's video backend: {got[CASES[0]]['backend']}")
            for f in dumps:
                os.remove(f)
        base, base_cpu = got[CASES[0]]["rate"], got[CASES[0]]["per_cpu"]
        line = []
        for c, v in got.items():
            rates[c].append(v["rate"])
            ratios[c].append(v["rate"] / base)
            cpu_ratios[c].append(v["per_cpu"] / base_cpu)
            line.append(
                f"{c} {v['rate']:.1f} ({v['rate'] / base:.2f}x; per CPU-s {v['per_cpu']:.1f}, "
                f"{v['per_cpu'] / base_cpu:.2f}x)"
            )
        load = os.getloadavg()[0]
        print(f"round {r + 1} (load {load:.1f}), samples/s: " + ", ".join(line), flush=True)
    print(
        f"\nmedian of {a.rounds} rounds: samples/s, x LeRobot ds[i], x the decode limit; "
        "samples per CPU-second x LeRobot ds[i]'s"
    )
    for c in rates:
        lim = [v / d for v, d in zip(rates[c], rates["decode limit"])]
        print(
            f"  {c:<22} {statistics.median(rates[c]):>8.1f}  {statistics.median(ratios[c]):>6.2f}x"
            f"  {statistics.median(lim):>5.2f}x  {statistics.median(cpu_ratios[c]):>6.2f}x"
        )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        child(sys.argv[1:])
    else:
        main()
