"""Shard plans: coverage, determinism, balance bars, naive splits, samples, staleness, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from episodekit.cli import main
from episodekit.core.dataset import open_dataset
from episodekit.metadata.plans import plan_file as plan_mod
from episodekit.metadata.plans.build import (
    balance_figures,
    build_plan,
    ensure_plans,
    naive_totals,
    verify_plan,
    write_plan,
)
from episodekit.metadata.plans.load import load_plan
from episodekit.metadata.plans.partition import Items, assign, kk, lpt
from episodekit.metadata.plans.plan_file import (
    PlanError,
    PlanNotFoundError,
    StalePlanError,
    decode_plan,
    encode_plan,
    plan_path,
)
from episodekit.sample import write_sample


def lognormal_lengths(n: int, seed: int = 0, sigma: float = 1.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(300), sigma, n)), 5, None).astype(np.int64)


def assert_covers(plan: dict, lengths: np.ndarray) -> None:
    """Every episode's frames exactly once: pieces tile [0, length) without gap or overlap."""
    items = plan["items"]
    e, s, t = items[:, 0], items[:, 1], items[:, 2]
    order = np.lexsort((s, e))
    e, s, t = e[order], s[order], t[order]
    assert np.all(t > s)
    covered = np.zeros(len(lengths), dtype=np.int64)
    np.add.at(covered, e, t - s)
    assert np.array_equal(covered, lengths)  # total frames per episode
    same = e[1:] == e[:-1]
    assert np.all(s[1:][same] == t[:-1][same])  # contiguous, no overlap
    first = np.r_[True, ~same]
    assert np.all(s[first] == 0)
    assert np.array_equal(np.unique(e), np.arange(len(lengths)))


def bin_sets(plan: dict) -> list[frozenset]:
    offsets = plan["bin_offsets"]
    return [
        frozenset(map(tuple, plan["items"][offsets[b] : offsets[b + 1]].tolist()))
        for b in range(plan["num_bins"])
    ]


@pytest.mark.parametrize("algo", ["auto", "lpt", "kk"])
def test_many_episodes_per_bin_meets_the_bar(algo):
    lengths = lognormal_lengths(16 * 32, seed=1)  # 16 episodes per bin, 8 ranks x 4 workers
    plan = build_plan(lengths, lengths, 8, 4, algo=algo)
    assert_covers(plan, lengths)
    assert plan["num_items"] == len(lengths) and plan["split_episodes"] == 0
    b = plan["balance"]
    assert b["plan"]["max_over_lower_bound"] <= 1.01
    assert b["plan_ranks"]["max_over_lower_bound"] <= 1.01
    # Count-based splits on the same costs are far off.
    assert b["contiguous"]["max_over_lower_bound"] >= 1.15
    assert b["round_robin"]["max_over_lower_bound"] >= 1.15


def test_few_episodes_per_bin_with_split_long_meets_the_bar():
    lengths = lognormal_lengths(96, seed=2)  # 1.5 episodes per bin
    plan = build_plan(lengths, lengths, 16, 4, split_long=True)
    assert_covers(plan, lengths)
    assert plan["split_episodes"] > 0 and plan["num_items"] > len(lengths)
    f = plan["balance"]["plan"]
    assert f["max_over_lower_bound"] <= 1.01 and f["max"] <= f["mean"] * 1.01
    # Without cutting, the largest episode alone would be far above the mean bin.
    assert lengths.max() > 3 * f["mean"]
    # An episode longer than the mean bin is necessarily cut; short ones whole where possible.
    mean = lengths.sum() / 64
    pieces = np.bincount(plan["items"][:, 0], minlength=len(lengths))
    assert np.all(pieces[lengths > mean] > 1)


def test_split_long_leaves_a_good_whole_partition_alone():
    lengths = lognormal_lengths(2000, seed=3, sigma=0.5)
    plan = build_plan(lengths, lengths, 4, 2, split_long=True)
    assert plan["split_episodes"] == 0
    assert plan["balance"]["plan"]["max_over_lower_bound"] <= 1.001


