"""Mixture plans (issue 16): coverage per source, exact quotas and draws, balance, staleness
naming the source, single-root plans untouched, the CLI as a user runs it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from fractions import Fraction as F

import numpy as np
import pytest

from episodekit.loaders import PlanError, StalePlanError, load_plan
from episodekit.metadata.mixture.plan import ensure_mixture_plans, format_mixture_plan
from episodekit.metadata.mixture.plan_file import MixturePlan
from episodekit.metadata.mixture.spec import MixtureError, largest_remainder
from episodekit.metadata.plans.build import ensure_plans
from episodekit.sample import write_sample


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("mix")
    a = write_sample(base / "a", episodes=40, tasks=3, seed=1, mean_length=40)
    b = write_sample(base / "b", episodes=24, tasks=2, seed=2, mean_length=30, state_dim=6)
    return base, a, b


def spec(a, b, **extra):
    return {
        "sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 3, "name": "bee"}],
        **extra,
    }


def source_frames(root):
    from episodekit.core.dataset import open_dataset

    ds = open_dataset(str(root))
    return ds.column("episode_index"), ds.column("length")


@pytest.mark.parametrize("locality", ["none", "rowgroup"])
@pytest.mark.parametrize("policy", ["trim", "wrap"])
def test_plan_covers_every_source_episode_once_with_exact_draws(roots, tmp_path, locality, policy):
    _, a, b = roots
    [(path, doc, changed)] = ensure_mixture_plans(
        spec(a, b), tmp_path / "p", [2], 3, locality=locality, policy=policy
    )
    assert changed
    plan = load_plan(tmp_path / "p", 2, 3)
    assert isinstance(plan, MixturePlan) and plan.source_names == ["a", "bee"]
    B = 6
    total = sum(int(source_frames(r)[1].sum()) for r in (a, b))
    expect = total // B * B if policy == "trim" else -(-total // B) * B
    assert plan.quotas.sum() == expect == plan.samples_per_worker * B
    # weights 1:3, no balance: the quotas are the largest-remainder split of the epoch
    assert plan.quotas.tolist() == largest_remainder(expect, [F(1), F(3)])
    assert (plan.draws.sum(1) == plan.samples_per_worker).all()
    assert (plan.draws.sum(0) == plan.quotas).all()
    for s, root in enumerate((a, b)):
        ep, length = source_frames(root)
        sel = plan.item_source == s
        items = plan.items[sel]
        got = np.bincount(items[:, 0], items[:, 2] - items[:, 1], minlength=len(ep))
        assert (got == length).all()  # every frame of every episode exactly once
        bins = np.repeat(np.arange(B), np.diff(plan.bin_offsets))[sel]
        assert len(np.unique(bins)) == B  # every bin holds frames of every source
    assert plan.doc["balance"]["plan"]["max_over_lower_bound"] < 1.1
    assert plan.doc["share_deviation"]["max_abs"] <= 1 / plan.samples_per_worker


def test_rerun_is_fresh_and_changes_rewrite(roots, tmp_path):
    _, a, b = roots
    out = tmp_path / "p"
    [(_, _, c1)] = ensure_mixture_plans(spec(a, b), out, [2], 2)
    raw = (out / "ws2_nw2.json").read_bytes()
    [(_, _, c2)] = ensure_mixture_plans(spec(a, b), out, [2], 2)
    assert c1 and not c2 and (out / "ws2_nw2.json").read_bytes() == raw
    [(_, doc, c3)] = ensure_mixture_plans(spec(a, b, balance="frames"), out, [2], 2)
    assert c3 and doc["mixture"]["balance"] == "frames"
    assert json.loads((out / "mixture.json").read_text())["balance"] == "frames"


def test_stale_source_names_it(roots, tmp_path):
    base, a, b = roots
    b2 = tmp_path / "b2"
    shutil.copytree(b, b2)
    ensure_mixture_plans(spec(a, b2), tmp_path / "p", [1], 2)
    load_plan(tmp_path / "p", 1, 2)
    shutil.rmtree(b2)
    write_sample(b2, episodes=25, tasks=2, seed=2, mean_length=30, state_dim=6)
    with pytest.raises(StalePlanError, match=r"source 'bee' .* changed.*--force"):
        load_plan(tmp_path / "p", 1, 2)
    load_plan(tmp_path / "p", 1, 2, check_fresh=False)  # still readable without the check


def test_edited_mixture_plan_is_refused(roots, tmp_path):
    _, a, b = roots
    ensure_mixture_plans(spec(a, b), tmp_path / "p", [1], 2)
    f = tmp_path / "p" / "ws1_nw2.json"
    doc = json.loads(f.read_text())
    doc["bin_draws"][0][0] += 1
    f.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="bin_draws"):
        load_plan(tmp_path / "p", 1, 2)
    doc["bin_draws"][0][0] -= 1
    doc["items"]["source"][0] = 1 - doc["items"]["source"][0]
    f.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match="digest"):
        load_plan(tmp_path / "p", 1, 2)


def test_single_root_plans_have_no_source_column(roots, tmp_path):
    _, a, _ = roots
    root = tmp_path / "a"
    shutil.copytree(a, root)
    [(path, _, _)] = ensure_plans(str(root), [2], 2)
    doc = json.loads(open(path).read())
    assert "sources" not in doc and "source" not in doc["items"] and "bin_draws" not in doc
    plan = load_plan(str(root), 2, 2)
    assert plan.item_source is None and plan.items.shape[1] == 3


def test_small_source_is_cut_and_tiny_source_is_an_error(roots, tmp_path):
    base, a, _ = roots
    tiny = write_sample(tmp_path / "tiny", episodes=3, tasks=1, seed=4, mean_length=20)
    s = {"sources": [{"root": str(a), "weight": 1}, {"root": str(tiny), "weight": 1}]}
    [(_, doc, _)] = ensure_mixture_plans(s, tmp_path / "p", [4], 2)  # 3 episodes, 8 bins
    assert doc["sources"][1]["split_long"] is True
    with pytest.raises(MixtureError, match="source 'tiny' has .* fewer than the plan's"):
        ensure_mixture_plans(s, tmp_path / "q", [10], 8)


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *args], capture_output=True, text=True, cwd=cwd
    )


def test_cli_mixture_plan(roots, tmp_path):
    _, a, b = roots
    m = tmp_path / "m.json"
    m.write_text(json.dumps(spec(a, b)))
    r = run_cli("metadata", "plan", "--mixture", str(m), "--world-size", "2", "--workers", "2",
                "--out", str(tmp_path / "p"), "--locality", "rowgroup")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "bee" in r.stdout and "written" in r.stdout
    r = run_cli("metadata", "plan", "--mixture", str(m), "--world-size", "2")
    assert r.returncode == 2 and "--out" in r.stderr
    bad = '{"sources": [{"root": "' + str(a) + '", "weight": 0}]}'
    r = run_cli("metadata", "plan", "--mixture", bad, "--world-size", "2", "--out", str(tmp_path))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0
    assert "sources[0].weight" in r.stderr


def test_cli_info_mixture(roots, tmp_path):
    _, a, b = roots
    m = tmp_path / "m.json"
    m.write_text(json.dumps(spec(a, b, balance="episodes", epoch_frames=1000)))
    r = run_cli("info", "--mixture", str(m), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    # episodes balance: 1 x 40 vs 3 x 24 = 40:72 of 1000 -> 357.14, 642.86 -> 357, 643
    assert [s["quota"] for s in d["sources"]] == [357, 643]
    assert [s["effective_weight"] for s in d["sources"]] == pytest.approx([40 / 112, 72 / 112])
    assert d["sources"][1]["repeats"] == pytest.approx(643 / d["sources"][1]["frames"])
    r = run_cli("info", "--mixture", str(m))
    assert r.returncode == 0 and "bee" in r.stdout and "643" in r.stdout
    r = run_cli("info", str(a), "--mixture", str(m))
    assert r.returncode == 2 and "not both" in r.stderr


def test_prepare_mixture_prepares_sources_then_plans(roots, tmp_path):
    from episodekit.metadata.costs import ensure_costs
    from episodekit.mixture import prepare_mixture

    _, a, b = roots
    a2, b2 = tmp_path / "a", tmp_path / "b"
    shutil.copytree(a, a2)
    shutil.copytree(b, b2)
    ensure_costs(str(a2))  # a cost table from before the row-group rewrite must not survive it
    s = {"sources": [{"root": str(a2), "weight": 1}, {"root": str(b2), "weight": 2}]}
    r = prepare_mixture(s, str(tmp_path / "p"), world_sizes=[2], num_workers=2)
    assert r.ok, {n: x.to_dict() for n, x in r.sources.items()}
    assert [c for _, _, c in r.plans] == [True]
    load_plan(tmp_path / "p", 2, 2)
    again = prepare_mixture(s, str(tmp_path / "p"), world_sizes=[2], num_workers=2)
    assert [c for _, _, c in again.plans] == [False]
    for res in again.sources.values():
        assert {st.status for st in res.steps} <= {"skipped"}


def test_prepare_mixture_refuses_a_dataset_out_before_touching_sources(roots, tmp_path):
    _, a, b = roots
    a2, b2 = tmp_path / "a", tmp_path / "b"
    shutil.copytree(a, a2)
    shutil.copytree(b, b2)
    before = sorted(str(p.relative_to(a2)) for p in a2.rglob("*"))
    m = json.dumps({"sources": [{"root": str(a2), "weight": 1}, {"root": str(b2), "weight": 1}]})
    r = run_cli("prepare", "--mixture", m, "--out", str(a2), "--world-size", "2", "-j", "1")
    assert r.returncode == 2 and "is a dataset root" in r.stderr  # a bad option: usage
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert sorted(str(p.relative_to(a2)) for p in a2.rglob("*")) == before  # nothing prepared


@pytest.mark.parametrize("flag", [["--push-to-hub", "me/x"], ["--videos"], ["--videos-gop", "2"]])
def test_prepare_mixture_refuses_root_only_options(roots, tmp_path, flag):
    _, a, b = roots
    r = run_cli("prepare", "--mixture", json.dumps(spec(a, b)), "--out", str(tmp_path / "p"), *flag)
    assert r.returncode == 2 and f"{flag[0]} is for ROOT" in r.stderr, r.stderr
    assert not (tmp_path / "p").exists()


def test_stale_hint_rebuilds_the_same_kind_of_plan(roots, tmp_path):
    """The rerun command a stale plan names, run as written, keeps the plan's options."""
    import shlex

    _, a, b = roots
    b2 = tmp_path / "b2"
    shutil.copytree(b, b2)
    ensure_mixture_plans(spec(a, b2), tmp_path / "p", [1], 2, locality="rowgroup", seed=3)
    shutil.rmtree(b2)
    write_sample(b2, episodes=25, tasks=2, seed=2, mean_length=30, state_dim=6)
    with pytest.raises(StalePlanError) as err:
        load_plan(tmp_path / "p", 1, 2)
    cmd = shlex.split(str(err.value).split("recompute it with: ")[1])
    assert cmd[:3] == ["episodekit", "metadata", "plan"]
    r = run_cli(*cmd[1:])
    assert r.returncode == 0, r.stderr
    plan = load_plan(tmp_path / "p", 1, 2)
    assert (plan.doc["locality"], plan.doc["seed"]) == ("rowgroup", 3)


