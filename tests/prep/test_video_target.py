"""``prep videos`` leaves video that meets the random-access target alone (LeRobot's default AV1
among it), re-encodes only what misses it (or everything with ``--force``), keeps one codec per
camera, writes a prepared copy with ``--out`` that a rerun finds done, and ``prepare --out
--videos --videos-gop`` settles. Run as a user runs them: subprocesses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from episodekit.core.video import VideoIndex, container_comment, probe  # noqa: E402
from episodekit.prep.video_target import (  # noqa: E402
    Target,
    longest_gop,
    start_positions,
    target_problem,
)
from episodekit.prep.videos import reencode_file, rewrite_videos  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-m", "episodekit.cli"]
GOP250 = dict(
    episodes=6,
    tasks=2,
    seed=9,
    mean_length=20,
    videos=1,
    video_codec="h264",
    gop=250,
    video_files_size_in_mb=0.01,
)


def cli(*args, ok: int | None = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    if ok is not None:
        assert proc.returncode == ok, proc.stdout + proc.stderr
    return proc


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and modification time (ns)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def mp4s(root: Path) -> list[Path]:
    return sorted(root.glob("videos/*/*/*.mp4"))


def _index(keyframes: list[bool], codec: str = "av1") -> VideoIndex:
    n = len(keyframes)
    return VideoIndex(
        "x.mp4", codec, 64, 48, "yuv420p", 30.0, Fraction(1, 15360),
        np.arange(n, dtype=np.int64) * 512, np.array(keyframes), False,
    )  # fmt: skip


def test_target_is_codec_gop_and_a_keyframe_at_every_episode_start():
    every2 = _index([True, False] * 6)
    starts = start_positions(every2, np.array([0.0, 4 / 30, 10 / 30]))
    assert starts.tolist() == [0, 4, 10] and longest_gop(every2) == 2
    assert target_problem(every2, starts, Target(2)) is None
    assert target_problem(every2, starts, Target(4)) is None  # a shorter GOP is fine
    assert "up to 2 frames apart" in target_problem(every2, starts, Target(1))
    assert "--codec h264" in target_problem(every2, starts, Target(2, "h264"))
    late = start_positions(every2, np.array([0.0, 5 / 30]))  # frame 5 is not a keyframe
    assert "do not start on a keyframe (first at 0.167 s)" in target_problem(
        every2, late, Target(2)
    )
    assert longest_gop(_index([False, True, False])) == 3  # no keyframe first: the whole file
    assert "not one the loader decodes" in target_problem(
        _index([True] * 4, "mpeg2video"), np.array([0]), Target(2)
    )


def test_lerobot_av1_is_left_alone(tmp_path):
    root = tmp_path / "vid24"
    shutil.copytree(FIXTURES / "vid24", root)
    before = snapshot(root)
    doc = json.loads(cli("prep", "videos", root, "--json").stdout)
    assert doc["counts"] == {"rewritten": 0, "copied": 0, "skipped": 4, "failed": 0}
    assert all("meets the random-access target" in f["message"] for f in doc["files"])
    assert not doc["info_updated"]
    text = cli("prep", "videos", root, "--gop", "4").stdout  # keyframes 2 apart: also <= 4
    assert "4 file(s) already meet the random-access target" in text and "--force" in text
    after = snapshot(root)
    assert {k: v for k, v in after.items() if k != ".episodekit.lock"} == before


def test_force_reencodes_and_a_codec_asked_for_is_part_of_the_target(make_sample):
    root = make_sample(**{**GOP250, "video_codec": "h264", "gop": 2})
    assert cli("prep", "videos", root, "--json").stdout.count('"skipped"') == 1 + len(mp4s(root))
    forced = json.loads(
        cli("prep", "videos", root, "--force", "--json", "--timing-frames", "0").stdout
    )
    assert forced["counts"]["rewritten"] == len(mp4s(root)) and forced["info_updated"]
    assert {probe(p).codec for p in mp4s(root)} == {"av1"}
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.images.cam0"]["info"]["video.codec"] == "av1"
    asked = json.loads(cli("prep", "videos", root, "--codec", "h264", "--json").stdout)
    assert asked["counts"]["rewritten"] == len(mp4s(root))
    assert all("--codec h264 asked" in f["message"] for f in asked["files"])
    assert {probe(p).codec for p in mp4s(root)} == {"h264"}
    assert cli("validate", root, "--checks", "video,info").returncode == 0


def test_one_codec_per_camera(make_sample):
    """One file already at h264 GOP 2 (meets the target) in a camera whose other files need a
    re-encode (to av1): it is re-encoded too, so info.json's one video.codec stays true."""
    root = make_sample(**GOP250)
    files = mp4s(root)
    first = probe(files[0])
    reencode_file(files[0], np.flatnonzero(first.keyframe), codec="h264", gop=2)
    result = rewrite_videos(str(root), timing_frames=0)
    by_file = {f.file: f for f in result.files}
    rel0 = str(files[0].relative_to(root))
    assert by_file[rel0].status == "rewritten" and "one codec per camera" in by_file[rel0].message
    assert {probe(p).codec for p in files} == {"av1"}
    assert cli("validate", root, "--checks", "video,info").returncode == 0