def test_plan_is_a_pure_function_and_seed_only_relabels():
    lengths = lognormal_lengths(300, seed=4)
    a = build_plan(lengths, lengths, 4, 3, split_long=True, seed=0)
    b = build_plan(lengths.copy(), lengths.copy(), 4, 3, split_long=True, seed=0)
    assert encode_plan(a) == encode_plan(b)
    c = build_plan(lengths, lengths, 4, 3, split_long=True, seed=7)
    assert encode_plan(a) != encode_plan(c)
    assert not np.array_equal(a["items"], c["items"])
    # Same bins, other labels: the seed only decides which rank/worker gets which bin.
    assert sorted(bin_sets(a), key=sorted) == sorted(bin_sets(c), key=sorted)
    assert sorted(a["bin_cost"].tolist()) == sorted(c["bin_cost"].tolist())
    # Workers stay inside their rank: the rank-level sets are also equal.
    rank_sets = [
        sorted(sorted(frozenset().union(*bin_sets(p)[r * 3 : r * 3 + 3])) for r in range(4))
        for p in (a, c)
    ]
    assert rank_sets[0] == rank_sets[1]
    assert a["balance"] == c["balance"]


def test_equal_samples_per_rank_trim_and_wrap():
    lengths = np.array([10, 9, 8, 7, 6, 5, 4, 3], dtype=np.int64)  # 52 frames, 2 x 2 bins
    trim = build_plan(lengths, lengths, 2, 2, policy="trim")
    frames = trim["bin_frames"]
    assert frames.sum() == 52 and trim["samples_per_worker"] == frames.min()
    assert trim["samples_per_rank"] == 2 * frames.min()
    assert trim["dropped_frames"] == int((frames - frames.min()).sum())
    assert trim["repeated_frames"] == 0
    wrap = build_plan(lengths, lengths, 2, 2, policy="wrap")
    assert wrap["samples_per_worker"] == wrap["bin_frames"].max()
    assert wrap["repeated_frames"] == int((wrap["bin_frames"].max() - wrap["bin_frames"]).sum())
    assert wrap["dropped_frames"] == 0


def test_naive_comparison_numbers_by_hand():
    costs = np.arange(1, 9, dtype=np.float64)  # total 36, largest 8
    naive = naive_totals(costs, 2)
    assert naive["contiguous"].tolist() == [10.0, 26.0]
    assert naive["round_robin"].tolist() == [16.0, 20.0]
    f = balance_figures(naive["contiguous"], costs)
    assert f == {
        "min": 10.0,
        "mean": 18.0,
        "max": 26.0,
        "lower_bound": 18.0,
        "max_over_lower_bound": round(26 / 18, 6),
        "max_over_mean": round(26 / 18, 6),
    }
    plan = build_plan(costs, costs.astype(np.int64), 2, 1)
    assert plan["balance"]["contiguous"] == f
    assert plan["balance"]["round_robin"]["max"] == 20.0
    assert plan["balance"]["plan"]["max"] == 18.0  # a perfect split exists and is found
    # A single huge item sets the lower bound.
    assert balance_figures(np.array([10.0, 2.0]), np.array([10.0, 1.0, 1.0]))["lower_bound"] == 10


def test_kk_beats_lpt_on_the_textbook_instance():
    costs = np.array([8.0, 7, 6, 5, 4])
    assert np.bincount(lpt(costs, 2), costs).max() == 17
    assert np.bincount(kk(costs, 2), costs).max() == 16
    items = Items(np.arange(5), np.zeros(5, np.int64), costs.astype(np.int64), costs)
    bins, used = assign(items, 2, "auto")
    assert used == "kk" and np.bincount(bins, costs).max() == 16


@pytest.mark.parametrize(
    ("world", "workers", "kwargs", "match"),
    [
        (0, 4, {}, "world size must be >= 1"),
        (2, 0, {}, "workers must be >= 1"),
        (40, 4, {}, "but only 100 frames"),
        (4, 4, {"algo": "greedy"}, "unknown algorithm"),
        (4, 4, {"policy": "pad"}, "unknown policy"),
    ],
)
def test_bad_arguments(world, workers, kwargs, match):
    lengths = np.full(10, 10, dtype=np.int64)
    with pytest.raises(ValueError, match=match):
        build_plan(lengths, lengths, world, workers, **kwargs)


def test_too_few_episodes_suggests_split_long():
    lengths = np.full(10, 10, dtype=np.int64)
    with pytest.raises(ValueError, match="--split-long"):
        build_plan(lengths, lengths, 4, 4)
    plan = build_plan(lengths, lengths, 4, 4, split_long=True)
    assert_covers(plan, lengths)
    assert plan["bin_frames"].min() >= 6 and plan["bin_frames"].max() <= 7


