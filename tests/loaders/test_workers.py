"""make_loader: worker processes through a shared-memory ring give the in-process batches, in
order, for 0/1/2 workers (sample, rec40, vid24 decoded), resume exactly, clean up after kill -9,
fail with one clear line (too little /dev/shm, a worker's exception, a dead worker)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from episodekit.metadata.plans.build import ensure_plans
from episodekit.metadata.plans.canonical import ensure_canonical_plan
from episodekit.sample import write_sample

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is optional; these tests need it"
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
FPS = 30
DELTAS = {"action": [k / FPS for k in range(50)], "observation.state": [-2 / FPS, -1 / FPS, 0.0]}
SHM = Path("/dev/shm")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = write_sample(tmp_path_factory.mktemp("wk") / "root", episodes=12, seed=4, mean_length=30)
    ensure_plans(str(r), [1, 2], 2)
    ensure_canonical_plan(str(r), 6, locality="rowgroup")
    return r


def as_numpy(batch):
    return {
        k: as_numpy(v) if isinstance(v, dict) else (v.numpy() if hasattr(v, "numpy") else v)
        for k, v in batch.items()
    }


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert sorted(g) == sorted(w)
        for k in w:
            if isinstance(w[k], dict):
                assert_same([g[k]], [w[k]])
            elif isinstance(w[k], np.ndarray) and w[k].dtype != object:
                assert g[k].dtype == w[k].dtype, k
                np.testing.assert_array_equal(g[k], w[k], err_msg=k)
            else:
                assert list(g[k]) == list(w[k]), k


def random_ref(root, bs, seed=0, epoch=0, **kw):
    from episodekit.loaders import EpisodeAwareSampler, FrameDataset

    ds = FrameDataset(root, **kw)
    idx = EpisodeAwareSampler(ds, seed=seed).epoch_indices(epoch)
    return [ds.get_batch(idx[i : i + bs]) for i in range(0, len(idx), bs)]


def stream_ref(root, plan, bs, rank=0, world=1, epoch=0, **kw):
    """The rank's bins round-robin, as DataLoader workers over TorchShardedDataset give them."""
    from episodekit.loaders import ShardedLoader

    bins = []
    for w in range(plan.num_workers):
        loader = ShardedLoader(root, plan, rank, world, w, plan.num_workers, bs, **kw)
        loader.set_epoch(epoch)
        bins.append(list(loader))
    return [b[j] for j in range(len(bins[0])) for b in bins]


def collect(loader, stop=None):
    out = []
    for i, b in enumerate(loader):
        out.append(as_numpy(b))
        if stop is not None and i + 1 == stop:
            break
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return "\nState:\tZ" not in fh.read()
    except FileNotFoundError:
        return False


def loader_children():
    import multiprocessing as mp

    return [p for p in mp.active_children() if p.name.startswith("episodekit-loader")]


