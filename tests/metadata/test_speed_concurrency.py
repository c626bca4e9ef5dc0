"""Speed file under real concurrency: 8 writer processes, and a 2-rank torch.distributed job."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from episodekit.core import atomic
from episodekit.core.dataset import open_dataset
from episodekit.metadata.speed import SPEED_FILE, compute_speed_rows, read_speed_file

WORKER = textwrap.dedent(
    """
    import json


    def work(root, barrier, rounds, results):
        from episodekit.metadata import speed
        from episodekit.core.dataset import open_dataset

        try:
            ds = open_dataset(root)
            expected = speed.compute_speed_rows(ds)
            barrier.wait(timeout=120)
            out = speed.load_or_compute(ds)
            for _ in range(rounds):
                speed.write_speed_file(ds, speed.compute_speed_rows(ds))
                seen = speed.read_speed_file(root)  # raises on a half-written file
                if seen != expected:
                    raise AssertionError(f"read {seen!r}")
            results.put(json.dumps(out))
        except BaseException as exc:
            results.put(f"ERROR {exc!r}")
            raise
    """
)


def test_eight_processes_leave_one_valid_file(make_sample, tmp_path, monkeypatch):
    root = make_sample(episodes=120, tasks=6, seed=5)
    (tmp_path / "speed_worker.py").write_text(WORKER)
    monkeypatch.syspath_prepend(str(tmp_path))  # spawned children inherit sys.path
    import speed_worker

    ctx = mp.get_context("spawn")
    n = 8
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [
        ctx.Process(target=speed_worker.work, args=(str(root), barrier, 15, results))
        for _ in range(n)
    ]
    for p in procs:
        p.start()
    outs = [results.get(timeout=180) for _ in range(n)]
    for p in procs:
        p.join(timeout=60)
    assert not [o for o in outs if o.startswith("ERROR")], outs
    assert [p.exitcode for p in procs] == [0] * n
    expected = compute_speed_rows(open_dataset(root))
    assert all(json.loads(o) == expected for o in outs)
    assert read_speed_file(root) == expected
    assert [p.name for p in (root / "meta").iterdir() if atomic.is_temp_name(p.name)] == []


RANK_SCRIPT = textwrap.dedent(
    """
    import datetime, json, sys
    import torch.distributed as dist

    rank, store, root, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    dist.init_process_group(  # a file store: no TCP port another process can take first
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2,
        timeout=datetime.timedelta(seconds=30),
    )
    from episodekit.metadata import speed
    from episodekit.core.dataset import open_dataset

    writes = []
    real_write = speed.atomic_write_text
    def spy(path, text):
        writes.append(str(path))
        return real_write(path, text)
    speed.atomic_write_text = spy

    ds = open_dataset(root)
    real_read = speed.read_speed_file
    speed.read_speed_file = lambda _: None  # both ranks see no file: both compute, may both write
    first = speed.load_or_compute(ds)  # ...but only rank 0 does
    speed.read_speed_file = real_read
    second = speed.load_or_compute(ds)  # read path: the barrier is reached here too
    error = None
    if rank == 1:  # an error on one rank only must not leave rank 0 waiting at the barrier
        def boom(_):
            raise RuntimeError("boom")
        speed.read_speed_file = boom
    try:
        speed.load_or_compute(ds)
    except RuntimeError as exc:
        error = str(exc)
    dist.barrier()
    with open(out, "w") as fh:
        json.dump({"source": speed.rank_info().source, "first": first, "second": second,
                   "writes": writes, "error": error}, fh)
    dist.destroy_process_group()
    """
)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_distributed_only_rank0_writes(make_sample, tmp_path):
    root = make_sample(episodes=60, tasks=4, seed=2)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    store = str(tmp_path / "store")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), store, str(root), str(outs[r])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs
    r0, r1 = (json.loads(Path(o).read_text()) for o in outs)
    assert r0["source"] == r1["source"] == "torch"  # rank came from torch, not the environment
    assert r0["writes"] == [str(root / SPEED_FILE)] and r1["writes"] == []
    expected = compute_speed_rows(open_dataset(root))
    assert r0["first"] == r1["first"] == r0["second"] == r1["second"] == expected
    assert read_speed_file(root) == expected
    assert (r0["error"], r1["error"]) == (None, "boom")