def test_encoding_round_trip_json_and_compressed(monkeypatch):
    lengths = lognormal_lengths(200, seed=5)
    plan = build_plan(lengths, lengths, 4, 2, split_long=True)
    small = encode_plan(plan)
    assert json.loads(small)["items"]["encoding"] == "json"
    monkeypatch.setattr(plan_mod, "JSON_ITEMS_MAX", 10)
    big = encode_plan(plan)
    assert json.loads(big)["items"]["encoding"] == "zlib-base64-int64le"
    for raw in (small, big):
        back = decode_plan(raw)
        assert np.array_equal(back["items"], plan["items"])
        assert np.array_equal(back["bin_offsets"], plan["bin_offsets"])
        assert back["balance"] == plan["balance"]
    with pytest.raises(PlanError, match="not an episodekit shard plan"):
        decode_plan(b'{"a": 1}', "x.json")


def test_ensure_load_verify_on_a_dataset(make_sample):
    root = make_sample(episodes=60, tasks=3)
    ds = open_dataset(root)
    results = ensure_plans(root, [2, 4], 3, split_long=True)
    assert [c for *_, c in results] == [True, True]
    path = root / plan_path(4, 3)
    before = path.read_bytes()
    assert [c for *_, c in ensure_plans(root, [2, 4], 3, split_long=True)] == [False, False]
    assert path.read_bytes() == before
    # Rewriting the same plan is byte-identical.
    write_plan(ds, results[1][1])
    assert path.read_bytes() == before

    plan = load_plan(str(root), 4, 3)
    assert plan.num_bins == 12 and plan.samples_per_rank == plan.samples_per_worker * 3
    assert verify_plan(plan, ds) == []
    bins = plan.bins()
    assert len(bins) == 12
    assert np.array_equal(plan.bin_items(2, 1), bins[2 * 3 + 1])
    assert plan.bin_frames().sum() == ds.num_frames
    assert plan.bin_frames().tolist() == [int((b[:, 2] - b[:, 1]).sum()) for b in bins]
    assert load_plan(ds, 4, 3).items.tolist() == plan.items.tolist()
    with pytest.raises(IndexError):
        plan.bin_items(4, 0)

    # A different seed is a different plan (rewritten), with the same quality.
    ((_, other, changed),) = ensure_plans(root, [4], 3, split_long=True, seed=1)
    assert changed and other["balance"] == plan.balance


def test_verify_plan_catches_tampering(make_sample):
    root = make_sample(episodes=30, tasks=2, copy=False)
    ds = open_dataset(root)
    lengths = ds.column("length")
    plan = build_plan(lengths, lengths, 2, 2, fingerprint=ds.fingerprint)
    assert verify_plan(plan, ds) == []
    dup = dict(plan, items=plan["items"].copy())
    dup["items"][0] = dup["items"][1]  # one episode twice, another missing
    assert any("covers" in p or "overlap" in p for p in verify_plan(dup, ds))
    cut = dict(plan, items=plan["items"].copy())
    cut["items"][0, 2] -= 1  # a frame lost
    assert verify_plan(cut, ds)
    wrong = json.loads(json.dumps(plan["balance"]))
    wrong["contiguous"]["max"] += 1
    assert any("contiguous" in p for p in verify_plan(dict(plan, balance=wrong), ds))
    assert any("stale" in p for p in verify_plan(dict(plan, fingerprint="0" * 32), ds))


def test_missing_and_stale_plans(make_sample):
    root = make_sample(episodes=20, tasks=2, seed=1)
    with pytest.raises(PlanNotFoundError, match="--world-size 2 --workers 2"):
        load_plan(root, 2, 2)
    ensure_plans(root, [2], 2)
    old = (root / plan_path(2, 2)).read_bytes()
    write_sample(root, episodes=20, tasks=2, seed=2)  # the episodes change under the plan
    (root / plan_path(2, 2)).parent.mkdir(parents=True, exist_ok=True)
    (root / plan_path(2, 2)).write_bytes(old)
    with pytest.raises(StalePlanError, match="stale shard plan"):
        load_plan(root, 2, 2)
    assert load_plan(root, 2, 2, check_fresh=False).world_size == 2
    ((_, _, changed),) = ensure_plans(root, [2], 2)
    assert changed and load_plan(root, 2, 2).fingerprint == open_dataset(root).fingerprint


def test_cli_plan(make_sample):
    root = make_sample(episodes=40, tasks=3)
    runner = CliRunner()
    args = ["metadata", "plan", str(root), "--world-size", "2,4", "--workers", "2"]
    res = runner.invoke(main, args + ["--split-long", "--cost", "compute"])
    assert res.exit_code == 0, res.output
    assert res.output.count("written") == 2 and "round_robin" in res.output
    assert (root / plan_path(4, 2)).exists() and (root / "meta/episode_costs.parquet").exists()
    res = runner.invoke(main, args + ["--split-long", "--cost", "compute", "--json"])
    heads = json.loads(res.output)
    assert [h["changed"] for h in heads] == [False, False]
    assert heads[1]["cost_model"] == "compute" and heads[1]["world_size"] == 4
    res = runner.invoke(main, ["metadata", "plan", str(root), "--world-size", "0"])
    assert res.exit_code == 2 and "'--world-size': 0 is not in the range x>=1" in res.output
    res = runner.invoke(main, ["metadata", "plan", str(root), "--world-size", "x"])
    assert res.exit_code == 2


