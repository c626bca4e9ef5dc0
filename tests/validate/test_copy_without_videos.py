"""``validate`` of a copy ``prepare --out`` made without ``--videos`` (data and metadata only, on
LeRobot's vid24): the missing videos are warnings naming the option that copies them, so the copy
passes as prepare's own validation said; a video missing from a copy made with ``--videos``, or
from any other root, stays an error."""

from __future__ import annotations

import json

from tests.app.hostile import cli, copy_fixture, ok


def _report(root) -> tuple[int, list[dict]]:
    run = cli("validate", root, "--json")
    doc = json.loads(run.stdout)
    return run.returncode, [f for f in doc["findings"] if f["check"] == "info.videos"]


def test_copy_without_videos_warns_and_names_the_option(tmp_path):
    src = copy_fixture("vid24", tmp_path / "src")
    out = tmp_path / "out"
    ok(cli("prepare", src, "--out", out, "--quiet"))
    assert not (out / "videos").exists()
    code, found = _report(out)
    assert code == 0 and len(found) == 4, found  # two cameras x two files
    assert {f["severity"] for f in found} == {"warning"}
    assert all("--videos" in f["message"] and str(src) in f["message"] for f in found)


def test_video_missing_from_a_copy_with_videos_is_an_error(tmp_path):
    src = copy_fixture("vid24", tmp_path / "src")
    out = tmp_path / "out"
    ok(cli("prepare", src, "--out", out, "--videos", "--quiet"))
    assert _report(out) == (0, [])
    (out / "videos/observation.images.top/chunk-000/file-001.mp4").unlink()
    code, found = _report(out)
    assert code == 1 and [f["severity"] for f in found] == ["error"], found


def test_video_missing_from_a_root_is_an_error(tmp_path):
    root = copy_fixture("vid24", tmp_path / "root")
    (root / "videos/observation.images.wrist/chunk-000/file-000.mp4").unlink()
    code, found = _report(root)
    assert code == 1 and [f["severity"] for f in found] == ["error"], found
