"""Plans that leave frames out (metadata/plans/exclude.py, ``--exclude-*``): no excluded frame is
ever drawn, every rank still gets the same number of samples, and the plan records what it left
out and why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.loaders import ShardedLoader
from episodekit.metadata.plans.build import build_plan, ensure_plans, verify_plan
from episodekit.metadata.plans.exclude import (
    Exclusion,
    keep_pieces,
    merge_ranges,
    parse_episode_list,
    read_frame_ranges,
    whole_episodes,
)
from episodekit.metadata.plans.load import load_plan
from episodekit.metadata.plans.options import PlanOptions
from tests.corruptions import QUALITY_CORRUPTIONS, QUALITY_SPEC

CLI = "import sys; from episodekit.cli import main; sys.exit(main())"
REC40 = Path(__file__).parents[1] / "fixtures" / "lerobot" / "rec40"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True)


def test_parse_episode_list_and_its_refusals():
    assert parse_episode_list("3,7,10-12").tolist() == [3, 7, 10, 11, 12]
    assert parse_episode_list(" 5 , 1-2,2").tolist() == [1, 2, 5]
    assert parse_episode_list("3,").tolist() == [3]
    for bad in ("", "a", ",", "-1", "4-2", "1;2", "0-99999999999"):
        with pytest.raises(ValueError):
            parse_episode_list(bad)


def test_keep_pieces_equals_a_frame_by_frame_mask():
    rng = np.random.default_rng(7)
    for _ in range(50):
        n_ep = int(rng.integers(1, 12))
        ep = np.sort(rng.choice(100, n_ep, replace=False))
        length = rng.integers(1, 40, n_ep)
        m = int(rng.integers(0, 15))
        which = rng.integers(0, n_ep, m)
        start = (rng.random(m) * length[which]).astype(int)
        end = start + rng.integers(1, 20, m)
        ranges = np.stack([ep[which], start, end], axis=1)
        x = Exclusion.of([("r", ranges)], ep, length)
        e, s, t, _ = keep_pieces(ep, length, x.ranges)
        for i, (a, n) in enumerate(zip(ep, length)):
            mask = np.ones(n, bool)
            for _, lo, hi in ranges[ranges[:, 0] == a]:
                mask[lo:hi] = False
            kept = np.zeros(n, bool)
            for lo, hi in zip(s[e == a], t[e == a]):
                assert hi > lo and not kept[lo:hi].any()
                kept[lo:hi] = True
            assert np.array_equal(kept, mask), (i, ranges)
        assert x.frames + int((t - s).sum()) == int(length.sum())


def test_merge_ranges_joins_overlaps_and_touching_runs():
    r = np.array([[5, 10, 20], [5, 15, 30], [5, 30, 31], [5, 40, 45], [2, 0, 3], [2, 1, 2]])
    assert merge_ranges(r).tolist() == [[2, 0, 3], [5, 10, 31], [5, 40, 45]]


def test_exclusion_refuses_unknown_episodes_and_ranges_past_the_end():
    ep, n = np.array([0, 1, 2]), np.array([10, 10, 10])
    with pytest.raises(ValueError, match="no episode \\[7\\]"):
        Exclusion.of([("episodes", whole_episodes(np.array([7]), ep, n))], ep, n)
    with pytest.raises(ValueError, match="starts at frame 12 of episode 1"):
        Exclusion.of([("frames", np.array([[1, 12, 14]]))], ep, n)
    x = Exclusion.of([("frames", np.array([[1, 5, 99]]))], ep, n)  # clipped to the length
    assert x.ranges.tolist() == [[1, 5, 10]] and x.reasons == {"frames": 5}


def test_read_frame_ranges_json_jsonl_and_bad_files(tmp_path):
    j = tmp_path / "r.json"
    j.write_text(json.dumps([{"episode": 3, "start": 0, "end": 4}, [5, 2, 9]]))
    assert read_frame_ranges(j).tolist() == [[3, 0, 4], [5, 2, 9]]
    jl = tmp_path / "r.jsonl"
    jl.write_text('{"episode_index": 1, "start": 3, "end": 5}\n\n[2, 0, 1]\n')
    assert read_frame_ranges(jl).tolist() == [[1, 3, 5], [2, 0, 1]]
    for text, match in [
        ("{nope", "not valid JSON"),
        ("[[1, 5, 5]]", "empty"),
        ('[[1, "a", 5]]', "not an integer"),
        ('{"x": 1}', "list of frame ranges"),
    ]:
        j.write_text(text)
        with pytest.raises(ValueError, match=match):
            read_frame_ranges(j)


def _drawn(root, plan) -> list[np.ndarray]:
    """Global frame indices each rank draws in epoch 0 (all its workers)."""
    out = []
    for r in range(plan.world_size):
        ld = ShardedLoader(root, plan, rank=r, world_size=plan.world_size, speed=False)
        out.append(ld.epoch_frames(0))
    return out


@pytest.mark.parametrize("locality", ["none", "rowgroup"])
def test_plan_never_draws_an_excluded_frame_and_ranks_stay_equal(make_sample, locality):
    root = make_sample(episodes=40, seed=3, mean_length=60)
    ds = open_dataset(str(root))
    ep, n, first = (ds.column(c) for c in ("episode_index", "length", "dataset_from_index"))
    x = Exclusion.of(
        [
            ("episodes", whole_episodes(np.array([3, 17]), ep, n)),
            ("frames", np.array([[5, 10, 30], [9, 0, 5], [20, int(n[20]) - 4, int(n[20])]])),
        ],
        ep,
        n,
    )
    opts = PlanOptions(locality=locality, exclusion=x)
    [(_, doc, changed)] = ensure_plans(ds, [3], 2, opts)
    assert changed and doc["excluded"]["episodes"] == 2
    assert doc["excluded"]["reasons"] == {"episodes": int(n[3] + n[17]), "frames": 29}
    assert not verify_plan(doc, ds)
    banned = np.concatenate([np.arange(first[e] + s, first[e] + t) for e, s, t in x.ranges])
    plan = load_plan(ds, 3, 2)
    drawn = _drawn(ds, plan)
    assert len({len(d) for d in drawn}) == 1  # every rank equal
    assert len(drawn[0]) == plan.samples_per_rank
    assert not np.isin(np.concatenate(drawn), banned).any()
    # A rerun with the same exclusion keeps the plan; another exclusion rewrites it.
    assert not ensure_plans(ds, [3], 2, opts)[0][2]
    other = Exclusion.of([("episodes", whole_episodes(np.array([4]), ep, n))], ep, n)
    assert ensure_plans(ds, [3], 2, PlanOptions(locality=locality, exclusion=other))[0][2]


def test_verify_plan_catches_an_item_inside_an_excluded_range(make_sample):
    root = make_sample(episodes=20, seed=1)
    ds = open_dataset(str(root))
    ep, n = ds.column("episode_index"), ds.column("length")
    x = Exclusion.of([("frames", np.array([[2, 0, 10]]))], ep, n)
    [(_, doc, _)] = ensure_plans(ds, [2], 1, PlanOptions(exclusion=x))
    assert not verify_plan(doc, ds)
    doc["excluded"]["ranges"] = [[2, 0, 12]]  # claims more than the items leave out
    assert any("overlap" in p for p in verify_plan(doc, ds))
    doc["excluded"]["ranges"] = []  # the excluded frames now belong to nobody
    assert any("fit its length" in p for p in verify_plan(doc, ds))


def test_exclusion_leaving_nothing_is_an_error():
    with pytest.raises(ValueError, match="leaves no frame"):
        x = Exclusion(np.array([[0, 0, 5], [1, 0, 5]]), {"episodes": 10})
        build_plan(np.ones(2), np.array([5, 5]), 1, 1, exclusion=x)


def test_cli_exclude_flagged_drops_exactly_the_seeded_episodes(make_sample, tmp_path):
    root = make_sample(**QUALITY_SPEC)
    frozen = QUALITY_CORRUPTIONS["frozen_action"](root)
    dup = QUALITY_CORRUPTIONS["duplicate"](root)
    flagged = {frozen.episode, dup.episode}
    checks = "quality.frozen,quality.duplicate"
    res = cli("metadata", "plan", str(root), "--world-size", "2", "--workers", "2",
              "--exclude-flagged", checks, "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    [doc] = json.loads(res.stdout)
    ex = doc["excluded"]
    assert {r[0] for r in ex["ranges"]} == flagged and ex["episodes"] == 2
    assert set(ex["reasons"]) == {"quality.frozen", "quality.duplicate"}
    # The same from a saved report, and the loader never draws those episodes.
    report = tmp_path / "report.json"
    v = cli("validate", str(root), "--json", "--checks", "quality")
    report.write_text(v.stdout)
    res = cli("metadata", "plan", str(root), "--world-size", "2", "--workers", "2",
              "--exclude-flagged", checks, "--flags-from", str(report), "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)[0]["excluded"]["ranges"] == ex["ranges"]
    ds = open_dataset(str(root))
    drawn = np.concatenate(_drawn(ds, load_plan(ds, 2, 2)))
    episode_of = np.repeat(ds.column("episode_index"), ds.column("length"))
    assert not np.isin(episode_of[drawn], list(flagged)).any()


def test_cli_exclude_refusals_are_one_line_exit_2(make_sample, tmp_path):
    root = str(make_sample(episodes=10, seed=2))
    report = tmp_path / "r.json"
    report.write_text(json.dumps({"findings": [], "checks_run": ["data.rows"]}))
    cases = [
        (["--exclude-episodes", "2-1"], "'2-1' is not a valid range"),
        (["--exclude-episodes", "99"], "no episode [99]"),
        (["--exclude-flagged", "quality.nope"], "unknown check"),
        (["--flags-from", str(report)], "--flags-from needs --exclude-flagged"),
        (["--exclude-flagged", "quality.frozen", "--flags-from", str(report)], "did not run"),
    ]
    for extra, message in cases:
        res = cli("metadata", "plan", root, "--world-size", "2", *extra)
        assert res.returncode == 2, (extra, res.stdout, res.stderr)
        assert message in res.stderr and "Traceback" not in res.stderr
        assert len(res.stderr.strip().splitlines()) <= 3, res.stderr


def test_lerobot_written_root_with_excluded_episodes(tmp_path):
    import shutil

    root = tmp_path / "rec40"
    shutil.copytree(REC40, root)
    res = cli("metadata", "plan", str(root), "--world-size", "4", "--workers", "1",
              "--exclude-episodes", "0,5-7", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    ds = open_dataset(str(root))
    drawn = np.concatenate(_drawn(ds, load_plan(ds, 4, 1)))
    episode_of = np.repeat(ds.column("episode_index"), ds.column("length"))
    assert not np.isin(episode_of[drawn], [0, 5, 6, 7]).any()
    assert cli("validate", str(root), "--checks", "plans").returncode == 0


def test_prepare_exclude_flagged_writes_plans_without_them_and_passes(make_sample):
    root = make_sample(**QUALITY_SPEC)
    frozen = QUALITY_CORRUPTIONS["frozen_action"](root)
    res = cli("prepare", str(root), "--world-size", "2", "--workers", "2",
              "--exclude-flagged", "quality.frozen", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    [step] = [s for s in doc["steps"] if s["name"] == "plans"]
    ex = step["detail"]["plans"][0]["excluded"]
    assert ex["episodes"] == 1 and list(ex["reasons"]) == ["quality.frozen"]
    ds = open_dataset(str(root))
    plan = load_plan(ds, 2, 2)
    assert frozen.episode not in set(plan.items[:, 0].tolist())
    assert frozen.episode in {r[0] for r in plan.doc["excluded"]["ranges"]}
    # the same run again keeps the plans; without the exclusion they are rewritten
    again = json.loads(cli("prepare", str(root), "--world-size", "2", "--workers", "2",
                           "--exclude-flagged", "quality.frozen", "--json").stdout)  # fmt: skip
    [step] = [s for s in again["steps"] if s["name"] == "plans"]
    assert step["status"] == "skipped"
    plain = cli("prepare", str(root), "--world-size", "2", "--workers", "2")
    assert plain.returncode == 0 and "plans      done" in plain.stdout, plain.stdout
    assert frozen.episode in set(load_plan(ds, 2, 2).items[:, 0].tolist())
