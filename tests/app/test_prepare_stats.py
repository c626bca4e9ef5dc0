"""`prepare` and the dataset's own stats (issue 24): stats another tool wrote are kept when they
pass the `stats.*` checks, written where missing or failing, replaced only with `--stats
recompute`; the summary says which and why. `metadata stats` alone still computes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EPISODEKIT = str(Path(sys.executable).parent / "episodekit")
ENV = {k: v for k, v in os.environ.items() if k != "EPISODEKIT_DEBUG"}
# LeRobot-written datasets: the test fixtures, or a folder of them named by LEROBOT_WRITTEN
LEROBOT = Path(
    os.environ.get("LEROBOT_WRITTEN", Path(__file__).resolve().parents[1] / "fixtures" / "lerobot")
)
SUMMARY = "meta/episodekit_stats.parquet"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EPISODEKIT, *args], capture_output=True, text=True, env=ENV, timeout=300)


def stats_files(root: Path) -> dict[str, str]:
    files = [root / "meta/stats.json", *sorted(root.glob("meta/episodes/*/*.parquet"))]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def stats_line(stdout: str) -> str:
    [line] = [x for x in stdout.splitlines() if x.strip().startswith("stats ")]
    return line


def foreign_root(make_sample) -> Path:
    """Stats episodekit computed, then rewritten by "another tool" (same numbers, other bytes,
    no summary of ours): valid, and not ours."""
    root = make_sample(episodes=30, tasks=3, seed=4)
    assert run("metadata", "stats", str(root)).returncode == 0
    doc = json.loads((root / "meta/stats.json").read_text())
    (root / "meta/stats.json").write_text(json.dumps(doc, indent=2))
    (root / SUMMARY).unlink()
    return root


def test_valid_foreign_stats_are_kept_byte_identical(make_sample):
    root = foreign_root(make_sample)
    before = stats_files(root)
    p = run("prepare", str(root), "--world-size", "2", "--workers", "2")
    assert p.returncode == 0, p.stderr
    assert stats_files(root) == before
    assert not (root / SUMMARY).exists()
    line = stats_line(p.stdout)
    assert "skipped" in line and "kept (the dataset's own stats pass the stats checks)" in line
    d = json.loads(
        run("prepare", str(root), "--world-size", "2", "--workers", "2", "--json").stdout
    )
    [st] = [s for s in d["steps"] if s["name"] == "stats"]
    assert st["status"] == "skipped" and st["detail"]["status"] == "kept" and st["changed"] == []
    assert stats_files(root) == before


def test_kept_stats_drop_a_stale_summary_of_ours(make_sample):
    """Another tool rewrote stats.json after episodekit's stats: our summary describes other
    numbers (and would call them stale after a row rewrite): removed, the stats kept."""
    root = make_sample(episodes=30, tasks=3, seed=4, data_files_size_in_mb=1, style="edited")
    assert run("metadata", "stats", str(root)).returncode == 0
    doc = json.loads((root / "meta/stats.json").read_text())
    (root / "meta/stats.json").write_text(json.dumps(doc, indent=1))
    before = stats_files(root)
    p = run("prepare", str(root), "--world-size", "2", "--workers", "2", "--target-mb", "0.25")
    assert p.returncode == 0, p.stdout + p.stderr
    assert stats_files(root) == before and not (root / SUMMARY).exists()
    assert f"kept (the dataset's own stats pass the stats checks; {SUMMARY} of earlier" in (
        stats_line(p.stdout)
    )


def test_stats_recompute_replaces_them_and_says_so(make_sample):
    root = foreign_root(make_sample)
    before = stats_files(root)
    p = run("prepare", str(root), "--world-size", "2", "--workers", "2", "--stats", "recompute")
    assert p.returncode == 0, p.stderr
    assert stats_files(root)["meta/stats.json"] != before["meta/stats.json"]
    assert (root / SUMMARY).exists()
    assert "recomputed (--stats recompute)" in stats_line(p.stdout)
    # ours now: a default rerun finds them fresh
    p = run("prepare", str(root), "--world-size", "2", "--workers", "2")
    assert p.returncode == 0 and stats_line(p.stdout).split()[1] == "skipped"


def test_foreign_stats_failing_a_check_are_written_and_why(make_sample):
    root = foreign_root(make_sample)
    doc = json.loads((root / "meta/stats.json").read_text())
    doc["action"]["min"] = [v + 1e3 for v in doc["action"]["min"]]  # min above max: damage
    (root / "meta/stats.json").write_text(json.dumps(doc, indent=2))
    p = run("prepare", str(root), "--world-size", "2", "--workers", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    line = stats_line(p.stdout)
    assert "done" in line and "written (stats." in line, line
    assert (
        json.loads((root / "meta/stats.json").read_text())["action"]["min"] != doc["action"]["min"]
    )


def test_missing_stats_are_written(make_sample):
    root = foreign_root(make_sample)
    (root / "meta/stats.json").unlink()
    p = run("prepare", str(root), "--world-size", "2", "--workers", "2")
    assert p.returncode == 0, p.stderr
    assert "written (no meta/stats.json)" in stats_line(p.stdout)
    assert (root / "meta/stats.json").exists() and (root / SUMMARY).exists()


def test_metadata_stats_alone_still_computes(make_sample):
    root = foreign_root(make_sample)
    before = stats_files(root)
    p = run("metadata", "stats", str(root))
    assert p.returncode == 0, p.stderr
    assert stats_files(root)["meta/stats.json"] != before["meta/stats.json"]
    assert (root / SUMMARY).exists()


def test_bad_stats_mode_is_a_usage_error(make_sample):
    root = make_sample(episodes=10, copy=False)
    p = run("prepare", str(root), "--stats", "drop")
    assert p.returncode == 2 and "--stats" in p.stderr


@pytest.mark.parametrize("name", ["rec40", "edited35", "vid24"])
def test_lerobot_stats_survive_a_default_prepare_byte_identical(name, tmp_path):
    src = LEROBOT / name
    if not src.is_dir():
        pytest.skip(f"{src} is not on this machine")
    root = tmp_path / name
    shutil.copytree(src, root)
    before = stats_files(root)
    p = run("prepare", str(root))
    assert p.returncode in (0, 1), p.stderr  # validation's verdict is another test's
    assert stats_files(root) == before
    assert "kept" in stats_line(p.stdout)
