"""``episodekit edit`` as a user runs it (a subprocess) on copies of datasets LeRobot wrote and on
a sample with seeded quality problems: the output validates with 0 errors, ``prepare`` skips its
row-group step, ``--drop-flagged`` drops exactly the flagged episodes, and every failure is one
line with the right exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from episodekit.core.dataset import open_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import QUALITY_SPEC, quality_duplicate, quality_frozen_action  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
DROP = "-dac_override,-dac_read_search,-fowner"
SETPRIV = ["setpriv", "--bounding-set", DROP, "--inh-caps", DROP]


def run(*args: object, prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [*(prefix or []), *CLI, *map(str, args)], capture_output=True, text=True, timeout=600
    )
    assert "Traceback" not in r.stderr, r.stderr
    return r


def error_line(r: subprocess.CompletedProcess) -> str:
    lines = [x for x in r.stderr.splitlines() if x.startswith("Error")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def copy_of(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


@pytest.mark.parametrize("name", ["rec40", "edited35", "vid24"])
def test_edit_validates_and_prepare_skips_rowgroups(name, tmp_path):
    if name == "vid24":
        pytest.importorskip("av")
    src = copy_of(name, tmp_path)
    out = tmp_path / "out"
    r = run("edit", src, "--out", out, "--drop-episodes", "3,12", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["status"] == "written" and sorted(d["dropped"]) == ["12", "3"]
    v = run("validate", out, "--json")
    assert v.returncode == 0 and json.loads(v.stdout)["counts"]["error"] == 0, v.stdout
    p = run("prepare", out, "--json")
    assert p.returncode == 0, p.stderr
    steps = {s["name"]: s for s in json.loads(p.stdout)["steps"]}
    assert steps["rowgroups"]["status"] == "skipped"
    again = run("edit", src, "--out", out, "--drop-episodes", "3,12")
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_drop_flagged_removes_exactly_the_seeded_episodes(make_sample, tmp_path):
    root = make_sample(**QUALITY_SPEC)
    frozen = quality_frozen_action(root).episode
    dup = quality_duplicate(root).episode
    checks = "quality.frozen,quality.duplicate"
    r = run("edit", root, "--out", tmp_path / "a", "--drop-flagged", checks, "--json")
    assert r.returncode == 0, r.stderr
    assert sorted(map(int, json.loads(r.stdout)["dropped"])) == sorted([frozen, dup])
    # the same from a report file
    report = tmp_path / "report.json"
    v = run("validate", root, "--checks", checks, "--json")
    report.write_text(v.stdout)
    r = run("edit", root, "--out", tmp_path / "b", "--drop-flagged", checks, "--report", report)
    assert r.returncode == 0, r.stderr
    ds = open_dataset(str(tmp_path / "b"))
    assert ds.num_episodes == QUALITY_SPEC["episodes"] - 2
    v = run("validate", tmp_path / "b", "--checks", checks, "--json")
    assert not [f for f in json.loads(v.stdout)["findings"] if f["check"] in checks.split(",")]
    bad = run("edit", root, "--out", tmp_path / "c", "--drop-flagged", "quality.jump",
              "--report", report)  # fmt: skip
    assert bad.returncode == 2 and "did not run quality.jump" in error_line(bad)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--drop-episodes", "3,x"], "'x' is not an episode index"),
        (["--drop-episodes", "40"], "episodes [40] are not in"),
        (["--drop-episodes", "1", "--keep-episodes", "2"], "not both"),
        (["--remove-feature", "nope"], "no such feature"),
        (["--remove-feature", "index"], "LeRobot datasets need that column"),
        (["--rename-task", "nope"], "expected OLD=NEW"),
        (["--drop-flagged", "quality.nope"], "unknown check 'quality.nope'"),
        (["--keep-episodes", "50-60"], "are not in"),
    ],
)
def test_bad_options_are_one_line_exit_2(args, message, tmp_path):
    src = copy_of("rec40", tmp_path)
    r = run("edit", src, "--out", tmp_path / "out", *args)
    assert r.returncode == 2 and message in error_line(r), r.stderr
    assert not (tmp_path / "out" / "meta").exists()


def test_missing_root_foreign_out_and_out_inside_the_source(tmp_path):
    src = copy_of("rec40", tmp_path)
    r = run("edit", tmp_path / "nope", "--out", tmp_path / "out", "--drop-episodes", "1")
    assert r.returncode == 2 and "no such folder" in error_line(r)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep me")
    r = run("edit", src, "--out", foreign, "--drop-episodes", "1")
    assert r.returncode == 2 and "not written by episodekit" in error_line(r)
    assert sorted(os.listdir(foreign)) == ["mine.txt"]
    r = run("edit", src, "--out", src / "edited", "--drop-episodes", "1")
    assert r.returncode == 2 and "it is inside the source dataset" in error_line(r)
    assert not (src / "edited").exists()


def test_read_only_out_is_exit_2(tmp_path):
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: chmod does not stop writes")
    src = copy_of("rec40", tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    prefix = SETPRIV if os.geteuid() == 0 else []
    try:
        probe = subprocess.run([*prefix, "touch", str(ro / "x")], capture_output=True)
        if probe.returncode == 0:
            pytest.skip("cannot make a folder read-only for this user here")
        r = run("edit", src, "--out", ro / "out", "--drop-episodes", "1", prefix=prefix)
        assert r.returncode == 2 and "Permission denied" in error_line(r), r.stderr
    finally:
        ro.chmod(0o755)
    assert not (ro / "out").exists()


def test_split_then_merge_as_a_user_runs_them(tmp_path):
    src = copy_of("edited35", tmp_path)
    r = run("split", src, "--out", tmp_path / "parts", "--fractions", "train=0.8,val=0.2",
            "--seed", "3", "--by", "task", "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    parts = json.loads(r.stdout)["splits"]
    assert sorted(parts) == ["train", "val"]
    assert sum(p["episodes"] for p in parts.values()) == 35
    m = run("merge", tmp_path / "parts/train", tmp_path / "parts/val", "--out", tmp_path / "m",
            "--json")  # fmt: skip
    assert m.returncode == 0, m.stderr
    d = json.loads(m.stdout)
    assert d["episodes"] == 35 and d["frames"] == open_dataset(str(src)).num_frames
    bad = run("split", src, "--out", tmp_path / "p2", "--fractions", "train=0.8,val=0.3")
    assert bad.returncode == 2 and "sum to 1.1" in error_line(bad)
    one = run("merge", src, "--out", tmp_path / "m2")
    assert one.returncode == 2 and "at least two ROOTS" in error_line(one)
