"""The demo behind `make demo`: write an `edited`-style sample (~1M frames), prepare it, load it.

Prints what each step did: the sample's layout before, `episodekit prepare`'s summary, the layout
after, and a few batches read through the runtime loader (map-style with delta windows, and the
sharded loader of rank 0 of 8 following the shard plan). The dataset stays in ``--root``
(`make demo` passes DEMO_DIR, default ./demo-data) and the demo ends with three commands to try
on it. A folder that holds something else than an earlier demo dataset is never replaced.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

BIN = Path(sys.executable).parent


def run(*args: str) -> None:
    print(f"\n$ episodekit {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([str(BIN / "episodekit"), *args], check=True)
    print(f"({time.perf_counter() - t0:.1f}s)", flush=True)


def read_through_loader(root: Path) -> None:
    from episodekit.loaders import FrameDataset, ShardedLoader, load_plan

    print("\n# reading through episodekit.loaders", flush=True)
    t0 = time.perf_counter()
    ds = FrameDataset(
        str(root),
        delta_timestamps={
            "action": [k / 30 for k in range(50)],
            "observation.state": [-2 / 30, -1 / 30, 0],
        },
    )
    rng = np.random.default_rng(0)
    batch = ds.get_batch(rng.integers(0, len(ds), size=256))
    print(
        f"FrameDataset: {len(ds):,} frames; get_batch(256) -> "
        + ", ".join(f"{k}{tuple(np.shape(v))}" for k, v in batch.items() if k != "task")
    )
    print(
        f"  speeds in batch: {sorted(set(np.asarray(batch['speed']).tolist()))}; "
        f"action_is_pad true: {int(np.asarray(batch['action_is_pad']).sum())}"
    )
    plan = load_plan(str(root), 8, 4)
    loader = ShardedLoader(
        str(root),
        plan,
        rank=0,
        world_size=8,
        worker=0,
        num_workers=4,
        batch_size=64,
        seed=0,
    )
    n = 0
    for i, b in enumerate(loader):
        n += len(b["index"])
        if i == 2:
            break
    print(
        f"ShardedLoader rank 0/8 worker 0/4: read 3 batches ({n} frames); "
        f"{plan.samples_per_worker:,} samples per worker per epoch, "
        f"{plan.samples_per_rank:,} per rank on every rank"
    )
    print(f"({time.perf_counter() - t0:.1f}s)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--root", default="./demo-data", help="Where the sample dataset is written.")
    p.add_argument("--episodes", type=int, default=2500)
    a = p.parse_args()
    root = Path(a.root)
    if root.exists() and any(root.iterdir()) and not (root / "meta/info.json").exists():
        sys.exit(f"{root} holds something else than a demo dataset: choose another DEMO_DIR")
    t0 = time.perf_counter()
    print(f"demo dataset folder: {root.resolve()}  (DEMO_DIR; kept afterwards)")
    # A demo dataset of an older checkout has no output marker yet: it is replaced all the same.
    force = ["--force"] if (root / "meta/info.json").exists() else []
    run("sample", str(root), "--episodes", str(a.episodes), "--style", "edited", *force)
    run("info", str(root), "--max-files", "4")
    run("prepare", str(root), "--frames")  # + the frame store the random-access reads use
    run("info", str(root), "--max-files", "4")
    print("\n# a second prepare finds everything fresh:")
    run("prepare", str(root), "--frames")
    read_through_loader(root)
    rel = root if not root.is_absolute() else root.resolve()
    print(f"\ndemo finished in {time.perf_counter() - t0:.1f}s; the dataset is in {rel}")
    print("next:")
    print(f"  {BIN / 'episodekit'} info {rel}")
    print(f"  {BIN / 'episodekit'} validate {rel}")
    print(f"  {BIN / 'python'} scripts/loader_snippet.py {rel}")


if __name__ == "__main__":
    main()
