"""Elastic resume through torch: DataLoader workers, StatefulDataLoader, a gloo job resized."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from episodekit.metadata.plans.canonical import ensure_canonical_plan
from episodekit.sample import write_sample

# find_spec, not import: collecting this file must not pay torch's import time
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torch is optional; these tests need it"
    ),
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]
HAS_TORCHDATA = importlib.util.find_spec("torchdata") is not None
C = 24

JOB = textwrap.dedent(
    """
    import datetime, json, sys
    import numpy as np
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from episodekit.loaders import ElasticLoader, load_canonical_plan, merge_states
    from episodekit.loaders.elastic import all_gather_states
    from episodekit.loaders.torch import TorchElasticDataset

    mode, root, store, rank, world, state_file, out, steps = sys.argv[1:9]
    rank, world, steps = int(rank), int(world), int(steps)
    dist.init_process_group(  # a file store: no TCP port another process can take first
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=300),
    )
    plan = load_canonical_plan(root)
    loader = ElasticLoader(root, plan, speed=False, pool_rows=300)  # rank, world: torch.distributed
    ds = TorchElasticDataset(loader)
    if mode == "resume":
        with open(state_file) as fh:
            loader.load_state_dict(json.load(fh))
    frames = []
    for i, batch in enumerate(DataLoader(ds, batch_size=None, num_workers=0)):
        if mode == "stop" and i == steps:
            break
        frames += batch["index"].tolist()
    merged = None
    if mode == "stop":
        merged = merge_states(all_gather_states(ds.state_dict(steps=steps)))
    got = [None] * world
    dist.all_gather_object(got, {"rank": loader.rank, "world": loader.world_size,
                                 "frames": frames, "len": len(loader)})
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"ranks": got, "merged": merged}, fh)
        if merged is not None:
            with open(state_file, "w") as fh:
                json.dump(merged, fh)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = write_sample(
        tmp_path_factory.mktemp("etorch") / "root", episodes=30, seed=9, mean_length=24
    )
    ensure_canonical_plan(str(r), C, locality="rowgroup", split_long=True)
    return r


def loader(root, rank, world):
    from episodekit.loaders import ElasticLoader, load_canonical_plan

    plan = load_canonical_plan(str(root))
    return ElasticLoader(root, plan, rank=rank, world_size=world, speed=False, pool_rows=300)


def epoch_frames(root) -> np.ndarray:
    return np.sort(np.concatenate([b["index"] for b in loader(root, 0, 1)]))


def run_job(script, root, mode, world, state_file, out, steps=0):
    store = out.with_suffix(".store")  # fresh per job: torch's file store is single-use
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), mode, str(root), str(store), str(r), str(world)]
            + [str(state_file), str(out), str(steps)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            errors.append(err[-3000:])
    assert not errors, errors
    return json.loads(out.read_text())


def test_gloo_job_stops_on_2_and_resumes_on_1_and_3(root, tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    state = tmp_path / "state.json"
    stopped = run_job(script, root, "stop", 2, state, tmp_path / "stop.json", steps=7)
    before = [np.asarray(g["frames"], np.int64) for g in stopped["ranks"]]
    assert [len(b) for b in before] == [7 * C // 2] * 2
    merged = stopped["merged"]
    assert merged["world_size"] is None and merged["frontier"] == 7 * C
    epoch = epoch_frames(root)
    for world in (1, 3):
        resumed = run_job(script, root, "resume", world, state, tmp_path / f"r{world}.json")
        after = [np.asarray(g["frames"], np.int64) for g in resumed["ranks"]]
        assert [g["rank"] for g in resumed["ranks"]] == list(range(world))
        assert len({len(a) for a in after}) == 1  # equal samples per rank
        assert all(len(a) == g["len"] for a, g in zip(after, resumed["ranks"]))
        np.testing.assert_array_equal(np.sort(np.concatenate(before + after)), epoch)


def test_dataloader_workers_take_steps_in_turn_and_resume_resized(root):
    from torch.utils.data import DataLoader

    from episodekit.loaders.torch import TorchElasticDataset

    ref = [b["index"] for b in loader(root, 0, 2)]
    for k in (2, 3):
        got = list(
            DataLoader(TorchElasticDataset(loader(root, 0, 2)), batch_size=None, num_workers=k)
        )
        assert len(got) == len(ref)
        assert all(np.array_equal(g["index"].numpy(), r) for g, r in zip(got, ref))
    # both ranks consume 5 batches through 2 workers each, then 3 ranks with 3 workers resume
    states, before = [], []
    for r in range(2):
        ds = TorchElasticDataset(loader(root, r, 2))
        for i, b in enumerate(DataLoader(ds, batch_size=None, num_workers=2)):
            if i == 5:
                break
            before.append(b["index"].numpy())
        states.append(ds.state_dict(steps=5))
    after = []
    for r in range(3):
        ds = TorchElasticDataset(loader(root, r, 3))
        ds.load_state_dict(states)
        after.append(
            np.concatenate(
                [b["index"].numpy() for b in DataLoader(ds, batch_size=None, num_workers=3)]
            )
        )
    assert len({len(a) for a in after}) == 1
    np.testing.assert_array_equal(np.sort(np.concatenate(before + after)), epoch_frames(root))


@pytest.mark.skipif(not HAS_TORCHDATA, reason="torchdata (StatefulDataLoader) is optional")
def test_stateful_dataloader_same_size_and_resized(root):
    from torchdata.stateful_dataloader import StatefulDataLoader

    from episodekit.loaders import merge_states
    from episodekit.loaders.torch import TorchElasticDataset, elastic_states

    ref = [b["index"] for b in loader(root, 1, 2)]
    sdl = StatefulDataLoader(
        TorchElasticDataset(loader(root, 1, 2)), batch_size=None, num_workers=2
    )
    it = iter(sdl)
    head = [next(it)["index"].numpy() for _ in range(5)]
    sd = sdl.state_dict()
    # its workers stopped before the next loader forks its own: a fork while this loader's
    # queue threads work once left a child blocked on a lock held at the fork (CI hung)
    it._shutdown_workers()
    del it
    # same size: the StatefulDataLoader restores its workers and continues exactly
    again = StatefulDataLoader(
        TorchElasticDataset(loader(root, 1, 2)), batch_size=None, num_workers=2
    )
    again.load_state_dict(sd)
    rest = [b["index"].numpy() for b in again]
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, ref)) and len(head + rest) == len(
        ref
    )
    # resized: the per-worker states of both ranks, merged, resume on 1 rank
    states, before = elastic_states(sd), head
    sdl0 = StatefulDataLoader(
        TorchElasticDataset(loader(root, 0, 2)), batch_size=None, num_workers=2
    )
    it0 = iter(sdl0)
    before += [next(it0)["index"].numpy() for _ in range(3)]
    states += elastic_states(sdl0.state_dict())
    it0._shutdown_workers()
    one = loader(root, 0, 1)
    one.load_state_dict(merge_states(states))
    after = [b["index"] for b in one]
    np.testing.assert_array_equal(np.sort(np.concatenate(before + after)), epoch_frames(root))
