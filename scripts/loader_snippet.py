"""Read a prepared dataset the way a training job does (numpy + pyarrow only, no torch needed).

    .venv/bin/python scripts/loader_snippet.py ./demo-data

Map-style access with LeRobot-style delta windows, then the sharded loader of one rank and one
DataLoader worker following the shard plan `episodekit prepare` wrote (world size 8, 4 workers).
"""

from __future__ import annotations

import sys

import numpy as np

from episodekit.loaders import FrameDataset, ShardedLoader, load_plan

root = sys.argv[1] if len(sys.argv) > 1 else "./demo-data"
fps = 30
ds = FrameDataset(
    root,
    delta_timestamps={
        "action": [k / fps for k in range(50)],  # a 50-frame action chunk
        "observation.state": [-2 / fps, -1 / fps, 0.0],  # 3 frames of state history
    },
)
batch = ds.get_batch(np.random.default_rng(0).integers(0, len(ds), size=256))
print(f"{len(ds):,} frames; get_batch(256):")
for key, value in batch.items():
    print(f"  {key:<28} {np.shape(value)}")

plan = load_plan(root, world_size=8, num_workers=4)  # raises if missing or stale
loader = ShardedLoader(
    root, plan, rank=0, world_size=8, worker=0, num_workers=4, batch_size=64, seed=0
)
for i, b in enumerate(loader):
    episodes = np.unique(b["episode_index"])
    print(f"rank 0 worker 0, batch {i}: {len(b['index'])} frames from {len(episodes)} episode(s)")
    if i == 2:
        break
print(f"every rank yields {plan.samples_per_rank:,} samples per epoch")
