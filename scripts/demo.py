"""The demo behind `make demo`: write an `edited`-style sample (~1M frames), prepare it, load it.

Prints what each step did: the sample's layout before, `episodekit prepare`'s summary, the layout
after, and a few batches read through the runtime loader (map-style with delta windows, and the
sharded loader of rank 0 of 8 following the shard plan).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def run(*args: str) -> None:
    print(f"\n$ episodekit {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "episodekit.cli", *args], check=True)
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
    p.add_argument("--root", required=True, help="Where to write the sample dataset.")
    p.add_argument("--episodes", type=int, default=2500)
    p.add_argument("--keep", action="store_true", help="Keep the sample afterwards.")
    a = p.parse_args()
    root = Path(a.root)
    t0 = time.perf_counter()
    try:
        run("sample", str(root), "--episodes", str(a.episodes), "--style", "edited")
        run("info", str(root), "--max-files", "4")
        run("prepare", str(root), "--world-size", "8,64", "--workers", "4")
        run("info", str(root), "--max-files", "4")
        print("\n# a second prepare finds everything fresh:")
        run("prepare", str(root), "--world-size", "8,64", "--workers", "4")
        read_through_loader(root)
        print(f"\ndemo finished in {time.perf_counter() - t0:.1f}s")
    finally:
        if not a.keep:
            target = root.parent if root.parent.name.startswith("episodekit-demo") else root
            shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    main()
