"""`episodekit prepare` as a user runs it: defaults on a small dataset, feasibility before any
write, a fresh rerun that says "skipped" and nothing else, and progress output by mode."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from episodekit.core.paths import PLAN_DIR
from episodekit.prepare import plan_shapes, prepare

EPISODEKIT = str(Path(sys.executable).parent / "episodekit")
ENV = {k: v for k, v in os.environ.items() if k != "EPISODEKIT_DEBUG"}


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EPISODEKIT, *args], capture_output=True, text=True, env=ENV, timeout=300)


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("episodes", [20, 30])
def test_defaults_on_few_episodes_cut_them_and_write_usable_plans(make_sample, episodes):
    """Issue 29: 8 x 4 = 32 and 64 x 4 = 256 bins cannot all get a whole episode: the defaults
    cut episodes into frame ranges there, say so, and the plans load."""
    from episodekit.loaders import load_plan

    root = make_sample(episodes=episodes)
    p = run("prepare", str(root))
    assert p.returncode == 0, p.stderr
    assert "warning:" not in p.stdout + p.stderr
    assert "world size 8, 64: episodes cut into frame ranges" in p.stdout
    assert "validation PASSED" in p.stdout
    for w in (8, 64):
        assert load_plan(root, w, 4).split_long
    p = run("prepare", str(root), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["warnings"] == [] and p.stderr == ""  # --json: nothing on stderr
    plans = next(s for s in d["steps"] if s["name"] == "plans")["detail"]["plans"]
    assert [(q["world_size"], q["split_long"]) for q in plans] == [(8, True), (64, True)]


def test_no_plan_possible_exits_1_saying_why_never_passed(make_sample):
    root = make_sample(episodes=20)
    # whole episodes only: both world sizes are skipped, so there is no plan to pass
    p = run("prepare", str(root), "--split-long", "no")
    assert p.returncode == 1, p.stdout + p.stderr
    for w, bins in ((8, 32), (64, 256)):
        warning = f"warning: world size {w} skipped: 20 episodes cannot give each of {bins} bins"
        assert warning in p.stderr and warning in p.stdout
    assert "--split-long auto" in p.stderr
    assert "PASSED" not in p.stdout
    assert "no shard plan: every world size was skipped" in p.stdout
    assert "prepare FAILED at step plans" in p.stdout
    assert not (root / PLAN_DIR).exists() or not any((root / PLAN_DIR).iterdir())
    # fewer frames than bins: no cutting helps
    tiny = make_sample(episodes=3, mean_length=20)
    p = run("prepare", str(tiny), "--world-size", "64", "--json")
    assert p.returncode == 1
    d = json.loads(p.stdout)
    assert d["ok"] is False and "cannot fill" in d["warnings"][0]


def test_fresh_rerun_says_skipped_and_nothing_else(make_sample):
    root = make_sample(episodes=40, style="edited")
    assert run("prepare", str(root), "--world-size", "2", "--workers", "2").returncode == 0
    before = tree(root)
    p = run("prepare", str(root), "--world-size", "2", "--workers", "2")
    assert p.returncode == 0, p.stderr
    assert tree(root) == before
    # stderr is not a terminal here: plain, one line per step.
    assert p.stderr.splitlines() == [
        f"{s}: skipped" for s in ("rowgroups", "speed", "costs", "plans", "stats", "validate")
    ]
    table = p.stdout.split("  balance")[0]
    assert "MB/s" not in p.stdout and "rewriting" not in p.stdout + p.stderr
    for step in ("rowgroups", "speed", "costs", "plans", "validate"):
        [line] = [x for x in table.splitlines() if x.strip().startswith(step)]
        assert line.split()[1:] == ["skipped", line.split()[2]], line  # status and seconds only


def test_a_bad_value_exits_2_and_out_leaves_the_source_alone(make_sample, tmp_path):
    root = make_sample(episodes=20, style="edited")
    before = tree(root)
    # A usage error, and an environment error found by the library before its first write.
    assert run("prepare", str(root), "--target-mb", "-5").returncode == 2
    out = tmp_path / "out"
    p = run("prepare", str(root), "--out", str(out), "--cost", "compute", "--world-size", "2")
    assert p.returncode == 0, p.stderr
    assert tree(root) == before  # --out never touches the source


def test_plan_shapes_decides_before_writing(make_sample):
    from episodekit.core.dataset import open_dataset

    root = make_sample(episodes=20)
    ds = open_dataset(str(root))
    too_many = ds.num_frames + 1  # more bins than frames: not even cutting helps
    shapes = plan_shapes(ds, [1, 8, too_many], 4, "no")
    assert [s.skip is None for s in shapes] == [True, False, False]
    auto = plan_shapes(ds, [1, 8, too_many], 4, "auto")
    assert [(s.split_long, s.skip is None) for s in auto] == [(False, True), (True, True)] + [
        (False, False)
    ]
    assert "frames cannot fill" in auto[2].skip
    r = prepare(str(root), world_sizes=(1, 8), num_workers=4, jobs=1, split_long="auto")
    assert r.ok and r.warnings == []
    assert sorted(p.name for p in (root / PLAN_DIR).iterdir()) == ["ws1_nw4.json", "ws8_nw4.json"]


def test_plans_step_retries_with_cut_episodes_or_skips(make_sample, monkeypatch):
    """A partition that leaves a bin empty (rowgroup runs can, where the count check passed) is
    infeasible (PlanInfeasible): ``auto`` retries with cut episodes; ``no`` skips that world
    size with a warning."""
    from episodekit.metadata.plans import build
    from episodekit.metadata.plans.options import PlanInfeasible

    calls = []
    real = build.plan_for_dataset

    def picky(ds, costs, world_size, num_workers, options=None, **kw):
        calls.append(options.split_long)
        if not options.split_long and world_size == 2:
            raise PlanInfeasible("1 of 8 bins got no frames")
        return real(ds, costs, world_size, num_workers, options, **kw)

    monkeypatch.setattr(build, "plan_for_dataset", picky)
    root = make_sample(episodes=20)
    r = prepare(str(root), world_sizes=(1, 2), num_workers=4, jobs=1, split_long="auto")
    assert r.ok and r.warnings == [] and calls == [False, False, True]
    plan = json.loads((root / PLAN_DIR / "ws2_nw4.json").read_text())
    assert plan["split_long"] is True
    assert r.step("plans").detail["cut_episodes"] == [2]
    calls.clear()
    r = prepare(str(root), world_sizes=(1, 2), num_workers=4, jobs=1, split_long="no", force=True)
    assert r.ok and calls == [False, False]
    assert r.warnings == ["world size 2 skipped: 1 of 8 bins got no frames"]


def test_plans_step_does_not_mistake_a_bug_for_infeasibility(make_sample, monkeypatch):
    """Only PlanInfeasible means "cut episodes or skip": any other ValueError (a bug in a
    partitioner) is not retried with cut episodes, nor turned into a skipped world size; it
    stops the run before any plan is written."""
    from episodekit.metadata.plans import build

    calls = []

    def buggy(items, unit, bins, split_long):
        calls.append(bool(split_long))
        raise ValueError("a bug in a partitioner")

    monkeypatch.setattr(build, "partition_contiguous", buggy)  # locality rowgroup: the default
    root = make_sample(episodes=20)
    with pytest.raises(ValueError, match="a bug in a partitioner"):
        prepare(str(root), world_sizes=(2,), num_workers=4, jobs=1, split_long="auto")
    assert calls == [False]  # no retry with cut episodes
    assert not (root / PLAN_DIR).exists()


def test_progress_bars_on_a_terminal_plain_lines_otherwise(make_sample, on_tty):
    """Under a pseudo-terminal the rewrite shows a tqdm bar; --quiet gives the plain lines."""
    root = make_sample(episodes=30, style="edited", data_files_size_in_mb=1)
    text = on_tty("prep", "rowgroups", str(root), "--target-mb", "0.25", "--jobs", "1")
    assert "prep rowgroups:" in text and "files" in text and "%|" in text  # a tqdm bar
    quiet = on_tty("prep", "rowgroups", str(root), "--target-mb", "0.5", "--jobs", "1", "-q")
    assert "%|" not in quiet


def test_a_fresh_rerun_starts_no_process_pool(make_sample, monkeypatch):
    import concurrent.futures

    root = make_sample(episodes=60, style="edited", data_files_size_in_mb=1)
    first = prepare(str(root), target_mb=0.25, world_sizes=(2,), num_workers=2, jobs=2)
    assert first.ok and first.step("rowgroups").detail["counts"]["rewritten"] >= 2

    class NoPool:
        def __init__(self, *a, **k):
            raise AssertionError("a process pool was started for a fresh root")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", NoPool)
    second = prepare(str(root), target_mb=0.25, world_sizes=(2,), num_workers=2, jobs=2)
    assert second.ok and {s.status for s in second.steps} == {"skipped"}
    # --force really rewrites, so it needs the pool: the patch proves the check is live.
    with __import__("pytest").raises(AssertionError, match="process pool"):
        prepare(str(root), target_mb=0.25, world_sizes=(2,), num_workers=2, jobs=2, force=True)


def test_out_report_names_the_output_never_its_staging_folder(make_sample, tmp_path):
    """`prepare --out DIR --json` works in a hidden staging folder: what it reports (every step's
    detail) names DIR, the folder the user asked for, never the staging folder it swapped in."""
    src, out = make_sample(episodes=20), tmp_path / "out"
    proc = run("prepare", str(src), "--out", str(out), "--world-size", "2", "--workers", "2",
               "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "episodekit-partial" not in proc.stdout
    steps = {s["name"]: s for s in json.loads(proc.stdout)["steps"]}
    assert steps["rowgroups"]["detail"]["out"] == str(out.resolve())