def test_plan_options_object_equals_keyword_arguments(make_sample, tmp_path):
    """ensure_plans(..., PlanOptions(...)) writes the same plan as the keyword arguments, keywords
    override the object's fields, and an unknown option is a TypeError."""
    from episodekit.metadata.plans.options import PlanOptions

    root = make_sample(episodes=40, tasks=3, seed=5)
    [(path, by_kw, _)] = ensure_plans(root, [2], 2, cost="compute", seed=3, locality="rowgroup")
    opts = PlanOptions(cost="compute", seed=3, locality="rowgroup", force=True)
    [(_, by_obj, changed)] = ensure_plans(root, [2], 2, opts)
    assert changed and by_obj["items"].tolist() == by_kw["items"].tolist()
    assert {k: by_obj[k] for k in ("cost_model", "seed", "locality")} == {
        "cost_model": "compute", "seed": 3, "locality": "rowgroup",
    }  # fmt: skip
    [(_, over, _)] = ensure_plans(root, [2], 2, opts, seed=4)
    assert over["seed"] == 4
    with pytest.raises(TypeError, match="colour"):
        ensure_plans(root, [2], 2, opts, colour="red")


def _cli(*args):
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *map(str, args)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_plan_uses_prepares_defaults_and_the_readme_example_works(tmp_path):
    """The README's `metadata plan ROOT --world-size 8,64 --workers 4` on LeRobot's recordings
    exited 2 ("196 of 256 bins got no frames ... use --split-long") and left ws8_nw4.json:
    `metadata plan` now has prepare's defaults (split-long auto, locality rowgroup, 4 workers),
    so what `prepare` wrote is fresh for it, and `plan --mixture` has them too."""
    import shutil
    from pathlib import Path

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
    for name in ("rec40", "edited35"):
        root = shutil.copytree(fixtures / name, tmp_path / name)
        proc = _cli("metadata", "plan", root, "--world-size", "8,64", "--workers", "4", "--json")
        assert proc.returncode == 0, proc.stderr
        heads = {h["world_size"]: h for h in json.loads(proc.stdout)}
        assert sorted(heads) == [8, 64] and all(h["changed"] for h in heads.values())
        assert {h["locality"] for h in heads.values()} == {"rowgroup"}
        assert heads[64]["split_long"]  # 40 episodes for 256 bins: cut, as prepare would
    root = tmp_path / "rec40"
    assert _cli("prepare", root, "-j", "1").returncode == 0
    proc = _cli("metadata", "plan", root, "--world-size", "8,64", "--json")  # the defaults
    assert proc.returncode == 0, proc.stderr
    assert [h["changed"] for h in json.loads(proc.stdout)] == [False, False]
    mix = json.dumps({"sources": [{"root": str(root), "weight": 1}]})
    proc = _cli("metadata", "plan", "--mixture", mix, "--out", tmp_path / "m", "--world-size", 2)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "m" / "ws2_nw4.json").read_text())
    assert doc["num_workers"] == 4 and doc["locality"] == "rowgroup"


def test_a_failed_plan_run_leaves_no_file(make_sample, tmp_path):
    """Every requested plan is built before any is written: a world size that cannot be planned
    (more bins than frames) fails the run (exit 2) with no plan, no cost table, no folder."""
    root = make_sample(episodes=20, tasks=2, seed=4)
    proc = _cli("metadata", "plan", root, "--world-size", "2,100000", "--workers", "1")
    assert proc.returncode == 2 and "100,000 bins" in proc.stderr
    assert not (root / "meta/shard_plans").exists()
    assert not (root / "meta/episode_costs.parquet").exists()
    proc = _cli("metadata", "plan", root, "--world-size", "2,8", "--split-long", "no")
    assert proc.returncode == 2 and "--split-long auto" in proc.stderr  # 20 episodes, 32 bins
    assert not (root / "meta/shard_plans").exists()
    mix = json.dumps({"sources": [{"root": str(root), "weight": 1}]})
    out = tmp_path / "m"
    proc = _cli("metadata", "plan", "--mixture", mix, "--out", out, "--world-size", "1,100000")
    assert proc.returncode != 0 and not out.exists(), proc.stderr
