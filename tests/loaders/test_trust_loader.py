"""Loader arguments validated up front, with clear errors: finite deltas, integer indices only
(numpy integer arrays fine), seed >= 0, a non-empty episode selection; sampler states carry
their identity (plan digest, rank, world size, seed) and are refused elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from episodekit.loaders import EpisodeAwareSampler, FrameDataset, load_plan
from episodekit.metadata.plans.build import ensure_plans

SPEC = dict(episodes=12, tasks=2, seed=31, mean_length=30)


@pytest.fixture
def root(make_sample):
    return make_sample(copy=False, **SPEC)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_delta_refused(root, bad):
    with pytest.raises(ValueError, match="not finite"):
        FrameDataset(str(root), delta_timestamps={"action": [0.0, bad]}, speed=False)


def test_non_numeric_delta_refused(root):
    with pytest.raises(ValueError, match="must be numbers"):
        FrameDataset(str(root), delta_timestamps={"action": ["a"]}, speed=False)


def test_integer_indices_only(root):
    ds = FrameDataset(str(root), speed=False)
    with pytest.raises(TypeError):
        ds[1.5]
    for bad in ([1.7, 2.2], np.array([1.0]), [True, False]):
        with pytest.raises(TypeError, match="must be integers"):
            ds.get_batch(bad)
    with pytest.raises(TypeError, match="must be integers"):
        ds.get_frames([0.5])
    a = ds.get_batch(np.array([1, 2], dtype=np.int32))
    b = ds.get_batch([1, 2])
    np.testing.assert_array_equal(a["index"], b["index"])
    assert len(ds.get_batch([])["index"]) == 0


def test_empty_or_float_episode_selection(root):
    with pytest.raises(ValueError, match="episodes is empty"):
        FrameDataset(str(root), episodes=[], speed=False)
    with pytest.raises(TypeError, match="episodes must be integers"):
        FrameDataset(str(root), episodes=[0.5], speed=False)


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True])
def test_bad_seed_refused_at_construction(root, seed):
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        EpisodeAwareSampler(str(root), seed=seed, rank=0, world_size=1)


def test_states_carry_identity(make_sample):
    root = make_sample(**SPEC)
    ensure_plans(str(root), [2], 1)
    plan = load_plan(str(root), 2, 1)
    r0 = EpisodeAwareSampler(str(root), seed=3, plan=plan, rank=0, world_size=2)
    it = iter(r0)
    [next(it) for _ in range(5)]
    state = r0.state_dict()
    same = EpisodeAwareSampler(str(root), seed=3, plan=plan, rank=0, world_size=2)
    same.load_state_dict(state)
    assert same.position == 5
    other_rank = EpisodeAwareSampler(str(root), seed=3, plan=plan, rank=1, world_size=2)
    if other_rank.num_samples == r0.num_samples:
        with pytest.raises(ValueError, match="another .*rank"):
            other_rank.load_state_dict(state)
    other_seed = EpisodeAwareSampler(str(root), seed=4, plan=plan, rank=0, world_size=2)
    with pytest.raises(ValueError, match="seed 3"):
        other_seed.load_state_dict(state)
    edited = load_plan(str(root), 2, 1)
    edited.items = edited.items.copy()
    edited.items[[0, -1], 0] = edited.items[[-1, 0], 0]  # another assignment, same sizes
    other_plan = EpisodeAwareSampler(str(root), seed=3, plan=edited, rank=0, world_size=2)
    if other_plan.num_samples == r0.num_samples:
        with pytest.raises(ValueError, match="another .*plan"):
            other_plan.load_state_dict(state)
    with pytest.raises(ValueError, match="not a sampler state"):
        same.load_state_dict({})
