"""Elastic resume: canonical plans, the global order, states, merging, resizes (issue 17)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.loaders import (
    ElasticLoader,
    ElasticStateError,
    load_canonical_plan,
    load_plan,
    merge_states,
)
from episodekit.loaders.elastic import GlobalOrder, RunLayout, bin_frames
from episodekit.metadata.plans.build import ensure_plans, verify_plan
from episodekit.metadata.plans.canonical import (
    canonical_plan_path,
    default_canonical_bins,
    ensure_canonical_plan,
    is_canonical,
)
from episodekit.sample import write_sample

SPEC = dict(episodes=60, tasks=2, seed=3, mean_length=40)
C = 48


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = write_sample(tmp_path_factory.mktemp("elastic") / "root", **SPEC)
    ensure_canonical_plan(str(r), C, locality="rowgroup", split_long=True)
    return r


@pytest.fixture(scope="module")
def plan(root):
    return load_canonical_plan(str(root))


def make(root, plan, rank, world, **kw):
    return ElasticLoader(root, plan, rank=rank, world_size=world, speed=False, pool_rows=300, **kw)


def fake_state(order: GlobalOrder, run: RunLayout, rank: int, consumed: list) -> dict:
    return {
        "format": "episodekit.elastic_state",
        "version": 1,
        "plan": "p",
        "seed": 0,
        "canonical_bins": order.num_bins,
        "samples_per_bin": order.samples_per_bin,
        "micro_batch": order.micro_batch,
        "pool_rows": 1,
        "epoch": 0,
        "frontier": run.frontier,
        "ahead": run.ahead.tolist(),
        "world_size": run.world_size,
        "rank": rank,
        "consumed": consumed,
    }


def resume(order: GlobalOrder, states: list[dict], world: int) -> RunLayout:
    merged = merge_states(states)
    return RunLayout(order, world, merged["frontier"], merged["ahead"])


def dups_losses(order: GlobalOrder, parts: list[np.ndarray]) -> tuple[int, int]:
    seen = np.bincount(np.concatenate(parts), minlength=order.total)
    return int(np.clip(seen - 1, 0, None).sum()), int((seen == 0).sum())


# -- canonical plans --------------------------------------------------------------------------


def test_default_canonical_bins_rule():
    assert default_canonical_bins(1_000_000) == 3840
    assert default_canonical_bins(25_000) == 960  # <= 25,000 / 16, most divisors
    assert default_canonical_bins(4_000) == 240
    assert default_canonical_bins(20) == 1  # fewer than 2 x 16 episodes: one bin
    for n in (100, 1000, 4000, 50_000, 10**6):
        c = default_canonical_bins(n)
        assert c <= max(n // 16, 1)
    # the common world sizes divide the default for large datasets
    assert all(3840 % w == 0 for w in (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64, 128, 256))


def test_canonical_plan_world_size_free_file_order_and_valid(root, plan):
    ds = open_dataset(str(root))
    assert is_canonical(plan) and plan.num_bins == C and plan.num_workers == 1
    assert plan.locality == "rowgroup"
    # bins numbered in file order: each bin's first frame after the previous bin's
    frm = ds.column("dataset_from_index")
    first = [int(frm[b[:, 0]].min() + b[b[:, 0] == b[:, 0].min(), 1].min()) for b in plan.bins()]
    assert first == sorted(first)
    assert verify_plan(plan, ds) == []
    path, _, changed = ensure_canonical_plan(str(root), C, locality="rowgroup", split_long=True)
    assert not changed and path.endswith(canonical_plan_path(C))
    # another C is another file; asking for "the" plan then needs the number
    ensure_canonical_plan(str(root), 24, split_long=True)
    try:
        with pytest.raises(Exception, match="several canonical plans"):
            load_canonical_plan(str(root))
        assert load_canonical_plan(str(root), 24).num_bins == 24
    finally:
        (root / canonical_plan_path(24)).unlink()


def test_cli_canonical_bins(tmp_path):
    r = write_sample(tmp_path / "r", episodes=40, tasks=2, seed=5, mean_length=30)
    cli = [sys.executable, "-m", "episodekit.cli", "metadata", "plan", str(r)]
    ok = subprocess.run(
        [*cli, "--canonical-bins", "12", "--locality", "rowgroup", "--json"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    head = json.loads(ok.stdout)
    assert head[0]["canonical_bins"] == 12 and head[0]["changed"]
    assert (r / canonical_plan_path(12)).exists()
    auto = subprocess.run([*cli, "--canonical-bins", "auto"], capture_output=True, text=True)
    assert auto.returncode == 0 and (r / canonical_plan_path(default_canonical_bins(40))).exists()
    for args in (["--canonical-bins", "0"], ["--canonical-bins", "x"], []):
        bad = subprocess.run([*cli, *args], capture_output=True, text=True)
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr.startswith("Error:") and len(bad.stderr.strip().splitlines()) == 1
    val = subprocess.run(
        [sys.executable, "-m", "episodekit.cli", "validate", str(r), "--checks", "plans"],
        capture_output=True,
        text=True,
    )
    assert val.returncode == 0, val.stdout + val.stderr


def test_cli_prepare_writes_the_canonical_plan_once(tmp_path):
    """`prepare --canonical-bins` writes the canonical plan beside the per-world-size plans,
    prints its balance line, keeps it on a rerun, and refuses a bad C or --mixture with it."""
    r = write_sample(tmp_path / "r", episodes=40, tasks=2, seed=5, mean_length=30)
    cli = [sys.executable, "-m", "episodekit.cli", "prepare", str(r), "--world-size", "2"]
    first = subprocess.run([*cli, "--canonical-bins", "8"], capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "canonical C=8" in first.stdout
    path = r / canonical_plan_path(8)
    mtime = path.stat().st_mtime_ns
    again = subprocess.run(
        [*cli, "--canonical-bins", "8", "--json"], capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    plans = next(s for s in json.loads(again.stdout)["steps"] if s["name"] == "plans")
    assert plans["status"] == "skipped" and path.stat().st_mtime_ns == mtime
    assert [p.get("canonical_bins") for p in plans["detail"]["plans"]] == [None, 8]
    mixture = [*cli[:4], "--mixture", "{}", "--out", str(tmp_path / "m")]
    for args in ([*cli, "--canonical-bins", "-1"], [*mixture, "--canonical-bins", "8"]):
        bad = subprocess.run(args, capture_output=True, text=True)
        assert bad.returncode == 2, bad.stderr
        assert bad.stderr.startswith("Error:") and len(bad.stderr.strip().splitlines()) == 1
        assert "--canonical-bins" in bad.stderr


def test_cli_too_many_canonical_bins_is_refused_before_any_plan(tmp_path):
    """--canonical-bins above the episodes: one line naming the option, exit 2, and the
    --world-size plans of the same command are not written either."""
    r = write_sample(tmp_path / "r", episodes=40, tasks=2, seed=5, mean_length=30)
    cli = [sys.executable, "-m", "episodekit.cli", "metadata", "plan", str(r)]
    args = [*cli, "--world-size", "2", "--canonical-bins", "1000", "--split-long", "no"]
    bad = subprocess.run(args, capture_output=True, text=True)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip() == (
        "Error: --canonical-bins 1000: 40 episodes are too few for 1,000 bins "
        "(use at most 40, auto, or --split-long auto)"
    )
    assert not (r / "meta" / "shard_plans").exists()
    bad = subprocess.run(  # cut episodes (the default, auto): the frames are still too few
        [*cli, "--world-size", "2", "--canonical-bins", "100000"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "frames are too few for 100,000 bins" in bad.stderr
    assert not (r / "meta" / "shard_plans").exists()


def test_stale_hints_rebuild_the_same_kind_of_plan(tmp_path):
    """The rerun commands stale canonical and shard plans name, run as written, keep the plans'
    options (it used to drop --locality/--seed/--split-long: a rowgroup plan came back 'none')."""
    import shlex
    import shutil

    from episodekit.loaders import StalePlanError

    r = write_sample(tmp_path / "r", episodes=40, tasks=2, seed=5, mean_length=30)
    ensure_canonical_plan(str(r), 2, locality="rowgroup", split_long=True, seed=4)
    ensure_plans(str(r), [2], 1, locality="rowgroup", seed=4)
    shutil.move(r / "meta" / "shard_plans", tmp_path / "plans")
    shutil.rmtree(r)
    write_sample(r, episodes=41, tasks=2, seed=5, mean_length=30)
    shutil.move(tmp_path / "plans", r / "meta" / "shard_plans")
    for load in (lambda: load_canonical_plan(str(r)), lambda: load_plan(str(r), 2, 1)):
        with pytest.raises(StalePlanError) as err:
            load()
        cmd = shlex.split(str(err.value).split("recompute it with: ")[1])
        assert cmd[:3] == ["episodekit", "metadata", "plan"]
        run = subprocess.run(
            [sys.executable, "-m", "episodekit.cli", *cmd[1:]], capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        doc = load().doc
        assert (doc["locality"], doc["seed"]) == ("rowgroup", 4), cmd


# -- the order --------------------------------------------------------------------------------


def test_bin_frames_is_the_pool_order(root, plan):
    loader = make(root, plan, 0, 1)
    for b in (0, 7, C - 1):
        order = loader._bin_order(0, b)
        ref = np.concatenate([f for _, f, _ in order.parts(0, order.total + 9)])
        np.testing.assert_array_equal(bin_frames(order, np.arange(order.total + 9)), ref)
        # a bin's stream does not depend on which rank (or world size) reads it
        other = make(root, plan, 2, 3)._bin_order(0, b)
        np.testing.assert_array_equal(bin_frames(other, np.arange(order.total)), ref[:-9])


def test_epoch_is_the_plan_and_world_size_free(root, plan):
    epoch = None
    for world in (1, 3, 8, 16, 5):
        loaders = [make(root, plan, r, world) for r in range(world)]
        frames = [np.concatenate([b["index"] for b in lo]) for lo in loaders]
        assert len({len(f) for f in frames}) == 1  # equal samples per rank
        got = np.sort(np.concatenate(frames))
        if world == 5:  # 5 does not divide C: the tail is padded to equal counts
            run = loaders[0].run
            assert run.repeats > 0 and len(got) == run.order.total + run.repeats
            assert np.array_equal(np.unique(got), epoch)
            continue
        assert len(np.unique(got)) == len(got) == C * plan.samples_per_worker
        epoch = got if epoch is None else epoch
        np.testing.assert_array_equal(got, epoch)
    # the epoch set is every bin's first samples_per_worker frames of its items
    items = np.concatenate(plan.bins())
    assert len(epoch) <= int((items[:, 2] - items[:, 1]).sum())


def test_steps_are_windows_for_any_world_size(root, plan):
    """Step k of any run whose size divides C is the same global window, whoever yields it."""
    ref = None
    for world in (1, 2, 4, 6, 16):
        loaders = [make(root, plan, r, world) for r in range(world)]
        steps = list(zip(*[iter(lo) for lo in loaders]))
        sets = [np.sort(np.concatenate([b["index"] for b in s])) for s in steps]
        assert all(len(s) == C for s in sets)
        ref = sets if ref is None else ref
        assert all(np.array_equal(a, b) for a, b in zip(sets, ref))


# -- resizes (positions; bin streams are bijections, so positions exact = frames exact) -------


def test_resize_at_20_random_steps_is_exact():
    order = GlobalOrder(240, 50)
    base = RunLayout(order, 8)
    ref = [
        np.sort(np.concatenate([base.unit_positions(r, k) for r in range(8)]))
        for k in range(base.num_units)
    ]
    rng = np.random.default_rng(17)
    for s in np.sort(rng.choice(np.arange(1, base.num_units), 20, replace=False)).tolist():
        before = [base.positions(r, 0, int(base.unit_start[s])) for r in range(8)]
        # every DataLoader worker's state (worker w yielded steps w, w + 2, ... < s)
        states = [
            fake_state(
                order,
                base,
                r,
                [[int(base.unit_start[u]), int(base.unit_start[u + 1])] for u in range(w, s, 2)],
            )
            for r in range(8)
            for w in range(2)
        ]
        for world, workers in ((6, 2), (16, 1), (4, 4), (8, 2)):
            run = resume(order, states, world)
            after = [run.positions(r) for r in range(world)]
            assert dups_losses(order, before + after) == (0, 0)
            assert len({len(a) for a in after}) == 1 and run.repeats == 0
            steps = ref[:s] + [
                np.sort(np.concatenate([run.unit_positions(r, k) for r in range(world)]))
                for k in range(run.num_units)
            ]
            # every step is the same window (positions [t * 240, (t + 1) * 240)) as without
            assert len(steps) == len(ref)
            assert all(np.array_equal(a, b) for a, b in zip(steps, ref))
            per_worker = [run.unit_sizes[w::workers].sum() for w in range(workers)]
            assert max(per_worker) - min(per_worker) <= run.share


def test_ragged_stops_and_chained_resizes_lose_nothing():
    order = GlobalOrder(48, 40, micro_batch=2)
    rng = np.random.default_rng(3)
    for _ in range(30):
        run, before, pads = RunLayout(order, 8), [], 0
        for world in rng.choice([1, 3, 5, 6, 7, 16], size=3).tolist():
            stop = rng.integers(0, run.per_rank + 1, size=run.world_size)
            before += [run.positions(r, 0, int(stop[r])) for r in range(run.world_size)]
            run = resume(
                order,
                [fake_state(order, run, r, [[0, int(stop[r])]]) for r in range(run.world_size)],
                world,
            )
            pads += run.repeats
            assert run.repeats < 2 * world  # head and (fallback) tail: < world each
        after = [run.positions(r) for r in range(run.world_size)]
        assert len({len(a) for a in after}) == 1
        dups, losses = dups_losses(order, before + after)
        assert losses == 0 and dups <= pads


def test_fallback_steps_are_whole_windows_and_keep_locality():
    order = GlobalOrder(48, 42)
    run = RunLayout(order, 5)  # 5 does not divide 48: a step is 5 rounds, taken bin by bin
    assert run.group == 5 and run.share == 48 and run.full == 8
    for k in range(run.full):
        step = np.sort(np.concatenate([run.unit_positions(r, k) for r in range(5)]))
        np.testing.assert_array_equal(step, np.arange(k * 5 * 48, (k + 1) * 5 * 48))
    for r in range(5):
        bins = np.unique(order.locate(run.positions(r, 0, run.body_end))[0])
        assert len(bins) <= 48 // 5 + 2 and np.all(np.diff(bins) == 1)
    after = [run.positions(r) for r in range(5)]
    assert len({len(a) for a in after}) == 1
    # the last 2 rounds (96 samples) are padded to 5 x 20
    assert dups_losses(order, after) == (run.repeats, 0) and run.repeats == 4


def test_merge_handles_far_apart_ranks_in_intervals():
    order = GlobalOrder(64, 10_000)
    run = RunLayout(order, 4)
    stop = [10, run.per_rank // 2, 3 * run.share + 5, run.per_rank]
    merged = merge_states([fake_state(order, run, r, [[0, s]]) for r, s in enumerate(stop)])
    assert merged["frontier"] == 10  # rank 0 stopped 10 samples into the first window
    assert len(merged["ahead"]) <= 3 * run.num_units  # intervals, not samples
    new = RunLayout(order, 3, merged["frontier"], merged["ahead"])
    before = [run.positions(r, 0, s) for r, s in enumerate(stop)]
    after = [new.positions(r) for r in range(3)]
    dups, losses = dups_losses(order, before + after)
    assert losses == 0 and dups == new.repeats


# -- the loader: real frames, states, refusals ------------------------------------------------


def test_loader_resume_on_other_world_sizes_real_frames(root, plan):
    epoch = np.sort(np.concatenate([b["index"] for b in make(root, plan, 0, 1)]))
    # 8 ranks x 2 workers stop after 5 steps (worker 0 yielded steps 0, 2, 4; worker 1: 1, 3)
    states, before = [], []
    for r in range(8):
        for w in range(2):
            lo = make(root, plan, r, 8, worker=w, num_workers=2)
            it = iter(lo)
            for _ in range(3 if w == 0 else 2):
                before.append(next(it)["index"])
            states.append(lo.state_dict())
    json.dumps(states)  # states are plain JSON
    # a worker's progress is O(1): the strided steps it yielded, not one range per step
    assert states[0]["steps"] == [0, 2, 3] and states[1]["steps"] == [1, 2, 2]
    assert states[0]["consumed"] == states[1]["consumed"] == []
    for world in (1, 3, 6, 16):
        after = []
        for r in range(world):
            lo = make(root, plan, r, world)
            lo.load_state_dict(states)
            got = [b["index"] for b in lo]
            assert sum(map(len, got)) == len(lo)
            after.append(np.concatenate(got))
        assert len({len(a) for a in after}) == 1
        np.testing.assert_array_equal(np.sort(np.concatenate(before + after)), epoch)
    # a merged state is the same thing
    lo = make(root, plan, 1, 3)
    lo.load_state_dict(merge_states(states))
    assert len(lo) == (len(epoch) - 5 * C) // 3


def test_same_run_continues_from_its_own_state(root, plan):
    full = [b["index"] for b in make(root, plan, 2, 4)]
    lo = make(root, plan, 2, 4)
    it = iter(lo)
    head = [next(it)["index"] for _ in range(4)]
    again = make(root, plan, 2, 4)
    again.load_state_dict(lo.state_dict())
    rest = [b["index"] for b in again]
    np.testing.assert_array_equal(np.concatenate(head + rest), np.concatenate(full))
    # state_at counts steps from the load: 3 more steps after the 4 restored ones
    counted = make(root, plan, 2, 4)
    counted.load_state_dict(lo.state_dict())
    later = counted.state_at(3)
    share = lo.run.share
    assert later["consumed"] == [[4 * share, 7 * share]] and later["steps"] == [0, 1, 4]


def test_finished_epoch_rolls_over(root, plan):
    loaders = [make(root, plan, r, 2) for r in range(2)]
    first = [np.concatenate([b["index"] for b in lo]) for lo in loaders]
    merged = merge_states([lo.state_dict() for lo in loaders])
    assert merged["frontier"] == C * plan.samples_per_worker and merged["epoch"] == 0
    lo = make(root, plan, 0, 3)
    lo.load_state_dict(merged)
    second = np.concatenate([b["index"] for b in lo])  # epoch 1 from its start
    assert lo.epoch == 1 and len(second) == C * plan.samples_per_worker // 3
    assert not np.array_equal(second, first[0][: len(second)])


def test_refuses_other_plan_seed_and_partial_states(root, plan):
    lo = make(root, plan, 0, 2)
    next(iter(lo))
    mine = lo.state_dict()
    other_seed = make(root, plan, 0, 2, seed=1)
    with pytest.raises(ElasticStateError, match="another seed"):
        other_seed.load_state_dict([mine, make(root, plan, 1, 2).state_dict()])
    ensure_canonical_plan(str(root), 24, split_long=True)
    try:
        other_plan = make(root, load_canonical_plan(str(root), 24), 0, 2)
        with pytest.raises(ElasticStateError, match="another canonical plan"):
            other_plan.load_state_dict(mine)
    finally:
        (root / canonical_plan_path(24)).unlink()
    with pytest.raises(ElasticStateError, match="another micro_batch|samples-per-bin"):
        make(root, plan, 0, 2, micro_batch=2).load_state_dict(mine)
    with pytest.raises(ElasticStateError, match="every rank's state"):
        make(root, plan, 0, 3).load_state_dict(mine)  # one rank of a 2-rank run, alone
    with pytest.raises(ElasticStateError, match=r"ranks \[1\] of 2 are missing"):
        merge_states([mine])
    other_run = make(root, plan, 1, 3).state_dict()
    with pytest.raises(ElasticStateError, match="not from the same run"):
        merge_states([mine, other_run])
    with pytest.raises(ElasticStateError, match="not an elastic loader state"):
        lo.load_state_dict({"epoch": 0, "position": 3})
    with pytest.raises(ElasticStateError, match="outside the epoch"):
        lo.load_state_dict({**mine, "world_size": None, "rank": None, "frontier": -1})
    with pytest.raises(ValueError, match="canonical plan"):
        ensure_plans(str(root), [2], 1)
        ElasticLoader(root, load_plan(str(root), 2, 1), rank=0, world_size=2)


def test_warns_when_cache_cannot_hold_a_ranks_rows(root, plan):
    with pytest.warns(UserWarning, match="ElasticLoader rank 1: a step reads"):
        make(root, plan, 1, 2, cache_mb=0.01, store=None)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make(root, plan, 1, 2, store=None)  # the default cache holds this small root
