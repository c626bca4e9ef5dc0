"""torch integration: a 2-process torch.distributed (gloo) job, DataLoader workers, collate."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from episodekit.metadata.plans.build import ensure_plans
from episodekit.sample import write_sample

# find_spec, not import: collecting this file must not pay torch's import time
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is optional; these tests need it"
)

SPEC = dict(episodes=24, tasks=2, seed=41, mean_length=30)

DIST_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import torch.distributed as dist
    from episodekit.loaders import EpisodeAwareSampler, ShardedLoader, load_plan

    root, out, store = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group(  # a file store: no TCP port another process can take first
        "gloo", init_method=f"file://{store}",
        rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = load_plan(root, world, 2)
    # rank and world size come from torch.distributed (no arguments)
    loader = ShardedLoader(root, plan, batch_size=16, speed=False)
    frames = np.concatenate([b["index"] for b in loader]).tolist()
    sampler = EpisodeAwareSampler(root, plan=plan, seed=7)
    idx = list(sampler)
    got = [None] * world
    dist.all_gather_object(got, {"rank": loader.rank, "frames": frames, "sampler": idx})
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(got, fh)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = write_sample(tmp_path_factory.mktemp("torch") / "root", **SPEC)
    ensure_plans(str(r), [1, 2], 2)
    return r


def test_two_process_gloo_job_equal_counts_disjoint(root, tmp_path):
    from episodekit.loaders import load_plan

    script = tmp_path / "job.py"
    script.write_text(DIST_SCRIPT)
    out = tmp_path / "out.json"
    store = tmp_path / "store"
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(root), str(out), str(store)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    got = json.loads(out.read_text())
    plan = load_plan(str(root), 2, 2)
    assert [g["rank"] for g in got] == [0, 1]
    for key in ("frames", "sampler"):
        counts = [len(g[key]) for g in got]
        assert counts == [plan.samples_per_rank] * 2
        allv = np.concatenate([g[key] for g in got])
        assert len(np.unique(allv)) == len(allv)  # disjoint across ranks


def test_dataloader_workers_each_read_their_bin(root):
    import torch
    from torch.utils.data import DataLoader

    from episodekit.loaders import ShardedLoader, load_plan
    from episodekit.loaders.torch import TorchShardedDataset

    plan = load_plan(str(root), 1, 2)
    loader = ShardedLoader(root, plan, rank=0, world_size=1, batch_size=20, speed=False)
    tds = TorchShardedDataset(loader)
    dl = DataLoader(tds, batch_size=None, num_workers=2)
    batches = list(dl)
    assert len(batches) == len(tds)
    frames = torch.cat([b["index"] for b in batches]).numpy()
    assert len(frames) == plan.samples_per_rank and len(np.unique(frames)) == len(frames)
    expected = [
        ShardedLoader(root, plan, rank=0, world_size=1, worker=w, speed=False) for w in range(2)
    ]
    for w in range(2):
        np.testing.assert_array_equal(
            np.sort(frames[np.isin(frames, expected[w].epoch_frames(0))]),
            np.sort(expected[w].epoch_frames(0)),
        )
    assert isinstance(batches[0]["action"], torch.Tensor) and batches[0]["action"].shape[1] == 14
    # resume after 3 consumed batches: the rest of the epoch, exactly
    tds2 = TorchShardedDataset(
        ShardedLoader(root, plan, rank=0, world_size=1, batch_size=20, speed=False)
    )
    tds2.load_state_dict({"epoch": 0, "batches": 3})
    rest = list(DataLoader(tds2, batch_size=None, num_workers=2))
    head = torch.cat([b["index"] for b in batches[:3]]).numpy()
    tail = torch.cat([b["index"] for b in rest]).numpy()
    np.testing.assert_array_equal(np.sort(np.concatenate([head, tail])), np.sort(frames))
    np.testing.assert_array_equal(tail, torch.cat([b["index"] for b in batches[3:]]).numpy())


def test_map_style_wrapper_and_collate(root):
    import torch
    from torch.utils.data import DataLoader

    from episodekit.loaders import EpisodeAwareSampler, FrameDataset
    from episodekit.loaders.torch import TorchFrameDataset, collate

    fds = FrameDataset(root, delta_timestamps={"action": [0.0, 1 / 30]}, speed=False)
    tds = TorchFrameDataset(fds)
    sampler = EpisodeAwareSampler(fds, rank=0, world_size=1, seed=2)
    dl = DataLoader(tds, batch_size=32, sampler=sampler, collate_fn=collate)
    first = next(iter(dl))
    want = sampler.epoch_indices(0)[:32]
    np.testing.assert_array_equal(first["index"].numpy(), fds.get_batch(want)["index"])
    assert first["action"].shape == (32, 2, 14) and first["action_is_pad"].dtype == torch.bool
    assert isinstance(first["task"], list) and isinstance(first["task"][0], str)
    # collate of single samples gives the same batch as the vectorized path
    samples = [tds[int(i)] for i in want[:4]]
    stacked = collate([fds[int(i)] for i in want[:4]])
    np.testing.assert_array_equal(stacked["action"].numpy(), first["action"][:4].numpy())
    assert torch.equal(samples[0]["action"], first["action"][0])