def test_out_writes_a_prepared_copy_and_a_rerun_changes_nothing(make_sample, tmp_path):
    src = make_sample(**GOP250)
    source_before = snapshot(src)
    out = tmp_path / "prepared"
    doc = json.loads(
        cli("prep", "videos", src, "--out", out, "--json", "--timing-frames", "0").stdout
    )
    n = len(mp4s(src))
    assert doc["counts"] == {"rewritten": n, "copied": 0, "skipped": 0, "failed": 0}
    assert snapshot(src) == source_before  # the source is untouched
    assert (out / ".episodekit-output").exists()
    for p in mp4s(out):
        ix = probe(p)
        assert ix.codec == "av1" and longest_gop(ix) <= 2 and container_comment(p)
        np.testing.assert_array_equal(ix.pts, probe(src / p.relative_to(out)).pts)
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"]["observation.images.cam0"]["info"]["video.codec"] == "av1"
    assert cli("validate", out).returncode == 0
    out_before = snapshot(out)
    again = json.loads(cli("prep", "videos", src, "--out", out, "--json").stdout)
    assert again["counts"] == {"rewritten": 0, "copied": 0, "skipped": n, "failed": 0}
    assert not again["info_updated"] and again["dataset_files_copied"] == 0
    assert snapshot(out) == out_before
    # Video that meets the target is copied as it is, then found in place.
    good = tmp_path / "good"
    shutil.copytree(FIXTURES / "vid24", good)
    first = json.loads(cli("prep", "videos", good, "--out", tmp_path / "o2", "--json").stdout)
    assert first["counts"]["copied"] == 4 and first["counts"]["rewritten"] == 0
    for p in mp4s(good):
        assert (tmp_path / "o2" / p.relative_to(good)).read_bytes() == p.read_bytes()
    second = json.loads(cli("prep", "videos", good, "--out", tmp_path / "o2", "--json").stdout)
    assert second["counts"]["skipped"] == 4 and not second["info_updated"]


def test_out_refuses_a_foreign_folder_and_one_overlapping_the_source(make_sample, tmp_path):
    src = make_sample(**GOP250)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    for out, why in (
        (foreign, "not written by episodekit"),
        (src / "copy", "refusing to write here: it is inside the source dataset"),
        (src, "refusing to write here: it is the source dataset"),
        (src.parent, "refusing to write here: it holds the source dataset"),
    ):
        proc = cli("prep", "videos", src, "--out", out, ok=2)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error")]
        assert len(errors) == 1 and why in errors[0], proc.stderr
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert not (src / "copy").exists()


def test_prepare_videos_gop_settles_and_leaves_lerobot_video_alone(make_sample, tmp_path):
    src = make_sample(**GOP250)
    args = ["--videos-gop", "2", "--world-size", "2", "--workers", "1", "--json"]
    first = json.loads(cli("prepare", src, *args).stdout)
    steps = {s["name"]: s for s in first["steps"]}
    assert first["ok"] and steps["videos"]["detail"]["counts"]["rewritten"] == len(mp4s(src))
    videos = {p: p.read_bytes() for p in mp4s(src)}
    second = json.loads(cli("prepare", src, *args).stdout)
    steps = {s["name"]: s for s in second["steps"]}
    assert steps["videos"]["status"] == "skipped" and steps["videos"]["changed"] == []
    assert {p: p.read_bytes() for p in mp4s(src)} == videos
    # LeRobot's AV1 through prepare --out --videos: copied as it is, never re-encoded.
    good = tmp_path / "vid24"
    shutil.copytree(FIXTURES / "vid24", good)
    out = tmp_path / "prepared"
    for _ in range(2):
        doc = json.loads(cli("prepare", good, "--out", out, "--videos", *args).stdout)
        steps = {s["name"]: s for s in doc["steps"]}
        assert doc["ok"] and steps["videos"]["status"] == "skipped"
        assert steps["videos"]["detail"]["counts"] == {"rewritten": 0, "skipped": 4, "failed": 0}
    for p in mp4s(good):
        assert (out / p.relative_to(good)).read_bytes() == p.read_bytes()
