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


def _run(*args):
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *map(str, args)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc


def test_info_lists_the_video_files_of_each_camera(tmp_path):
    """`info` said nothing about a root's videos: per camera, the mp4 files the episodes name,
    their total size, and the codec, resolution and fps info.json declares (also in --json);
    LeRobot's vid24 (two files per camera) and a v2.1 root (one mp4 per episode)."""
    import shutil
    from pathlib import Path

    vid24 = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "vid24"
    for root, files in ((vid24, 2), (vid24.parent / "v21vid8", 8)):
        d = json.loads(_run("info", root, "--json").stdout)["videos"]
        assert sorted(d) == sorted(
            k for k, f in json.loads((root / "meta/info.json").read_text())["features"].items()
            if f["dtype"] == "video"
        )  # fmt: skip
        for key, cam in d.items():
            mp4s = [p for p in root.rglob("*.mp4") if key in p.parts]
            assert cam["files"] == files == len(mp4s) and cam["missing_files"] == 0
            assert cam["bytes"] == sum(p.stat().st_size for p in mp4s)
            assert cam["codec"] == "av1" and cam["width"] > 0 and cam["height"] > 0
        text = _run("info", root).stdout
        assert f"video files     {files * len(d)} mp4 files of {len(d)} cameras" in text
        key = sorted(d)[0]
        table = text.split("video files")[1]
        line = next(ln for ln in table.splitlines() if ln.strip().startswith(key))
        assert f"{d[key]['width']}x{d[key]['height']}" in line and "av1" in line
    root = shutil.copytree(vid24, tmp_path / "v")
    next(root.rglob("*.mp4")).unlink()
    d = json.loads(_run("info", root, "--json").stdout)["videos"]
    assert sum(c["missing_files"] for c in d.values()) == 1
    assert "(1 missing)" in _run("info", root).stdout
    assert "video files     none" in _run("info", vid24.parent / "rec40").stdout


def test_one_of_everything_reads_in_the_singular(tmp_path):
    """ "1 row groups", "1 episodes", "1 cameras": every count goes through one helper
    (core/words.plural). A root of one episode, one task, one camera, one row group, through
    the commands that print counts, says no "1 <plural>" and no "(s)"."""
    import re

    root = tmp_path / "one"
    out = [_run("sample", root, "-n", "1", "-t", "1", "--videos", "1")]
    out.append(_run("info", root))
    out.append(_run("validate", root))
    out.append(_run("metadata", "plan", root, "--world-size", "1", "--workers", "1"))
    out.append(_run("metadata", "stats", root))
    out.append(
        _run("prepare", root, "--out", tmp_path / "p", "--world-size", "1", "--workers", "1")
    )
    out.append(_run("edit", root, "--out", tmp_path / "e", "--keep-episodes", "0"))
    text = "\n".join(p.stdout + p.stderr for p in out)
    plural_after_one = re.compile(r"(?<![\d.,])1 (?:[a-z]+ )?[a-z]+s\b")
    assert not plural_after_one.findall(text), plural_after_one.findall(text)
    assert "(s)" not in text
    assert "1 mp4 file of 1 camera" in out[1].stdout and "1 row group;" in out[1].stdout
