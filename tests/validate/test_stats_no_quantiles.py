"""Stats without quantiles (what LeRobot's v2.1 -> v3.0 converter leaves: v2.1 had none) are a
warning, not an error; any other missing stat is still an error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

CLI = "import sys; from episodekit.cli import main; sys.exit(main())"
REC40 = Path(__file__).parents[1] / "fixtures" / "lerobot" / "rec40"
QUANTILES = ("q01", "q10", "q50", "q90", "q99")


def validate(root: Path) -> tuple[int, dict]:
    res = subprocess.run(
        [sys.executable, "-c", CLI, "validate", str(root), "--json", "--checks", "stats"],
        capture_output=True,
        text=True,
    )
    return res.returncode, json.loads(res.stdout)


def strip(root: Path, keys: tuple[str, ...]) -> None:
    """Remove ``keys`` from stats.json and the matching stats/*/<key> episode columns."""
    stats = json.loads((root / "meta/stats.json").read_text())
    for entry in stats.values():
        for k in keys:
            entry.pop(k, None)
    (root / "meta/stats.json").write_text(json.dumps(stats))
    for f in (root / "meta/episodes").rglob("*.parquet"):
        t = pq.read_table(f)
        drop = [c for c in t.column_names if c.startswith("stats/") and c.rsplit("/", 1)[1] in keys]
        pq.write_table(t.drop_columns(drop), f)


@pytest.fixture
def rec40(tmp_path) -> Path:
    root = tmp_path / "rec40"
    shutil.copytree(REC40, root)
    return root


def test_lerobot_converted_stats_without_quantiles_pass_with_a_warning(rec40):
    strip(rec40, QUANTILES)
    code, doc = validate(rec40)
    assert code == 0, doc["findings"]
    present = [f for f in doc["findings"] if f["check"] == "stats.present"]
    assert present and all(f["severity"] == "warning" for f in present)
    assert all("no quantiles" in f["message"] for f in present)
    assert "episodekit metadata stats" in present[0]["message"]


@pytest.mark.parametrize("keys", [("mean",), ("std", "q50"), ("count",)])
def test_other_missing_stats_are_still_errors(rec40, keys):
    strip(rec40, keys)
    code, doc = validate(rec40)
    assert code == 1
    assert any(f["check"] == "stats.present" and f["severity"] == "error" for f in doc["findings"])


def test_untouched_rec40_has_no_stats_finding(rec40):
    code, doc = validate(rec40)
    assert code == 0 and not [f for f in doc["findings"] if f["check"] == "stats.present"]
