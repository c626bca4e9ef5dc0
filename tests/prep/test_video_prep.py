"""``prep videos``: re-encode for random access with exact frames and timestamps, PSNR reported,
info.json updated, reruns skip, failures and kills leave every mp4 old or new."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from episodekit.validate.runner import validate

av = pytest.importorskip("av")

from episodekit.core.video import container_comment, probe  # noqa: E402
from episodekit.loaders.frames import FrameDataset  # noqa: E402
from episodekit.prep.videos import rewrite_videos, settings_tag  # noqa: E402
from episodekit.sample import read_frame_code  # noqa: E402

CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
SPEC = dict(
    episodes=6,
    tasks=2,
    seed=9,
    mean_length=20,
    videos=1,
    video_codec="h264",
    gop=250,
    video_files_size_in_mb=0.01,
)


def _mp4s(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.glob("videos/*/*/*.mp4")}


def test_gop250_source_to_gop2_keeps_every_frame_and_timestamp(make_sample):
    root = make_sample(**SPEC)
    before = {rel: probe(root / rel) for rel in _mp4s(root)}
    assert all(ix.keyframe.sum() < ix.num_frames / 4 for ix in before.values())  # long GOPs
    result = rewrite_videos(str(root), codec="av1", gop=2, timing_frames=4)
    assert not result.failed and result.info_updated
    for f in result.files:
        assert f.status == "rewritten" and f.psnr_db >= 35
        assert f.access_fps_before > 0 and f.access_fps_after > 0
        old, new = before[f.file], probe(root / f.file)
        np.testing.assert_array_equal(new.pts, old.pts)
        assert f.frames == old.num_frames and new.codec == "av1"
        assert np.diff(np.flatnonzero(new.keyframe)).max() <= 2
        assert new.keyframe[old.keyframe].all()  # episode starts stay keyframes
        assert container_comment(root / f.file) == settings_tag("av1", 2, 30, True)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.images.cam0"]["info"]["video.codec"] == "av1"
    report = validate(str(root), checks="video", deep=True)
    assert report.findings == []
    fds = FrameDataset(root, speed=False, video_backend="pyav")
    for i in range(0, len(fds), 5):
        assert read_frame_code(fds[i]["observation.images.cam0"]) == i
    # A rerun skips every file (resumable), and changes nothing.
    snapshot = _mp4s(root)
    again = rewrite_videos(str(root), codec="av1", gop=2, timing_frames=0)
    assert {f.status for f in again.files} == {"skipped"} and not again.info_updated
    assert _mp4s(root) == snapshot


def test_failed_verification_keeps_the_source_and_exits_1(make_sample):
    root = make_sample(**SPEC)
    snapshot = _mp4s(root)
    proc = subprocess.run(
        [*CLI, "prep", "videos", str(root), "--min-psnr", "200", "--timing-frames", "0", "-q"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr
    assert "below 200 dB; source kept" in proc.stdout
    assert _mp4s(root) == snapshot
    assert not [p for p in root.rglob(".*tmp-*")]
    info = json.loads((root / "meta/info.json").read_text())
    assert info["features"]["observation.images.cam0"]["info"]["video.codec"] == "h264"


def test_killed_run_leaves_every_mp4_old_or_new_and_a_rerun_finishes(make_sample):
    root = make_sample(**{**SPEC, "episodes": 10, "mean_length": 40, "video_size": (96, 128)})
    old = {rel: hashlib.sha256(b).hexdigest() for rel, b in _mp4s(root).items()}
    assert len(old) >= 3
    proc = subprocess.Popen(
        [*CLI, "prep", "videos", str(root), "--timing-frames", "0", "-q"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    # Kill as soon as the second file is being written (one done, one half-written).
    while time.time() < deadline and proc.poll() is None:
        temps = list(root.rglob(".file-*tmp-*"))
        done = [r for r in old if container_comment(root / r) is not None] if temps else []
        if temps and done:
            break
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    new_files = 0
    for rel, digest in old.items():
        path = root / rel
        if hashlib.sha256(path.read_bytes()).hexdigest() == digest:
            continue
        ix = probe(path)  # a complete, verified file
        assert container_comment(path) == settings_tag("av1", 2, 30, True)
        assert ix.codec == "av1"
        new_files += 1
    assert 1 <= new_files < len(old)
    result = rewrite_videos(str(root), timing_frames=0)
    statuses = [f.status for f in result.files]
    assert statuses.count("skipped") == new_files and "failed" not in statuses
    assert not list(root.rglob(".file-*tmp-*"))
    assert validate(str(root), checks="video,info").findings == []


def test_without_pyav_prep_videos_says_what_to_install(tmp_path, make_sample):
    root = make_sample(**SPEC)
    shadow = tmp_path / "shadow" / "av"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError('No module named av')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    proc = subprocess.run(
        [*CLI, "prep", "videos", str(root)], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "pip install 'episodekit[video]'" in proc.stderr
    # The loader without PyAV: paths and timestamps as before; asking to decode names the extra.
    code = (
        "import sys\n"
        "from episodekit.loaders.frames import FrameDataset\n"
        "from episodekit.core.errors import EnvironmentProblem\n"
        f"s = FrameDataset({str(root)!r}, speed=False)[0]['observation.images.cam0']\n"
        "assert set(s) == {'path', 'timestamp'}\n"
        "try:\n"
        f"    FrameDataset({str(root)!r}, speed=False, video_backend='pyav')\n"
        "except EnvironmentProblem as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'episodekit[video]'" in proc.stdout


def test_prepare_videos_gop_reencodes_once(make_sample):
    from episodekit.prepare import prepare

    root = make_sample(**SPEC)
    first = prepare(str(root), world_sizes=(2,), num_workers=1, jobs=1, videos_gop=4)
    steps = {s.name: s for s in first.steps}
    assert first.ok and steps["videos"].status == "done"
    assert "meta/info.json" in steps["videos"].changed
    for rel in _mp4s(root):
        assert np.diff(np.flatnonzero(probe(root / rel).keyframe)).max() <= 4
    second = prepare(str(root), world_sizes=(2,), num_workers=1, jobs=1, videos_gop=4)
    assert {s.name: s.status for s in second.steps}["videos"] == "skipped"


def test_prepare_revalidates_after_a_video_changes(make_sample):
    from episodekit.prepare import prepare

    root = make_sample(**SPEC)
    args = dict(world_sizes=(2,), num_workers=1, jobs=1)
    assert prepare(str(root), **args).ok
    assert {s.name: s.status for s in prepare(str(root), **args).steps}["validate"] == "skipped"
    mp4 = sorted(root.glob("videos/*/*/*.mp4"))[0]
    mp4.write_bytes(mp4.read_bytes()[:100])  # cut short after the passing validation
    again = prepare(str(root), **args)
    assert not again.ok
    assert any("video.readable" in str(f) for f in again.steps[-1].detail["first_errors"])
