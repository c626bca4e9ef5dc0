"""The per-episode sketches: the order statistics kept, their weights and stated bound, the
quantiles of any union of episodes within it, and the sidecar's round trip."""

from __future__ import annotations

import numpy as np
import pytest

from episodekit.metadata.stats import QUANTILES
from episodekit.metadata.stats.episode_sketch import (
    EpisodeSketches,
    concat,
    sketch_ranks,
    sketch_weights,
)


def _sketches(values: list[np.ndarray], points: int) -> EpisodeSketches:
    """What the stats pass keeps of each episode's (n, D) values."""
    lengths = np.array([len(v) for v in values])
    ranks, k = sketch_ranks(lengths, points)
    ep = np.repeat(np.arange(len(values)), k)
    cols = [np.sort(v, axis=0) for v in values]
    pts = np.stack([cols[e][r] for e, r in zip(ep.tolist(), ranks.tolist())], axis=1)
    return EpisodeSketches(np.arange(len(values)), lengths, {"x": pts}, points)


def test_ranks_cover_each_episode_up_to_its_last_frame():
    ranks, k = sketch_ranks(np.array([3, 10, 0, 7]), points=4)
    assert k.tolist() == [3, 4, 0, 4]
    # ceil(j n / k) - 1: the whole short episode, evenly spaced order statistics of the others
    assert ranks.tolist() == [0, 1, 2, 2, 4, 7, 9, 1, 3, 5, 6]
    w, err = sketch_weights(np.array([3, 10, 0, 7]), points=4)
    assert w.tolist() == [1, 1, 1, 3, 2, 3, 2, 2, 2, 2, 1]
    assert err.tolist() == [0, 2, 0, 1]  # largest weight - 1 per episode


def test_quantiles_of_any_union_are_within_the_stated_bound():
    rng = np.random.default_rng(36)
    values = [
        rng.standard_normal((int(n), 3)) * s + m
        for n, s, m in zip(
            rng.integers(1, 900, 60), rng.uniform(0.1, 5, 60), rng.uniform(-3, 3, 60)
        )
    ]
    values[5][:, 1] = 2.0  # a constant dimension in one episode
    sk = _sketches(values, points=32)
    for rows in (np.arange(60), np.arange(0, 60, 3), np.array([7])):
        part = sk.select(rows)
        x = np.sort(np.concatenate([values[i] for i in rows]), axis=0)
        n = len(x)
        bound = part.rank_error() * n
        assert bound < n / 32
        q = part.quantiles("x")
        for i, qq in enumerate(QUANTILES):
            h = (n - 1) * qq
            for d in range(3):
                below = np.searchsorted(x[:, d], q[i, d], "left")
                at_most = np.searchsorted(x[:, d], q[i, d], "right")
                assert max(0, below - 1 - h, h - at_most) <= bound / 2 + 1 + 1e-9


def test_an_episode_shorter_than_the_points_is_its_data():
    v = np.arange(10.0)[:, None][::-1]
    sk = _sketches([v], points=256)
    np.testing.assert_array_equal(sk.quantiles("x"), np.quantile(v, QUANTILES, axis=0))
    assert sk.rank_error() == 0


def test_sidecar_table_round_trips():
    rng = np.random.default_rng(1)
    values = [rng.standard_normal((int(n), 2)).astype(np.float32) for n in (5, 300, 1, 40)]
    sk = _sketches(values, points=16)
    back = EpisodeSketches.from_table(sk.table({"x": "float32"}), {"x": 2}, 16)
    np.testing.assert_array_equal(back.points["x"], sk.points["x"])
    np.testing.assert_array_equal(back.length, sk.length)
    # parts concatenated out of order come back sorted by episode
    both = concat([sk.select(np.array([2, 3])), sk.select(np.array([0, 1]))])
    np.testing.assert_array_equal(both.points["x"], sk.points["x"])


def _feature_episodes(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    dtype = [np.float32, np.float64, np.int64, np.uint8, np.int32][seed % 5]
    dims = int(rng.integers(1, 6))
    out = []
    for _ in range(int(rng.integers(1, 12))):
        n = int(rng.choice([1, 2, 3, 20, 20, 20, 50, 300]))
        x = rng.normal(size=(n, dims)) * 3
        if seed % 3 == 0:  # ascending dimensions: kept in place, not sorted
            x = np.sort(x, axis=0)
        if seed % 7 == 0:  # -0.0 beside 0.0: the in-place values' bits
            x[:, 0] = 0.0
            x[::2, 0] = -0.0
        if dtype in (np.float32, np.float64) and seed % 11 == 0:
            x[rng.integers(0, n), 0] = np.nan
        out.append(x.astype(dtype))
    return out


@pytest.mark.parametrize("seed", range(60))
def test_episode_points_are_each_episodes_block_points(seed: int) -> None:
    from episodekit.metadata.stats.blocks import block_stats, episode_points
    from episodekit.metadata.stats.keys import DEFAULT_SKETCH_POINTS

    episodes = _feature_episodes(seed)
    one = np.zeros(1, np.int64)
    want = np.concatenate(
        [
            block_stats([x], one, np.array([len(x)]), DEFAULT_SKETCH_POINTS, None)["points"]
            for x in episodes
        ],
        axis=1,
    )
    got = episode_points(episodes)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()
