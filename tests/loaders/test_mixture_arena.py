"""A mixture's sources' pools side by side in one array per column (loaders/arena.py): batches
gathered once through the arena equal batches gathered per source and scattered; regions grow
without losing resident rows; columns that cannot be shared stay private."""

from __future__ import annotations

import numpy as np
import pytest

from episodekit.loaders import ShardedLoader, load_plan
from episodekit.loaders.arena import PoolArena
from episodekit.loaders.reader import PoolRows
from episodekit.metadata.mixture.plan import ensure_mixture_plans
from episodekit.sample import write_sample

F32 = np.dtype("float32")


class FakeReader:
    """What the arena touches of a RowGroupReader."""

    def __init__(self) -> None:
        self.pool: dict = {}
        self.pool_base: dict = {}
        self.arena = None


def test_regions_grow_and_keep_resident_rows():
    arena = PoolArena({0: {"a": "x"}, 1: {"b": "x"}}, {"x": F32})
    r0, r1 = FakeReader(), FakeReader()
    arena.register(0, r0, 4)
    arena.register(1, r1, 4)
    r0.pool, r0.pool_base = arena.allocate(r0, {"a": ((2,), F32)}, 4)
    r1.pool, r1.pool_base = arena.allocate(r1, {"b": ((2,), F32)}, 4)
    assert r0.pool_base["a"][0] is r1.pool_base["b"][0]  # one array for both sources
    r0.pool["a"][:] = np.arange(8, dtype=F32).reshape(4, 2)
    r1.pool["b"][:] = -np.arange(8, dtype=F32).reshape(4, 2)
    big, off = r1.pool_base["b"]
    np.testing.assert_array_equal(np.take(big, np.arange(off, off + 4), axis=0), r1.pool["b"])
    # source 0 needs a larger region: the layout changes, source 1's rows move with it
    before = r1.pool["b"].copy()
    r0.pool, r0.pool_base = arena.allocate(r0, {"a": ((2,), F32)}, 10)
    assert arena.relayouts == 1 and len(r0.pool["a"]) == 10
    np.testing.assert_array_equal(r1.pool["b"], before)
    big, off = r1.pool_base["b"]
    assert big is arena.arrays["x"] and off == 10
    np.testing.assert_array_equal(big[off : off + 4], before)
    r0.pool["a"][:] = 7  # writing one region never touches the other
    np.testing.assert_array_equal(r1.pool["b"], before)


def test_another_dtype_or_shape_stays_private():
    arena = PoolArena({0: {"a": "x"}, 1: {"b": "x"}}, {"x": F32})
    r0, r1, r2 = FakeReader(), FakeReader(), FakeReader()
    for s, r in enumerate((r0, r1)):
        arena.register(s, r, 3)
    pool, base = arena.allocate(r0, {"a": ((2,), np.dtype("float64"))}, 3)
    assert base == {} and pool["a"].dtype == np.float64  # the batch is float32: not shared
    pool, base = arena.allocate(r1, {"b": ((2,), F32)}, 3)
    assert "b" in base
    arena.register(2, r2, 3)
    arena.columns[2] = {"c": "x"}
    pool, base = arena.allocate(r2, {"c": ((3,), F32)}, 3)  # another row shape
    assert base == {} and pool["c"].shape == (3, 3)
    with pytest.raises(ValueError, match="not registered"):
        arena.allocate(FakeReader(), {"a": ((2,), F32)}, 3)


def test_pool_rows_values():
    base = np.arange(12, dtype=F32).reshape(6, 2)
    np.testing.assert_array_equal(PoolRows(base, np.array([[5, 0]])).values(), base[[[5, 0]]])


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("arena")
    kw = dict(style="edited", data_files_size_in_mb=0.05, tasks=2)
    a = write_sample(base / "a", episodes=40, seed=1, mean_length=30, **kw)
    b = write_sample(base / "b", episodes=25, seed=2, mean_length=25, **kw)
    c = write_sample(base / "c", episodes=20, seed=3, mean_length=20, state_dim=6, action_dim=6,
                     **kw)  # fmt: skip
    return a, b, c


def _batches(plan, worker: int, arena: bool, **kw):
    ld = ShardedLoader(None, plan, rank=0, world_size=plan.world_size, worker=worker, **kw)
    for fd in ld.sources:
        fd.defer_pool_rows = arena
    return ld, list(ld)