@pytest.mark.parametrize(
    "command", [["info"], ["metadata", "plan", "--world-size", "2", "--out", "p"]]
)
def test_missing_mixture_file_is_a_usage_error(tmp_path, command):
    """A --mixture path that does not exist is exit 2, like a missing ROOT (not a data error)."""
    missing = tmp_path / "nope.json"
    r = run_cli(*command, "--mixture", str(missing), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"Error: {missing}: no such mixture file"


def test_rename_onto_a_kept_feature_is_refused(roots, tmp_path):
    """A rename onto a feature the source keeps gave two features one name, and one of them was
    silently served; the loader and `metadata stats --mixture` refuse it naming the rename."""
    from episodekit.loaders import FrameDataset

    _, a, b = roots
    s = spec(a, b, features={"action": {"drop": True}})
    s["sources"][0]["rename"] = {"action": "observation.state"}
    ensure_mixture_plans(s, tmp_path / "p", [1], 1)
    msg = "sources[0].rename maps 'action' and 'observation.state' of source 'a' to one feature"
    with pytest.raises(MixtureError, match=re.escape(msg)):
        FrameDataset(load_plan(tmp_path / "p", 1, 1))
    r = run_cli("metadata", "stats", "--mixture", json.dumps(s), "--out", str(tmp_path / "p"))
    assert r.returncode == 1 and msg in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_inline_relative_roots_are_kept_absolute(roots, tmp_path):
    """Inline JSON roots are relative to the current directory: the plan records them absolute,
    so a training job started elsewhere still finds the sources."""
    from episodekit.loaders import FrameDataset

    _, a, b = roots
    shutil.copytree(a, tmp_path / "a")
    inline = json.dumps({"sources": [{"root": "a", "weight": 1}, {"root": "./a", "weight": 1,
                                                                  "name": "a2"}]})  # fmt: skip
    r = run_cli("metadata", "plan", "--mixture", inline, "--world-size", "1", "--out", "p",
                "--workers", "1", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    plan = load_plan(tmp_path / "p", 1, 1)  # this process's cwd is not tmp_path
    assert [s["root"] for s in plan.sources] == [str(tmp_path / "a")] * 2
    assert len(FrameDataset(plan)) == plan.samples_per_worker


# -- costs that vary per frame: the two-ended density split ----------------------------------


def test_density_split_by_hand():
    """3 episodes of 4 frames at densities 1, 2, 3 (mean 2) into 2 bins of 6 frames: bin 0
    takes 3 frames from the cheap end (cost 3) and 3 from the dear end (9): 12 = 6 x 2; bin 1
    the middle (1 + 8 + 3 = 12). The input order does not matter, only the densities."""
    from episodekit.metadata.plans.density_split import build_density_plan, density_split

    items, bin_of = density_split(np.array([4, 4, 4]), np.array([4.0, 8, 12]), np.array([6, 6]))
    assert items.tolist() == [[0, 0, 3], [2, 1, 4], [0, 3, 4], [1, 0, 4], [2, 0, 1]]
    assert bin_of.tolist() == [0, 0, 1, 1, 1]
    plan = build_density_plan(np.array([12.0, 4, 8]), np.array([4, 4, 4]), 1, 2,
                              episode_index=np.array([5, 7, 9]), relabel=False)  # fmt: skip
    assert plan["items"].tolist() == [[5, 1, 4], [7, 0, 3], [5, 0, 1], [7, 3, 4], [9, 0, 4]]
    assert plan["bin_offsets"].tolist() == [0, 2, 5]
    assert plan["bin_cost"].tolist() == [12.0, 12.0] and plan["bin_frames"].tolist() == [6, 6]
    assert plan["split_episodes"] == 2 and plan["algo_used"]["ranks"] == "density"
    # unequal frame shares are honoured exactly: 4 + 8 frames, costs 2 x 1 + 2 x 3 = 8 and 16;
    # 5 + 7 frames: targets 10 and 14 are a frame's step (2) apart from any reachable cost, the
    # tie goes to the cheaper side: 9 and 15
    dens = np.array([1.0, 2, 3])
    for shares, costs in (([4, 8], [8.0, 16.0]), ([5, 7], [9.0, 15.0])):
        items, bin_of = density_split(np.array([4, 4, 4]), dens * 4, np.array(shares))
        f = items[:, 2] - items[:, 1]
        assert np.bincount(bin_of, f).tolist() == shares
        assert np.bincount(bin_of, f * dens[items[:, 0]]).tolist() == costs
    with pytest.raises(ValueError, match="sum to the 12 frames"):
        density_split(np.array([4, 4, 4]), np.array([4.0, 8, 12]), np.array([6, 5]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_density_split_equal_frames_and_cost(seed):
    """Random sources: every bin gets its frame share exactly, its cost within one frame's
    largest density of share x mean, every frame once, at most 2 cuts per bin."""
    from episodekit.metadata.plans.density_split import density_split, equal_shares

    rng = np.random.default_rng(seed)
    n, B = 200 + 50 * seed, 37
    length = np.clip(rng.lognormal(4, 0.8, n).astype(np.int64), 1, None)
    length[rng.integers(0, n, 3)] = 0  # empty episodes are kept (as empty items)
    cost = length * rng.lognormal(0, 0.6, n)
    shares = equal_shares(int(length.sum()), B)
    assert shares.sum() == length.sum() and shares.max() - shares.min() <= 1
    items, bin_of = density_split(length, cost, shares)
    frames = items[:, 2] - items[:, 1]
    assert (np.bincount(bin_of, frames, B) == shares).all()
    density = cost / np.maximum(length, 1)
    bin_cost = np.bincount(bin_of, frames * density[items[:, 0]], B)
    mean = cost.sum() / length.sum()
    assert np.abs(bin_cost - shares * mean).max() <= density.max()
    assert np.abs(bin_cost - shares * mean).max() > 0  # not trivially equal: densities vary
    # coverage: each episode's pieces tile [0, length) exactly
    o = np.lexsort((items[:, 1], items[:, 0]))
    e, s, t = items[o].T
    assert (np.bincount(e, t - s, n) == length).all()
    first = np.r_[True, e[1:] != e[:-1]]
    assert (s[first] == 0).all() and (s[~first] == t[np.flatnonzero(~first) - 1]).all()
    assert set(e.tolist()) == set(range(n))
    cuts = int((np.bincount(e, minlength=n) > 1).sum())
    assert 0 < cuts <= 2 * B


@pytest.fixture
def byte_roots(roots, tmp_path):
    """Private copies (the bytes cost table is written into each root)."""
    _, a, b = roots
    shutil.copytree(a, tmp_path / "a")
    shutil.copytree(b, tmp_path / "b")
    return tmp_path / "a", tmp_path / "b"


def test_bytes_mixture_uses_the_density_split(byte_roots, tmp_path):
    """Cost model bytes (varies per frame): every (bin, source) holds floor/ceil of the source's
    frames / bins, at the source's mean cost per frame within one frame's largest density; the
    ceil shares sit in the bins that draw ceil(quota / bins); quotas exact; balance <= 1.01."""
    from episodekit.metadata.costs import read_costs

    a, b = byte_roots
    W, K = 2, 3
    B = W * K
    [(_, doc, _)] = ensure_mixture_plans(spec(a, b), tmp_path / "p", [W], K, cost="bytes")
    plan = load_plan(tmp_path / "p", W, K)
    assert [s["algo_used"] for s in doc["sources"]] == ["density", "density"]
    assert doc["algo_used"]["ranks"] == "density"
    assert (plan.draws.sum(0) == plan.quotas).all()
    assert (plan.draws.sum(1) == plan.samples_per_worker).all()
    bin_of = np.repeat(np.arange(B), np.diff(plan.bin_offsets))
    for s, root in enumerate((a, b)):
        table = read_costs(root)
        assert table is not None and "bytes" in str(table.schema.metadata)
        length, cost = table["length"].to_numpy(), table["cost"].to_numpy()
        density = cost / length
        assert density.max() > 1.05 * density.min()  # the case this path is for
        sel = plan.item_source == s
        it = plan.items[sel]
        f = it[:, 2] - it[:, 1]
        frames = np.bincount(bin_of[sel], f, B)
        assert frames.sum() == length.sum() and frames.max() - frames.min() <= 1
        assert (np.bincount(it[:, 0], f, len(length)) == length).all()  # every frame once
        ceil_draws = plan.draws[:, s] == plan.draws[:, s].max()
        if frames.max() > frames.min() and plan.draws[:, s].max() > plan.draws[:, s].min():
            big = frames == frames.max()
            assert (big <= ceil_draws).all() or (ceil_draws <= big).all()  # paired
        cell_cost = np.bincount(bin_of[sel], f * density[it[:, 0]], B)
        mean = cost.sum() / length.sum()
        assert np.abs(cell_cost - frames * mean).max() <= density.max()
        # each frame of the source is drawn floor or ceil of quota / frames times
        r = plan.quotas[s] / length.sum()
        d = plan.draws[:, s]
        assert (d // frames >= np.floor(r)).all() and (-(-d // frames) <= np.ceil(r)).all()
    assert doc["balance"]["plan"]["max_over_lower_bound"] <= 1.01
    text = format_mixture_plan(doc)
    assert text.count("  density, ") == 2 and "cost bytes" in text
    # the frames model and rowgroup locality keep today's path
    [(_, frames_doc, _)] = ensure_mixture_plans(spec(a, b), tmp_path / "f", [W], K)
    assert {s["algo_used"] for s in frames_doc["sources"]} == {"lpt"}
    [(_, rg_doc, _)] = ensure_mixture_plans(
        spec(a, b), tmp_path / "r", [W], K, cost="bytes", locality="rowgroup"
    )
    assert "density" not in {s["algo_used"] for s in rg_doc["sources"]}
    # ... but cut by frames, so every frame is still drawn quota / frames times
    rg = load_plan(tmp_path / "r", W, K)
    bin_of = np.repeat(np.arange(B), np.diff(rg.bin_offsets))
    for s in range(2):
        sel = rg.item_source == s
        f = rg.items[sel][:, 2] - rg.items[sel][:, 1]
        frames = np.bincount(bin_of[sel], f, B)
        assert frames.max() - frames.min() <= 1
    assert rg_doc["draw_rate_deviation"] < 0.05
    assert {s["algo_used"] for s in rg_doc["sources"]} <= {"contiguous-frames",
                                                           "contiguous-split-frames"}  # fmt: skip


def test_validate_accepts_a_density_plan(make_sample, tmp_path):
    """A single-root plan from the density split (items that are frame ranges, one episode in
    several bins) passes `episodekit validate --checks plans` as a user runs it; an edited one
    does not."""
    from episodekit.core.dataset import open_dataset
    from episodekit.metadata.costs import ensure_costs
    from episodekit.metadata.plans.build import plan_path, write_plan
    from episodekit.metadata.plans.density_split import build_density_plan
    from episodekit.metadata.plans.plan_file import encode_plan

    root = make_sample(episodes=20, tasks=2, seed=5, mean_length=40)
    ds = open_dataset(str(root))
    table, _ = ensure_costs(ds, "bytes")
    plan = build_density_plan(
        table["cost"].to_numpy(), table["length"].to_numpy(), 2, 3, seed=4,
        episode_index=table["episode_index"].to_numpy(), cost_model="bytes",
        fingerprint=ds.fingerprint,
    )  # fmt: skip
    assert plan["split_episodes"] > 0
    assert plan["bin_frames"].max() - plan["bin_frames"].min() <= 1
    write_plan(ds, plan)
    r = run_cli("validate", str(root), "--checks", "plans")
    assert r.returncode == 0, r.stdout + r.stderr
    plan["items"][0, 2] -= 1  # a gap in an episode
    (root / plan_path(2, 3)).write_bytes(encode_plan(plan))
    r = run_cli("validate", str(root), "--checks", "plans")
    assert r.returncode == 1 and "gap" in r.stdout + r.stderr


def test_read_only_sources_are_planned_from_costs_computed_in_memory(
    byte_roots, tmp_path, monkeypatch
):
    """A source on read-only storage: its cost table cannot be written, the plan is still made
    (costs computed in memory) and nothing is written into the source."""
    import episodekit.metadata.mixture.plan as mp
    from episodekit.core.errors import EnvironmentProblem

    def read_only(ds, model, **kw):
        raise EnvironmentProblem("read-only file system", str(ds.root))

    monkeypatch.setattr(mp, "ensure_costs", read_only)
    a, b = byte_roots
    before = sorted(p.name for p in (a / "meta").iterdir())
    [(_, doc, _)] = ensure_mixture_plans(spec(a, b), tmp_path / "p", [2], 2, cost="bytes")
    assert sorted(p.name for p in (a / "meta").iterdir()) == before
    assert doc["cost_model"] == "bytes" and sum(doc["quotas"]) == doc["epoch_frames"]
    assert load_plan(tmp_path / "p", 2, 2).samples_per_worker > 0


def test_cap_epoch_rounded_past_the_sources_names_both_numbers():
    """With overflow cap and the wrap policy, an epoch of all the frames rounds up past what the
    sources hold: the error names the epoch the user asked for and the rounded one."""
    from episodekit.metadata.mixture.plan import SourceCosts, build_mixture_plan
    from episodekit.metadata.mixture.spec import parse_mixture

    srcs = [SourceCosts(n, np.arange(10), np.full(10, 50), np.full(10, 50.0)) for n in ("a", "b")]
    srcs[1] = SourceCosts("b", np.arange(9), np.full(9, 51), np.full(9, 51.0))  # 459 frames
    doc = {"sources": [{"root": "/x/a", "weight": 1}, {"root": "/x/b", "weight": 1}]}
    spec = parse_mixture({**doc, "overflow": "cap"})
    with pytest.raises(MixtureError, match=r"epoch_frames 959 rounds up to 960 .*\(959 frames\)"):
        build_mixture_plan(spec, srcs, 4, 4, policy="wrap")
    plan = build_mixture_plan(spec, srcs, 4, 4, policy="trim")
    assert sum(plan["quotas"]) == 944  # trim rounds down: nothing capped away
