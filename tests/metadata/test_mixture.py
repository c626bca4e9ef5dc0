"""Mixture spec and its exact arithmetic (issue 16): weights, balance, quotas, repeat and cap,
per-bin draws; every expected number below was computed by hand."""

from __future__ import annotations

import json
from fractions import Fraction as F

import numpy as np
import pytest

from episodekit.metadata.mixture.spec import (
    MixtureError,
    bin_draws,
    effective_weights,
    epoch_size,
    largest_remainder,
    parse_mixture,
    quotas,
    resolve_sources,
    summarize,
)

W = [F(2), F(1), F(1)]
FRAMES = [100, 50, 30]
EPISODES = [10, 5, 2]


def test_effective_weights_by_hand():
    assert effective_weights(W, FRAMES, EPISODES, "none") == [F(1, 2), F(1, 4), F(1, 4)]
    assert effective_weights(W, FRAMES, EPISODES, "frames") == [F(5, 7), F(5, 28), F(3, 28)]
    assert effective_weights(W, FRAMES, EPISODES, "episodes") == [F(20, 27), F(5, 27), F(2, 27)]


def test_quotas_largest_remainder_by_hand():
    # none: 180/2, 180/4, 180/4
    assert quotas(180, effective_weights(W, FRAMES, EPISODES, "none"), FRAMES) == [90, 45, 45]
    # frames: 128.57, 32.14, 19.29 -> floors 179, the largest remainder (.57) gets the last one
    assert quotas(180, effective_weights(W, FRAMES, EPISODES, "frames"), FRAMES) == [129, 32, 19]
    # episodes: 133.33, 33.33, 13.33 -> a three-way tie: the earliest source gets it
    assert quotas(180, effective_weights(W, FRAMES, EPISODES, "episodes"), FRAMES) == [
        134,
        33,
        13,
    ]
    assert largest_remainder(10, [F(1), F(1), F(1)]) == [4, 3, 3]
    assert largest_remainder(7, [F(1, 10), F(2, 10), F(7, 10)]) == [1, 1, 5]  # .7 1.4 4.9


def test_repeat_and_cap():
    eff = effective_weights(W, FRAMES, EPISODES, "none")
    # repeat: source 2 gets 45 of its 30 frames (1.5 repeats)
    assert quotas(180, eff, FRAMES, "repeat") == [90, 45, 45]
    # cap: source 2 is cut to 30; the 150 left go 2:1 to the others -> 100, 50 (both fit)
    assert quotas(180, eff, FRAMES, "cap") == [100, 50, 30]
    # cap cascades: 120 frames, weights 1:1:1 of sources with 100, 10, 30 frames: 40 each ->
    # the 10-frame source is capped, 110 left -> 55 each -> the 30-frame one is capped -> 80
    assert quotas(120, [F(1, 3)] * 3, [100, 10, 30], "cap") == [80, 10, 30]
    with pytest.raises(MixtureError, match="epoch_frames 181 is more than"):
        quotas(181, eff, FRAMES, "cap")


