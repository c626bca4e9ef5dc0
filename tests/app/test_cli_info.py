"""The CLI shell: --version, info (human and --json), sample, clean errors."""

from __future__ import annotations

import json

from click.testing import CliRunner

from episodekit import __version__
from episodekit.cli import main


def test_version():
    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0 and __version__ in r.output


def test_sample_then_info_json(tmp_path):
    root = tmp_path / "ds"
    r = CliRunner().invoke(main, ["sample", str(root), "--episodes", "25", "--style", "edited"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["info", str(root), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["episodes"] == 25
    assert d["codebase_version"] == "v3.0"
    assert d["frames"] == sum(f["rows"] for f in d["data_files"])
    assert all(f["row_groups"] == 1 for f in d["data_files"])
    assert d["page_index_all"] is False
    assert sum(t["episodes"] for t in d["lengths_per_task"]) == 25
    assert {"dtype", "shape"} <= set(d["features"]["action"])


def test_info_human(tmp_path):
    root = tmp_path / "ds"
    CliRunner().invoke(main, ["sample", str(root), "--episodes", "12"])
    r = CliRunner().invoke(main, ["info", str(root)])
    assert r.exit_code == 0
    assert "episodes        12" in r.output
    assert "data/chunk-000/file-000.parquet" in r.output


def test_info_bad_root_is_one_line_error(tmp_path):
    r = CliRunner().invoke(main, ["info", str(tmp_path / "nope")])
    assert r.exit_code == 2
    assert "no such folder" in r.output and "Traceback" not in r.output