def test_importing_the_loaders_does_not_import_torch():
    code = (
        "import sys, episodekit.loaders, episodekit.loaders.workers, episodekit.loaders.ring, "
        "episodekit.loaders.sources; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_random_access_same_batches_in_order_and_resume(root, workers):
    from episodekit.loaders.torch import make_loader

    want = random_ref(root, 32, delta_timestamps=DELTAS)
    kw = dict(access="random", delta_timestamps=DELTAS, copy=True)
    with make_loader(root, None, 32, workers, **kw) as loader:
        assert len(loader) == len(want)
        assert_same(collect(loader), want)
        # epoch 1, stopped after 3 batches: its state gives exactly the remaining ones
        loader.set_epoch(1)
        want = random_ref(root, 32, epoch=1, delta_timestamps=DELTAS)
        assert_same(collect(loader, 3), want[:3])
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (1, 3 * 32)
        loader.load_state_dict(state)
        assert_same(collect(loader), want[3:])
        if workers:
            assert loader.pool.ring.name.startswith(f"ekring_{os.getpid()}_r0_")
    fresh = make_loader(root, None, 32, 0, **kw)
    fresh.load_state_dict(state)
    assert_same(collect(fresh), want[3:])


@pytest.mark.parametrize("prefetch", [1, 3])
def test_slots_go_back_without_a_message_and_a_restart_frees_them(root, prefetch):
    """The training process sends a worker nothing per batch (slots go back through shared
    memory); iterating again mid-epoch (a new start while every slot is full) and a new epoch
    still give the in-process batches."""
    from episodekit.loaders.torch import make_loader

    want = random_ref(root, 8, delta_timestamps=DELTAS)
    kw = dict(access="random", delta_timestamps=DELTAS, copy=True, prefetch=prefetch)
    with make_loader(root, None, 8, 2, **kw) as loader:
        it = iter(loader)
        got = [as_numpy(next(it))]  # the ring exists from here on
        sent = []
        for c in loader.pool.res.conns:
            c.send = lambda msg, _send=c.send: (sent.append(msg[0]), _send(msg))[1]
        got += [as_numpy(next(it)) for _ in range(2 * prefetch + 3)]
        assert sent == [], sent
        assert_same(got, want[: len(got)])
        time.sleep(0.5)  # every worker fills all its slots and waits
        assert_same(collect(loader), want[len(got) :])  # iterated again: a new start
        assert sent == ["start", "start"], sent
        assert_same(collect(loader), random_ref(root, 8, epoch=1, delta_timestamps=DELTAS))


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_stream_same_batches_in_order_and_resume(root, workers):
    from episodekit.loaders import load_plan
    from episodekit.loaders.torch import make_loader

    plan = load_plan(str(root), 2, 2)  # rank 1 of 2: the ring is this rank's
    want = stream_ref(root, plan, 16, rank=1, world=2, delta_timestamps=DELTAS)
    kw = dict(rank=1, world_size=2, delta_timestamps=DELTAS, copy=True)
    with make_loader(root, plan, 16, workers, **kw) as loader:
        assert_same(collect(loader), want)
        want = stream_ref(root, plan, 16, rank=1, world=2, epoch=1, delta_timestamps=DELTAS)
        assert_same(collect(loader, 5), want[:5])  # the next epoch
        state = loader.state_dict()
        assert (state["epoch"], state["batches"]) == (1, 5)
        if workers:
            assert "_r1_" in loader.pool.ring.name
    with make_loader(root, plan, 16, 2 - workers // 2, **kw) as other:
        other.load_state_dict(state)
        assert_same(collect(other), want[5:])
        with pytest.raises(ValueError, match="another seed"):
            make_loader(root, plan, 16, 0, **{**kw, "seed": 3}).load_state_dict(state)


def test_elastic_steps_same_as_elastic_loader_and_resume(root):
    from episodekit.loaders import ElasticLoader, load_canonical_plan
    from episodekit.loaders.torch import make_loader

    plan = load_canonical_plan(str(root))
    kw = dict(rank=0, world_size=2, micro_batch=2, speed=False)
    want = [dict(b) for b in ElasticLoader(root, plan, **kw)]
    with make_loader(root, plan, num_workers=2, copy=True, **kw) as loader:
        assert_same(collect(loader, 4), want[:4])
        state = loader.state_dict()
        rest = make_loader(root, plan, num_workers=0, **kw)
        rest.load_state_dict(state)
        assert_same(collect(rest), want[4:])
        loader.load_state_dict(state)
        assert_same(collect(loader), want[4:])


def lerobot_copy(name, tmp_path):
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    ensure_plans(str(dst), [1], 2)
    return dst


def test_rec40_random_and_stream_same_as_in_process(tmp_path):
    from episodekit.loaders import load_plan
    from episodekit.loaders.torch import make_loader

    root = lerobot_copy("rec40", tmp_path)
    want = random_ref(root, 256, delta_timestamps=DELTAS)
    with make_loader(root, None, 256, 2, access="random", delta_timestamps=DELTAS) as loader:
        for i, b in enumerate(loader):
            assert_same([as_numpy(b)], [want[i]])  # views of the slot: compared before the next
    assert i + 1 == len(want)
    plan = load_plan(str(root), 1, 2)
    want = stream_ref(root, plan, 256, delta_timestamps=DELTAS)
    with make_loader(root, plan, 256, 2, delta_timestamps=DELTAS) as loader:
        for i, b in enumerate(loader):
            assert_same([as_numpy(b)], [want[i]])  # compared while the slot is ours
    assert i + 1 == len(want)


def test_vid24_decoded_frames_pixel_equal(tmp_path):
    pytest.importorskip("av")
    from episodekit.loaders import load_plan
    from episodekit.loaders.torch import make_loader

    root = lerobot_copy("vid24", tmp_path)
    top = "observation.images.top"
    kw = dict(delta_timestamps={top: [-1 / FPS, 0.0], "action": [k / FPS for k in range(10)]})
    plan = load_plan(str(root), 1, 2)
    want = stream_ref(root, plan, 64, video_backend="pyav", **kw)[:6]
    with make_loader(root, plan, 64, 2, video_backend="pyav", copy=True, **kw) as loader:
        got = collect(loader, 6)
    assert got[0][top].dtype == np.uint8 and got[0][top].ndim == 5
    assert_same(got, want)


KILLED = textwrap.dedent(
    """
    import json, sys, time
    from episodekit.loaders.sources import LoaderRun, RandomBatches
    from episodekit.loaders.workers import BatchLoader

    if __name__ == "__main__":  # (numpy only: make_loader is this plus torch tensors)
        source = RandomBatches(sys.argv[1], LoaderRun(batch_size=16), {}, {})
        loader = BatchLoader(source, num_workers=2)
        it = iter(loader)
        next(it), next(it)
        print(json.dumps({"pids": loader.pool.pids, "ring": loader.pool.ring.name}), flush=True)
        time.sleep(120)
    """
)


def start_killed(root, tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True
    )
    info = json.loads(proc.stdout.readline())
    assert (SHM / info["ring"]).exists()
    return proc, info


@pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm (Linux)")
def test_kill_9_of_the_parent_leaves_no_process_and_no_segment(root, tmp_path):
    from episodekit.loaders.ring import remove_stale_segments

    proc, info = start_killed(root, tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while any(alive(p) for p in info["pids"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in info["pids"]), "workers outlived their parent"
    remove_stale_segments()  # what the next start does
    assert not (SHM / info["ring"]).exists()

    # everyone killed at once (no worker left to clean up): the next start removes the segment
    proc, info = start_killed(root, tmp_path)
    for pid in [proc.pid, *info["pids"]]:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    assert (SHM / info["ring"]).exists()
    assert info["ring"] in remove_stale_segments()
    assert not (SHM / info["ring"]).exists()


def test_too_little_shared_memory_is_one_clear_line(root, monkeypatch):
    from episodekit.loaders import ring as ring_mod
    from episodekit.loaders.ring import SharedMemoryError
    from episodekit.loaders.torch import make_loader

    loader = make_loader(root, None, 32, 1, access="random", ring_mb=0.001)
    with pytest.raises(SharedMemoryError, match="ring_mb=0.001") as exc:
        next(iter(loader))
    assert "\n" not in str(exc.value) and loader.pool is None  # workers stopped
    loader.close()

    class Tiny:
        f_bavail, f_frsize = 1, 4096  # 4 KiB free

    monkeypatch.setattr(ring_mod.os, "statvfs", lambda path: Tiny())
    loader = make_loader(root, None, 32, 1, access="random")
    with pytest.raises(SharedMemoryError, match=r"/dev/shm has 0.0 MiB free.*shm-size") as exc:
        next(iter(loader))
    assert "\n" not in str(exc.value)
    loader.close()


SLOW_S = 30.0


def _slow_to_open_source(root, ticket):
    from episodekit.loaders.sources import LoaderRun, RandomBatches

    global SlowToOpen

    class SlowToOpen(RandomBatches):
        """The first worker process to open it takes SLOW_S to start (a late spawn, a worker
        descheduled on a loaded machine)."""

        def open(self):
            if os.getpid() != self.parent:
                try:
                    os.close(os.open(self.ticket, os.O_CREAT | os.O_EXCL))
                    time.sleep(SLOW_S)
                except FileExistsError:
                    pass
            super().open()

    SlowToOpen.__qualname__ = "SlowToOpen"  # (pickled by name: fork's children have it)
    source = SlowToOpen(root, LoaderRun(batch_size=8), {"delta_timestamps": DELTAS}, {})
    source.parent, source.ticket = os.getpid(), ticket
    return source


@pytest.mark.skipif(sys.platform != "linux", reason="fork only (test-made class)")
def test_random_access_is_shared_out_a_late_worker_holds_nothing_up(root, tmp_path):
    """Issue 49: random-access batches go to whichever worker is free (same batches, same
    order); before, every other batch waited for the late worker (SLOW_S)."""
    from episodekit.loaders.workers import BatchLoader

    want = random_ref(root, 8, delta_timestamps=DELTAS)
    source = _slow_to_open_source(root, str(tmp_path / "ticket"))
    t0 = time.monotonic()
    loader = BatchLoader(source, num_workers=2, start_method="fork")
    try:
        got = [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
               for b in loader]  # fmt: skip
        took = time.monotonic() - t0
    finally:
        loader.close()
    assert_same(got, want)
    assert took < SLOW_S / 2, took


def test_worker_exception_surfaces_with_its_message_and_close_twice(root, tmp_path):
    from episodekit.loaders.torch import make_loader
    from episodekit.loaders.workers import WorkerError

    broken = tmp_path / "broken"
    shutil.copytree(root, broken)
    loader = make_loader(broken, None, 32, 2, access="random")  # opened here, fine
    for f in (broken / "data").rglob("*.parquet"):
        f.write_bytes(b"not parquet at all")  # the workers open their own readers: they fail
    with pytest.raises(WorkerError, match=r"loader worker \d failed on starting the epoch: \w+"):
        next(iter(loader))
    assert loader.pool is None and not loader_children()  # stopped on the error
    loader.close()
    loader.close()
    with pytest.raises(ValueError, match="closed"):
        next(iter(loader))


def test_a_worker_that_dies_is_reported(root):
    from episodekit.loaders.torch import make_loader
    from episodekit.loaders.workers import WorkerError

    with make_loader(root, None, 8, 2, access="random") as loader:
        it = iter(loader)
        next(it)
        pids = loader.pool.pids
        os.kill(pids[1], signal.SIGKILL)
        # the kill lands when the kernel next runs it: under load the other worker could make
        # every remaining batch first, and a worker dying after the epoch is said by the next
        deadline = time.monotonic() + 30
        while alive(pids[1]) and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(WorkerError, match=r"loader worker 1 \(pid \d+\) died"):
            for _ in range(100):
                next(it)
        assert loader.pool is None and not any(alive(p) for p in pids)


def test_mixture_stream_and_random_same_as_in_process(tmp_path):
    from episodekit.loaders import FrameDataset, load_plan
    from episodekit.loaders.mixture import MixtureSampler
    from episodekit.loaders.torch import make_loader
    from episodekit.metadata.mixture.plan import ensure_mixture_plans

    a = write_sample(tmp_path / "a", episodes=10, tasks=2, seed=1, mean_length=20)
    b = write_sample(
        tmp_path / "b", episodes=6, tasks=2, seed=2, mean_length=20, state_dim=6, action_dim=6
    )
    spec = {
        "sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 3}],
        "features": {"observation.state": {"pad_to": 14}, "action": {"pad_to": 14}},
    }
    ensure_mixture_plans(spec, tmp_path / "plans", [1], 2)
    folder = tmp_path / "plans"
    plan = load_plan(folder, 1, 2)
    kw = dict(delta_timestamps={"action": [0.0, 1 / FPS]}, speed=False)
    want = stream_ref(folder, plan, 16, **kw)
    with make_loader(folder, plan, 16, 2, copy=True, **kw) as loader:
        assert_same(collect(loader), want)
    ds = FrameDataset(folder, **kw)
    idx = MixtureSampler(ds, seed=0, plan=plan, rank=0, world_size=1).epoch_indices(0)
    want = [ds.get_batch(idx[i : i + 16]) for i in range(0, len(idx), 16)]
    with make_loader(folder, None, 16, 2, access="random", copy=True, **kw) as loader:
        assert_same(collect(loader), want)


DIST = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from episodekit.loaders.torch import make_loader

    if __name__ == "__main__":
        dist.init_process_group("gloo")
        with make_loader(sys.argv[1], None, 16, 1, access="random", speed=False) as loader:
            frames = [int(i) for b in loader for i in b["index"]]
            ring = loader.pool.ring.name
        got = [None] * dist.get_world_size()
        dist.all_gather_object(got, {"frames": frames, "ring": ring})
        if dist.get_rank() == 0:
            with open(sys.argv[2], "w") as fh:
                json.dump(got, fh)
        dist.destroy_process_group()
    """
)


def test_two_rank_gloo_job_one_ring_per_rank(root, tmp_path):
    import socket

    from episodekit.loaders import EpisodeAwareSampler, FrameDataset

    script, out = tmp_path / "job.py", tmp_path / "out.json"
    script.write_text(DIST)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.update(RANK=str(rank), WORLD_SIZE="2")
        cmd = [sys.executable, str(script), str(root), str(out)]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
    got = json.loads(out.read_text())
    ds = FrameDataset(root, speed=False)
    for rank, g in enumerate(got):
        assert f"_r{rank}_" in g["ring"]
        idx = EpisodeAwareSampler(ds, seed=0, rank=rank, world_size=2).epoch_indices(0)
        assert g["frames"] == ds.get_batch(idx)["index"].tolist()
    assert not set(got[0]["frames"]) & set(got[1]["frames"])


@pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm (Linux)")
def test_ring_reuses_the_layout_of_same_shaped_batches():
    """A worker makes no layout per batch: the same object while names, dtypes and shapes stay
    (the training process then compares it by identity); a short batch gets its own."""
    from episodekit.loaders.ring import Ring, slot_bytes_for, split_batch

    def arrays(rows, value):
        return split_batch({"x": np.full((rows, 3), value, np.float32), "y": np.arange(rows)})[0]

    ring = Ring.create(slot_bytes_for(arrays(4, 0), 4), 2)
    try:
        first = ring.write(0, arrays(4, 0))
        again = ring.write(1, arrays(4, 1))
        assert again is first
        short = ring.write(0, arrays(2, 2))
        assert short is not first and short[0].shape == (2, 3)
        np.testing.assert_array_equal(ring.read(1, again, {})["x"], np.ones((4, 3)))
        np.testing.assert_array_equal(ring.read(0, short, {})["x"], np.full((2, 3), 2))
    finally:
        ring.close()
