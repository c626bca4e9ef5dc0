"""Every loader's batches pinned by digest on the LeRobot-written fixtures (rec40, vid24) and a
mixture of two of them (rec40 + edited35): ``FrameDataset[i]`` and ``get_batch`` (parquet and
frame store), ``EpisodeAwareSampler``, ``ShardedLoader``, ``ElasticLoader``, the mixture's three,
and ``make_loader`` in-process. A refactor of the loaders must leave each digest unchanged.

Re-record (only for an intended change, named in the commit):
``EPISODEKIT_RECORD_DIGESTS=1 python -m pytest tests/loaders/test_batch_digests.py``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from episodekit.loaders import (
    ElasticLoader,
    EpisodeAwareSampler,
    FrameDataset,
    ShardedLoader,
    load_canonical_plan,
    load_plan,
)
from episodekit.metadata.mixture.plan import ensure_mixture_plans
from episodekit.metadata.plans.build import ensure_plans
from episodekit.metadata.plans.canonical import ensure_canonical_plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
DIGESTS = Path(__file__).with_name("batch_digests.json")
RECORD = os.environ.get("EPISODEKIT_RECORD_DIGESTS") == "1"
FPS = 30
DELTAS = {"action": [k / FPS for k in range(8)], "observation.state": [-2 / FPS, -1 / FPS, 0.0]}
TOP = "observation.images.top"
VDELTAS = {TOP: [-1 / FPS, 0.0], "action": [0.0, 1 / FPS]}
_recorded: dict[str, str] = {}


def _feed(h, value, root: str) -> None:
    """Feed one value (arrays by dtype, shape and bytes; video paths relative to the root)."""
    if hasattr(value, "numpy") and not isinstance(value, np.ndarray):  # a torch tensor
        value = value.numpy()
    if isinstance(value, dict):
        for key in sorted(value):
            h.update(f"<{key}>".encode())
            _feed(h, value[key], root)
    elif isinstance(value, np.ndarray) and value.dtype != object:
        h.update(f"{value.dtype.str}{value.shape}".encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (list, tuple, np.ndarray)):
        h.update(f"[{len(value)}".encode())
        for v in value:
            _feed(h, v, root)
        h.update(b"]")
    elif isinstance(value, str):
        h.update(repr(os.path.relpath(value, root) if value.startswith(root) else value).encode())
    else:
        h.update(f"{type(value).__name__}:{value!r}".encode())


def digest(items, root) -> str:
    h = hashlib.sha256()
    n = 0
    for item in items:
        _feed(h, item, str(root))
        n += 1
    return f"{n}:{h.hexdigest()[:32]}"


def check(name: str, items, root) -> None:
    got = digest(items, root)
    if RECORD:
        _recorded[name] = got
        want = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
        DIGESTS.write_text(json.dumps({**want, **_recorded}, indent=1, sort_keys=True) + "\n")
        return
    want = json.loads(DIGESTS.read_text())
    assert got == want[name], f"{name}: batches changed"


def copy_fixture(name: str, dst: Path) -> Path:
    out = dst / name
    shutil.copytree(FIXTURES / name, out)
    return out


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("digests")
    rec = copy_fixture("rec40", base)
    ensure_plans(str(rec), [1, 2], 2, locality="rowgroup")
    ensure_canonical_plan(str(rec), 8, locality="rowgroup")
    vid = copy_fixture("vid24", base)
    ensure_plans(str(vid), [1], 2, locality="rowgroup")
    ed = copy_fixture("edited35", base)
    spec = {"sources": [{"root": str(rec), "weight": 1}, {"root": str(ed), "weight": 2}]}
    ensure_mixture_plans(spec, base / "mix", [2], 2, locality="rowgroup")
    return {"rec40": rec, "vid24": vid, "mix": base / "mix", "base": base}


def _batches(ds, idx, bs):
    return [ds.get_batch(idx[i : i + bs]) for i in range(0, len(idx), bs)]


def test_frame_dataset_and_sampler_rec40(roots):
    root = roots["rec40"]
    ds = FrameDataset(root, delta_timestamps=DELTAS)
    n = len(ds)
    check("rec40.items", (ds[i] for i in [0, 1, 5, 299, 300, n // 2, n - 1, -1]), root)
    sampler = EpisodeAwareSampler(ds, seed=3)
    idx = sampler.epoch_indices(1)
    check("rec40.sampler_indices", [idx], root)
    check("rec40.get_batch", _batches(ds, idx, 500), root)
    plan = load_plan(str(root), 2, 2)
    ranked = EpisodeAwareSampler(ds, seed=1, plan=plan, rank=1, world_size=2)
    check("rec40.sampler_plan_rank1", [ranked.epoch_indices(0)], root)
    some = FrameDataset(root, episodes=[3, 7, 8, 20], delta_timestamps=DELTAS, speed=False)
    check("rec40.episodes_get_batch", _batches(some, np.arange(len(some))[::-1], 97), root)
    check("rec40.get_frames", [some.get_frames(some.locate([200, 31, 0])[1])], root)


def test_frame_store_rec40(roots):
    from episodekit.prep.frames import build_frame_store

    root = roots["rec40"]
    store = roots["base"] / "rec40-store"
    build_frame_store(root, store=store)
    ds = FrameDataset(root, delta_timestamps=DELTAS, store=store)
    assert ds.store is not None
    n = len(ds)
    check("rec40.items", (ds[i] for i in [0, 1, 5, 299, 300, n // 2, n - 1, -1]), root)
    idx = EpisodeAwareSampler(ds, seed=3).epoch_indices(1)
    check("rec40.get_batch", _batches(ds, idx, 500), root)
    plan = load_canonical_plan(str(root))
    loader = ElasticLoader(root, plan, 1, 2, micro_batch=4, seed=2, delta_timestamps=DELTAS,
                           store=store)  # fmt: skip
    check("rec40.elastic_rank1", list(loader), root)


def test_sharded_and_elastic_rec40(roots):
    root = roots["rec40"]
    plan = load_plan(str(root), 2, 2)
    for rank in (0, 1):
        for w in (0, 1):
            loader = ShardedLoader(root, plan, rank, 2, w, 2, 64, seed=5, delta_timestamps=DELTAS)
            loader.set_epoch(1)
            check(f"rec40.sharded_r{rank}w{w}", list(loader), root)
    samples = ShardedLoader(root, plan, 0, 2, seed=5, cache_mb=0.5)
    check("rec40.sharded_samples_small_cache", [s for _, s in zip(range(700), samples)], root)
    canon = load_canonical_plan(str(root))
    for rank in (0, 1):
        loader = ElasticLoader(root, canon, rank, 2, micro_batch=4, seed=2, delta_timestamps=DELTAS)
        check(f"rec40.elastic_r{rank}", list(loader), root)
    loader = ElasticLoader(root, canon, 0, 3, micro_batch=3, seed=2, worker=1, num_workers=2)
    check("rec40.elastic_w3_worker1", list(loader), root)


def test_vid24_decoded_and_paths(roots):
    pytest.importorskip("av")
    root = roots["vid24"]
    ds = FrameDataset(root, delta_timestamps=VDELTAS, video_backend="pyav")
    check("vid24.items_pyav", (ds[i] for i in [0, 7, 100, len(ds) - 1]), root)
    check("vid24.get_batch_pyav", [ds.get_batch([5, 900, 901, 2000])], root)
    paths = FrameDataset(root, delta_timestamps=VDELTAS, video_backend=None)
    check("vid24.items_paths", (paths[i] for i in [0, 7, 100, len(paths) - 1]), root)
    check("vid24.get_batch_paths", [paths.get_batch(np.arange(0, len(paths), 11))], root)
    plan = load_plan(str(root), 1, 2)
    loader = ShardedLoader(root, plan, 0, 1, 1, 2, 32, delta_timestamps=VDELTAS,
                           video_backend="pyav")  # fmt: skip
    check("vid24.sharded_w1_pyav", [b for _, b in zip(range(5), loader)], root)
    loader = ShardedLoader(root, plan, 0, 1, 0, 2, 64, video_backend=None)
    check("vid24.sharded_w0_paths", list(loader), root)


def test_mixture_rec40_edited35(roots):
    mix = roots["mix"]
    plan = load_plan(str(mix), 2, 2)
    ds = FrameDataset(plan, delta_timestamps=DELTAS)
    n = len(ds)
    check("mix.items", (ds[i] for i in [0, 3, n // 2, n - 1]), mix)
    sampler = EpisodeAwareSampler(ds, seed=4, plan=plan, rank=1, world_size=2)
    idx = sampler.epoch_indices(2)
    check("mix.sampler_rank1", [idx], mix)
    check("mix.get_batch", _batches(ds, idx, 400), mix)
    for w in (0, 1):
        loader = ShardedLoader(str(mix), plan, 0, 2, w, 2, 128, seed=6, delta_timestamps=DELTAS)
        check(f"mix.loader_r0w{w}", list(loader), mix)
    loader = ShardedLoader(str(mix), plan, 1, 2, seed=6)
    check("mix.loader_r1_samples", [s for _, s in zip(range(300), loader)], mix)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_make_loader_in_process(roots):
    from episodekit.loaders.torch import make_loader

    root = roots["rec40"]
    plan = load_plan(str(root), 2, 2)
    for access in ("random", "stream"):
        with make_loader(root, plan, 100, 0, access=access, rank=1, world_size=2, seed=7,
                         copy=True, delta_timestamps=DELTAS) as loader:  # fmt: skip
            check(f"rec40.make_loader_{access}", list(loader), root)
    with make_loader(root, None, 100, 0, access="elastic", rank=0, world_size=2, seed=7,
                     copy=True, micro_batch=2) as loader:  # fmt: skip
        check("rec40.make_loader_elastic", list(loader), root)
    mix = roots["mix"]
    mplan = load_plan(str(mix), 2, 2)
    with make_loader(str(mix), mplan, 64, 0, access="random", rank=0, world_size=2,
                     copy=True) as loader:  # fmt: skip
        check("mix.make_loader_random", list(loader), mix)
    with make_loader(str(mix), mplan, 64, 0, rank=0, world_size=2, copy=True) as loader:
        check("mix.make_loader_stream", list(loader), mix)
