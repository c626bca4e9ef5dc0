"""Issue 36: LeRobot 0.6.1 itself reads the stats.json of every dataset we write unchanged, and
its own normalization (``NormalizerProcessorStep``, MEAN_STD / MIN_MAX / QUANTILES / QUANTILE10)
with them equals numpy's on the file's values: ``check_stats_with_lerobot.py`` (in
tests/fixtures/lerobot/tools) run with LeRobot's python on the outputs of ``edit``, ``split``,
``merge``, ``prepare --stats recompute`` and ``repair`` of the LeRobot-written fixtures.

LeRobot is not a dependency (it pins other torch/av versions): opt in with
``EPISODEKIT_LEROBOT_PYTHON=/path/to/lerobot-venv/bin/python`` (see the README in
tests/fixtures/lerobot); skipped otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
TOOL = FIXTURES / "tools" / "check_stats_with_lerobot.py"
LEROBOT = os.environ.get("EPISODEKIT_LEROBOT_PYTHON")
CLI = [sys.executable, "-m", "episodekit.cli"]

pytestmark = pytest.mark.skipif(
    not LEROBOT, reason="EPISODEKIT_LEROBOT_PYTHON (a python with lerobot 0.6.1) is not set"
)


def _cli(*args: str) -> None:
    p = subprocess.run([*CLI, *args], capture_output=True, text=True)
    assert p.returncode == 0, (args, p.stderr)


def _lerobot(*roots: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [LEROBOT, str(TOOL), *map(str, roots)], capture_output=True, text=True, env=env
    )


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    """Each command's output, on copies of the LeRobot-written fixtures."""
    base = tmp_path_factory.mktemp("lerobot-stats")
    for name in ("rec40", "edited35", "vid24", "crash_rec7"):
        shutil.copytree(FIXTURES / name, base / name)
    out = base / "out"
    _cli("edit", str(base / "rec40"), "--out", str(out / "edit"), "--drop-episodes", "3,7,10-12")
    _cli("edit", str(base / "vid24"), "--out", str(out / "edit-video"), "--drop-episodes", "0,5")
    _cli("split", str(base / "rec40"), "--out", str(out / "split"), "--fractions",
         "a=0.7,b=0.3", "--seed", "1")  # fmt: skip
    _cli("merge", str(base / "rec40"), str(base / "edited35"), "--out", str(out / "merge"))
    _cli("prepare", str(base / "edited35"), "--world-size", "2", "--workers", "2", "-j", "1",
         "--stats", "recompute")  # fmt: skip
    _cli("repair", str(base / "crash_rec7"), "--out", str(out / "repair"))
    return {
        "edit": out / "edit",
        "edit-video": out / "edit-video",
        "split-a": out / "split" / "a",
        "split-b": out / "split" / "b",
        "merge": out / "merge",
        "prepare-recompute": base / "edited35",
        "repair": out / "repair",
    }


def test_lerobot_uses_our_stats_unchanged(outputs):
    p = _lerobot(*outputs.values())
    print(p.stdout)  # the tool's line per root (pytest -s shows them)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert len(lines) == len(outputs)
    for line, root in zip(lines, outputs.values()):
        assert line.startswith("LeRobot 0.6.1 uses ") and str(root) in line, line
        assert "in 4 modes equals numpy's" in line


def test_the_check_fails_when_a_value_differs(outputs, tmp_path):
    """One stats.json value changed (action q99, dimension 3, set to its max): LeRobot reads it
    as it is, and the check says it no longer describes the data."""
    root = tmp_path / "edit"
    shutil.copytree(outputs["edit"], root)
    path = root / "meta" / "stats.json"
    stats = json.loads(path.read_text())
    stats["action"]["q99"][3] = stats["action"]["max"][3]
    path.write_text(json.dumps(stats, indent=4))
    p = _lerobot(root)
    assert p.returncode == 1, p.stdout
    assert "action.q99[3]" in p.stderr and "away in rank" in p.stderr, p.stderr