@pytest.mark.parametrize("padded,cache_mb", [(False, 1.0), (True, 1.0), (False, 0.02)])
def test_mixture_batches_equal_with_and_without_the_arena(roots, tmp_path, padded, cache_mb):
    a, b, c = roots
    sources = [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 2}]
    spec = {"sources": sources}
    if padded:  # a source of another width: padded columns are not shared, the rest are
        spec = {
            "sources": sources + [{"root": str(c), "weight": 1}],
            "features": {"observation.state": {"pad_to": 14}, "action": {"pad_to": 14}},
        }
    ensure_mixture_plans(spec, tmp_path / "p", [2], 2, locality="rowgroup")
    plan = load_plan(tmp_path / "p", 2, 2)
    fps = 30
    kw = dict(
        batch_size=37,
        seed=3,
        speed=False,
        cache_mb=cache_mb,  # 0.02: several pools per source and epoch
        delta_timestamps={
            "action": [k / fps for k in range(5)],
            "observation.state": [-1 / fps, 0],
        },
    )
    for worker in range(2):
        ld, got = _batches(plan, worker, True, **kw)
        _, ref = _batches(plan, worker, False, **kw)
        assert len(got) == len(ref) and sum(len(x["index"]) for x in got) == len(ld)
        for x, y in zip(got, ref):
            assert x.keys() == y.keys()
            for key in x:
                if isinstance(x[key], np.ndarray):
                    assert x[key].dtype == y[key].dtype, key
                    np.testing.assert_array_equal(x[key], y[key], err_msg=key)
                else:
                    assert x[key] == y[key], key
        if cache_mb >= 1:  # one pool per source: every batch is gathered through the arena
            assert ld.shared_chunks == ld.chunks_read > 0
        shared = set(ld.arena.arrays)
        assert "index" in shared and ("action" in shared) == (not padded)
        assert ld.sources[0].reader.pool_base  # the sources' pools are arena regions


def test_pickled_loader_starts_with_an_empty_arena(roots, tmp_path):
    """DataLoader workers get a pickled loader: no arena arrays travel, each process fills its
    own, and the clone yields the same batches."""
    import pickle

    a, b, _ = roots
    spec = {"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 1}]}
    ensure_mixture_plans(spec, tmp_path / "p", [1], 1, locality="rowgroup")
    plan = load_plan(tmp_path / "p", 1, 1)
    ld = ShardedLoader(None, plan, rank=0, world_size=1, batch_size=64, speed=False)
    it = iter(ld)
    first = next(it)
    assert ld.arena.arrays
    blob = pickle.dumps(ld)
    assert len(blob) < sum(x.nbytes for x in ld.arena.arrays.values())
    clone = pickle.loads(blob)
    assert clone.arena.arrays == {} and clone.arena.readers[0] is clone.sources[0].reader
    clone.seek(0, 0)
    again = next(iter(clone))
    for key in ("index", "observation.state", "action"):
        np.testing.assert_array_equal(again[key], first[key])
    assert clone.shared_chunks >= 1


@pytest.mark.parametrize("cache_mb", [0.05, 1.0])
def test_sources_with_frame_stores_fill_their_pools_from_the_store(
    roots, tmp_path, monkeypatch, cache_mb
):
    """A source with a fresh frame store: its pools are copied from the store (no parquet
    decode, nothing before a range read) and batches equal those decoded from parquet."""
    from episodekit.core.store import CACHE_ENV
    from episodekit.prep.frames import build_frame_store

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    a, b, _ = roots
    for r in (a, b):
        build_frame_store(r)
    spec = {"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 2}]}
    ensure_mixture_plans(spec, tmp_path / "p", [2], 1, locality="rowgroup")
    plan = load_plan(tmp_path / "p", 2, 1)
    kw = dict(
        rank=1, world_size=2, batch_size=29, seed=5, speed=False, cache_mb=cache_mb,
        delta_timestamps={"action": [0.0, 1 / 30, 2 / 30]},
    )  # fmt: skip
    stored = ShardedLoader(None, plan, **kw)
    assert all(f.reader.rows_from is not None for f in stored.sources)
    parquet = ShardedLoader(None, plan, **kw)
    for f in parquet.sources:
        f.reader.rows_from = None
    got, ref = list(stored), list(parquet)
    assert len(got) == len(ref)
    for x, y in zip(got, ref):
        for key in ("index", "action", "action_is_pad", "observation.state", "source_index"):
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    for f in stored.sources:
        assert f.reader.row_groups_read == 0 and f.reader.rows_from_store > 0
    if cache_mb >= 1:  # one pool per source: every chunk is one gather
        assert stored.shared_chunks == stored.chunks_read