def test_bin_draws_exact_rows_and_columns():
    m = bin_draws([134, 33, 13], 4)
    assert m.tolist() == [[34, 8, 3], [34, 8, 3], [33, 9, 3], [33, 8, 4]]
    rng = np.random.default_rng(0)
    for _ in range(50):
        b = int(rng.integers(1, 40))
        q = rng.integers(0, 1000, size=int(rng.integers(1, 7)))
        q[-1] += (-q.sum()) % b
        m = bin_draws(q, b)
        assert (m.sum(0) == q).all() and (m.sum(1) == q.sum() // b).all()
        assert (m >= q // b).all() and (m <= -(-q // b)).all()


def test_epoch_size_rounds_to_bins():
    assert epoch_size(180, 8, "trim") == 176
    assert epoch_size(180, 8, "wrap") == 184
    with pytest.raises(MixtureError, match="fewer than the plan's 8 bins"):
        epoch_size(7, 8, "trim")


def test_summary_by_hand():
    spec = parse_mixture(
        {
            "sources": [
                {"root": "/a", "weight": 2},
                {"root": "/b", "weight": 1},
                {"root": "/c", "weight": 1},
            ],
            "balance": "frames",
            "epoch_frames": 180,
        }
    )
    s = summarize(spec, FRAMES, EPISODES)
    assert [r["quota"] for r in s["sources"]] == [129, 32, 19]
    assert [r["name"] for r in s["sources"]] == ["a", "b", "c"]
    assert s["sources"][2]["repeats"] == pytest.approx(19 / 30)


def test_decimal_weights_are_exact():
    spec = parse_mixture(
        {"sources": [{"root": "/a", "weight": 0.1}, {"root": "/b", "weight": 0.2}]}
    )
    assert [s.weight for s in spec.sources] == [F(1, 10), F(1, 5)]
    assert quotas(30, effective_weights([F(1, 10), F(1, 5)], [1, 1], [1, 1], "none"), [1, 1]) == [
        10,
        20,
    ]


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"sources": []}, "sources"),
        ({"sources": [{"root": "/a"}]}, "sources[0].weight is missing"),
        ({"sources": [{"root": "/a", "weight": -1}]}, "sources[0].weight"),
        ({"sources": [{"root": "/a", "weight": True}]}, "sources[0].weight"),
        ({"sources": [{"root": "/a", "weight": 1, "wieght": 2}]}, "sources[0].wieght"),
        ({"sources": [{"root": "/a", "weight": 1}], "balanse": "x"}, "balanse"),
        ({"sources": [{"root": "/a", "weight": 1}], "balance": "size"}, "balance"),
        ({"sources": [{"root": "/a", "weight": 1}], "overflow": "x"}, "overflow"),
        ({"sources": [{"root": "/a", "weight": 1}], "epoch_frames": 0}, "epoch_frames"),
        ({"sources": [{"root": "/a", "weight": 1, "episodes": "5:2"}]}, "sources[0].episodes"),
        ({"sources": [{"root": "/a", "weight": 1, "episodes": [-1]}]}, "sources[0].episodes"),
        ({"sources": [{"root": "/a", "weight": 1, "tasks": []}]}, "sources[0].tasks"),
        ({"sources": [{"root": "/x/a", "weight": 1}, {"root": "/y/a", "weight": 1}]}, "name 'a'"),
        ({"sources": [{"root": "/a", "weight": 1}], "features": {"s": {"pad_to": 0}}}, "pad_to"),
        ({"sources": [{"root": "/a", "weight": 1}], "features": {"s": {"pad": 3}}}, "features.s"),
    ],
)
def test_spec_errors_name_the_field(doc, field):
    with pytest.raises(MixtureError) as err:
        parse_mixture(doc)
    msg = str(err.value)
    assert field in msg and "\n" not in msg


def test_spec_file_inline_and_relative_roots(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"sources": [{"root": "data/a", "weight": 1}]}))
    spec = parse_mixture(str(tmp_path / "m.json"))
    assert spec.sources[0].root == str(tmp_path / "data" / "a")
    inline = parse_mixture('{"sources": [{"root": "hf://datasets/o/n@v1", "weight": 3}]}')
    assert inline.sources[0].name == "n" and inline.sources[0].root == "hf://datasets/o/n@v1"
    with pytest.raises(MixtureError, match="no such mixture file"):
        parse_mixture(str(tmp_path / "nope.json"))
    with pytest.raises(MixtureError, match="not valid JSON"):
        parse_mixture("{nope")


def test_filters_select_episodes(make_sample):
    root = make_sample(episodes=30, tasks=3, seed=5)
    from episodekit.core.dataset import open_dataset

    ds = open_dataset(str(root))
    task0 = ds.task_strings()[0]
    spec = parse_mixture(
        {
            "sources": [
                {"root": str(root), "weight": 1, "name": "all"},
                {"root": str(root), "weight": 1, "name": "range", "episodes": "3:7"},
                {"root": str(root), "weight": 1, "name": "list", "episodes": [1, 4, 29]},
                {"root": str(root), "weight": 1, "name": "task", "tasks": [task0]},
            ]
        }
    )
    a, r, li, t = resolve_sources(spec)
    assert a.episodes == 30 and r.episode_index.tolist() == [3, 4, 5, 6]
    assert li.episode_index.tolist() == [1, 4, 29]
    has0 = [task0 in ts for ts in ds.episodes.column("tasks").to_pylist()]
    assert t.episode_index.tolist() == np.flatnonzero(has0).tolist()
    bad = parse_mixture({"sources": [{"root": str(root), "weight": 1, "episodes": [99]}]})
    with pytest.raises(MixtureError, match=r"episodes \[99\] are not in"):
        resolve_sources(bad)
    bad = parse_mixture({"sources": [{"root": str(root), "weight": 1, "tasks": ["no such"]}]})
    with pytest.raises(MixtureError, match="'no such' is not a task"):
        resolve_sources(bad)
