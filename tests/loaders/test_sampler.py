"""EpisodeAwareSampler: a pure function of (seed, epoch), exact resume, drops, plans, ranks."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.loaders import EpisodeAwareSampler, FrameDataset, load_plan
from episodekit.loaders.sampler import coprime_multipliers, feistel_permute
from episodekit.metadata.plans.build import ensure_plans

SPEC = dict(episodes=30, tasks=3, seed=21, mean_length=40)


@pytest.fixture
def root(make_sample):
    return make_sample(copy=False, **SPEC)


def sampler(root, **kw):
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return EpisodeAwareSampler(root, **kw)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 17, 255, 256, 257, 1000, 4099])
def test_feistel_is_a_bijection(n):
    keys = np.array([11, 22, 33, 44], dtype=np.uint64)
    y = feistel_permute(np.arange(n), n, keys)
    np.testing.assert_array_equal(np.sort(y), np.arange(n))
    if n > 16:
        assert (y != np.arange(n)).mean() > 0.5  # and it really moves things


def test_coprime_multipliers():
    sizes = np.array([1, 2, 3, 4, 6, 10, 12, 30, 97, 1000])
    a = coprime_multipliers(np.random.default_rng(0), sizes)
    assert (np.gcd(a, sizes) == 1).all() and (a >= 1).all() and (a < np.maximum(sizes, 2)).all()


def test_epoch_is_a_permutation_and_reshuffles(root):
    n = open_dataset(str(root)).num_frames
    s = sampler(root, seed=5)
    e0, e1 = s.epoch_indices(0), s.epoch_indices(1)
    np.testing.assert_array_equal(np.sort(e0), np.arange(n))
    np.testing.assert_array_equal(np.sort(e1), np.arange(n))
    assert (e0 != e1).mean() > 0.9
    assert (sampler(root, seed=6).epoch_indices(0) != e0).mean() > 0.9
    np.testing.assert_array_equal(sampler(root, seed=5).epoch_indices(0), e0)
    # mixed: a window of 64 consecutive samples touches many episodes
    ep = np.searchsorted(open_dataset(str(root)).column("dataset_from_index"), e0[:64], "right")
    assert len(np.unique(ep)) > 10
    assert list(s) == e0.tolist()
    assert list(s) == e1.tolist()  # a finished epoch advances to the next one
    s.set_epoch(7)
    assert list(s) == s.epoch_indices(7).tolist()


def test_shuffle_false_is_sequential(root):
    s = sampler(root, shuffle=False)
    np.testing.assert_array_equal(s.epoch_indices(3), np.arange(len(s)))


def test_same_order_in_another_process(root):
    here = sampler(root, seed=42).epoch_indices(3)
    code = (
        "import sys, hashlib, numpy as np\n"
        "from episodekit.loaders import EpisodeAwareSampler\n"
        "s = EpisodeAwareSampler(sys.argv[1], seed=42, rank=0, world_size=1)\n"
        "print(hashlib.sha256(s.epoch_indices(3).astype('<i8').tobytes()).hexdigest())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], capture_output=True, text=True, check=True
    )
    import hashlib

    assert out.stdout.strip() == hashlib.sha256(here.astype("<i8").tobytes()).hexdigest()


def test_drop_first_and_last_frames(root):
    ds = open_dataset(str(root))
    s = sampler(root, drop_n_first_frames=3, drop_n_last_frames=2)
    got = np.sort(s.epoch_indices(0))
    starts, lengths = ds.column("dataset_from_index"), ds.column("length")
    want = np.concatenate([np.arange(a + 3, a + n - 2) for a, n in zip(starts, lengths)])
    np.testing.assert_array_equal(got, want)
    assert len(s) == len(want)


def test_resume_exactly_at_many_positions(root):
    full = sampler(root, seed=9)
    epoch0 = list(full)
    epoch1 = list(full)
    n = len(epoch0)
    for pos in sorted({0, 1, 2, 7, 100, n // 3, n // 2, n - 2, n - 1, n}):
        s = sampler(root, seed=9)
        it = iter(s)
        taken = [next(it) for _ in range(pos)]
        assert taken == epoch0[:pos]
        state = s.state_dict()
        assert {k: v for k, v in state.items() if k != "identity"} == {
            "seed": 9,
            "epoch": 0,
            "position": pos,
            "num_samples": n,
        }
        r = sampler(root, seed=9)  # a state is only resumed by the same sampler (seed, plan...)
        r.load_state_dict(state)
        r.set_epoch(0)  # the usual per-epoch call is a no-op when resuming inside that epoch
        if pos < n:
            assert list(r) == epoch0[pos:]
        assert list(r) == epoch1  # then (or, resumed at an epoch's end, at once) the next epoch
    with pytest.raises(ValueError, match="samples per epoch"):
        sampler(root, drop_n_first_frames=1).load_state_dict(state)
    with pytest.raises(ValueError, match="outside"):
        sampler(root).load_state_dict({"epoch": 0, "position": n + 1})


def test_world_size_without_plan_splits_positions(root):
    parts = [sampler(root, seed=1, rank=r, world_size=3).epoch_indices(2) for r in range(3)]
    assert len({len(p) for p in parts}) == 1
    allv = np.concatenate(parts)
    assert len(np.unique(allv)) == len(allv)
    full = sampler(root, seed=1).epoch_indices(2)
    np.testing.assert_array_equal(parts[1], full[1 : 3 * len(parts[1]) : 3])


def test_with_a_real_plan_each_rank_draws_from_its_bins(make_sample):
    root = make_sample(**SPEC)
    ensure_plans(str(root), [4], 2)
    plan = load_plan(str(root), 4, 2)
    ds = open_dataset(str(root))
    starts = ds.column("dataset_from_index")
    seen = []
    for rank in range(4):
        s = EpisodeAwareSampler(root, plan=plan, rank=rank, world_size=4, seed=3)
        idx = s.epoch_indices(0)
        assert len(s) == len(idx) == plan.samples_per_rank
        items = plan.rank_items(rank)
        allowed = np.concatenate([np.arange(starts[e] + a, starts[e] + b) for e, a, b in items])
        assert np.isin(idx, allowed).all()
        assert len(np.unique(idx)) == len(idx)  # trim: no repeats
        seen.append(idx)
        assert (s.epoch_indices(1) != idx).any()
    allv = np.concatenate(seen)
    assert len(np.unique(allv)) == len(allv)  # ranks are disjoint
    with pytest.raises(ValueError, match="world_size=4"):
        EpisodeAwareSampler(root, plan=plan, rank=0, world_size=2)


def test_with_a_wrap_plan_counts_are_equal_and_repeats_stay_in_the_rank(make_sample):
    root = make_sample(**SPEC)
    ensure_plans(str(root), [3], 1, policy="wrap")
    plan = load_plan(str(root), 3, 1)
    assert plan.policy == "wrap" and plan.repeated_frames > 0
    fds = FrameDataset(root, speed=False)
    counts = []
    for rank in range(3):
        s = EpisodeAwareSampler(fds, plan=plan, rank=rank, world_size=3)
        idx = s.epoch_indices(0)
        counts.append(len(idx))
        assert len(np.unique(idx)) == s.natural  # every frame of the rank, some twice
    assert counts == [plan.samples_per_rank] * 3


def test_memory_is_per_item_not_per_frame(root):
    s = sampler(root)
    s.epoch_indices(0)
    arrays = [v for v in vars(s).values() if isinstance(v, np.ndarray)]
    arrays += [v for v in vars(s.draws).values() if isinstance(v, np.ndarray)]
    arrays += [v for v in vars(s.draws._order).values() if isinstance(v, np.ndarray)]
    assert max(a.size for a in arrays) <= SPEC["episodes"] + 1


def test_bad_arguments(root):
    with pytest.raises(ValueError, match="rank 3"):
        EpisodeAwareSampler(root, rank=3, world_size=2)
    with pytest.raises(ValueError, match="seed"):
        EpisodeAwareSampler(root, seed=-1, rank=0, world_size=1)
    s = sampler(root)
    with pytest.raises(IndexError):
        s.indices(0, np.array([len(s)]))
