"""video.* checks: each corruption of a real sample's mp4s or their metadata is caught by the right
check, with the file and the episode; a clean sample is silent; without PyAV, a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.validate.runner import validate

SPEC = dict(episodes=7, tasks=2, seed=5, mean_length=12, videos=2, video_files_size_in_mb=0.006)
CAM = "observation.images.cam0"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]


def _episodes(root: Path) -> pa.Table:
    return pq.read_table(root / EPISODES)


def _set_columns(root: Path, **cols: np.ndarray) -> None:
    t = _episodes(root)
    for name, values in cols.items():
        t = t.set_column(t.column_names.index(name), name, pa.array(values))
    pq.write_table(t, root / EPISODES)


def _video_findings(root: Path, deep: bool = False) -> list:
    return [f for f in validate(str(root), checks="video", deep=deep).findings]


def _file_with_episodes(root: Path, min_episodes: int = 2) -> tuple[str, np.ndarray]:
    """(relative mp4 of camera 0, its episode rows) for a file holding several episodes."""
    t = _episodes(root)
    fidx = t[f"videos/{CAM}/file_index"].to_numpy()
    for f in np.unique(fidx):
        rows = np.flatnonzero(fidx == f)
        if len(rows) >= min_episodes:
            return f"videos/{CAM}/chunk-000/file-{int(f):03d}.mp4", rows
    raise AssertionError("sample has no file with several episodes")


def _reencode(root: Path, rel: str, rows: np.ndarray, frames_per_row: list[int]) -> None:
    """Rewrite an mp4 whose episodes hold ``frames_per_row`` frames (as a buggy converter would
    write them) and set from/to_timestamp from those actual counts (as the converter does)."""
    from episodekit.core.video import VideoWriter
    from episodekit.sample import synthetic_frames

    t = _episodes(root)
    start = t["dataset_from_index"].to_numpy()
    with VideoWriter(root / rel, 64, 48, 30, codec="av1", gop=2) as w:
        for r, n in zip(rows.tolist(), frames_per_row):
            w.write(synthetic_frames(np.arange(start[r], start[r] + n), 48, 64), True)
    fr = t[f"videos/{CAM}/from_timestamp"].to_numpy().copy()
    to = t[f"videos/{CAM}/to_timestamp"].to_numpy().copy()
    before = np.cumsum([0, *frames_per_row])
    fr[rows] = before[:-1] / 30
    to[rows] = before[1:] / 30
    _set_columns(root, **{f"videos/{CAM}/from_timestamp": fr, f"videos/{CAM}/to_timestamp": to})


@pytest.fixture
def root(make_sample) -> Path:
    pytest.importorskip("av")
    return make_sample(**SPEC)


def _hits(findings, check: str) -> list[tuple[str | None, int | None]]:
    return [(f.file, f.episode) for f in findings if f.check == check]


def test_clean_sample_has_no_video_findings(root):
    report = validate(str(root), deep=True)
    assert "video.frames" in report.checks_run and "video.decode" in report.checks_run
    assert [f for f in report.findings if f.check.startswith("video")] == []
    # Several episodes per file, and the two cameras roll over at different episodes.
    t = _episodes(root)
    f0 = t[f"videos/{CAM}/file_index"].to_numpy()
    f1 = t["videos/observation.images.cam1/file_index"].to_numpy()
    assert len(np.unique(f0)) < len(f0) and not np.array_equal(f0, f1)


@pytest.mark.parametrize("delta", [-1, +1], ids=["video_shorter", "video_longer"])
def test_episode_with_a_frame_too_few_or_too_many_is_video_frames(root, delta):
    rel, rows = _file_with_episodes(root)
    lengths = _episodes(root)["length"].to_numpy()[rows]
    counts = lengths.tolist()
    counts[0] += delta
    _reencode(root, rel, rows, counts)
    episode = int(_episodes(root)["episode_index"].to_numpy()[rows[0]])
    found = _video_findings(root)
    assert _hits(found, "video.frames") == [(rel, episode)]
    assert all(f.severity == "error" for f in found)


def test_shifted_from_timestamp_is_video_timestamps(root):
    rel, rows = _file_with_episodes(root)
    t = _episodes(root)
    r = rows[1]
    fr = t[f"videos/{CAM}/from_timestamp"].to_numpy().copy()
    to = t[f"videos/{CAM}/to_timestamp"].to_numpy().copy()
    fr[r] += 0.4 / 30
    to[r] += 0.4 / 30
    _set_columns(root, **{f"videos/{CAM}/from_timestamp": fr, f"videos/{CAM}/to_timestamp": to})
    found = _video_findings(root)
    episode = int(t["episode_index"].to_numpy()[r])
    assert _hits(found, "video.timestamps") == [(rel, episode)]
    assert "video.frames" not in {f.check for f in found}


def _edit_info(root: Path, key: str, field: str, value) -> None:
    info = json.loads((root / "meta/info.json").read_text())
    info["features"][key]["info"][field] = value
    (root / "meta/info.json").write_text(json.dumps(info))


@pytest.mark.parametrize(
    "field,value,check",
    [
        ("video.fps", 25, "video.fps"),
        ("video.codec", "h264", "video.codec"),
        ("video.width", 128, "video.size"),
        ("video.pix_fmt", "yuv444p", "video.pix_fmt"),
    ],
)
def test_info_json_video_fields_must_match_the_stream(root, field, value, check):
    _edit_info(root, "observation.images.cam1", field, value)
    found = _video_findings(root)
    files = sorted({p.relative_to(root).as_posix() for p in root.glob("videos/*cam1/*/*.mp4")})
    assert sorted(f for f, _ in _hits(found, check)) == files
    assert {f.check for f in found} == {check}


def test_codec_aliases_are_accepted(root):
    _edit_info(root, CAM, "video.codec", "libsvtav1")
    assert _video_findings(root) == []


def test_truncated_file_is_video_readable_with_its_first_episode(root):
    rel, rows = _file_with_episodes(root)
    path = root / rel
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    found = _video_findings(root)
    episode = int(_episodes(root)["episode_index"].to_numpy()[rows[0]])
    assert _hits(found, "video.readable") == [(rel, episode)]


def test_corrupt_payload_is_caught_by_deep_decode_only(root):
    rel, rows = _file_with_episodes(root)
    path = root / rel
    data = bytearray(path.read_bytes())
    # Zero the middle of the media data: the index still parses, the frames do not decode.
    mdat = data.find(b"mdat")
    for i in range(mdat + 8, mdat + 8 + (len(data) - mdat) // 2):
        data[i] = 0
    path.write_bytes(bytes(data))
    assert _video_findings(root) == []
    deep = _video_findings(root, deep=True)
    assert {f.check for f in deep} == {"video.decode"}
    assert _hits(deep, "video.decode")[0][0] == rel


def test_missing_file_is_left_to_info_videos(root):
    rel, _ = _file_with_episodes(root)
    (root / rel).unlink()
    report = validate(str(root), checks="info,video")
    assert {f.check for f in report.findings} == {"info.videos"}


def _without_av(tmp_path: Path) -> dict:
    """An environment in which ``import av`` fails (a shadowing package that raises)."""
    shadow = tmp_path / "shadow" / "av"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError('No module named av')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tmp_path / "shadow")
    return env


def test_without_pyav_sample_videos_says_what_to_install(tmp_path, make_sample):
    env = _without_av(tmp_path)
    cmd = [*CLI, "sample", str(tmp_path / "s"), "-n", "2"]
    proc = subprocess.run([*cmd, "--videos", "1"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "pip install" in proc.stderr and "episodekit[video]" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
    # Everything else works: a sample without videos, and validating it.
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    proc = subprocess.run(
        [*CLI, "validate", str(tmp_path / "s")],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_without_pyav_validate_warns_once_on_a_video_root(tmp_path, make_sample):
    pytest.importorskip("av")
    src = make_sample(**SPEC)
    env = _without_av(tmp_path)
    proc = subprocess.run(
        [*CLI, "validate", str(src), "--json", "--checks", "video"],
        env=env,
        capture_output=True,
        text=True,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 0
    [finding] = report["findings"]
    assert finding["check"] == "video.readable" and finding["severity"] == "warning"
    assert "pip install" in finding["message"]


@pytest.mark.parametrize("codec,preset,faststart", [("av1", "10", False), ("h264", "medium", True)])
def test_sample_tables_give_the_demuxed_timestamps(tmp_path, codec, preset, faststart):
    """The demux-free index (mp4 sample tables) equals demuxing every packet, B-frames too."""
    pytest.importorskip("av")
    from episodekit.core.video import VideoWriter, probe
    from episodekit.sample import synthetic_frames

    path = tmp_path / "v.mp4"
    with VideoWriter(
        path, 64, 48, 30, codec=codec, gop=50, preset=preset, faststart=faststart
    ) as w:
        for a in range(0, 120, 23):  # episodes of 23 frames, each starting on a keyframe
            w.write(synthetic_frames(np.arange(a, min(120, a + 23)), 48, 64), True)
    fast, slow = probe(path), probe(path, demux=True)
    np.testing.assert_array_equal(fast.pts, slow.pts)
    np.testing.assert_array_equal(fast.keyframe, slow.keyframe)
    assert fast.keyframe[np.arange(0, 120, 23)].all() and fast.num_frames == 120
    # Cut short (index at the front with faststart, or at the end): a clear VideoError.
    from episodekit.core.video import VideoError

    path.write_bytes(path.read_bytes()[: path.stat().st_size - 100])
    with pytest.raises(VideoError, match="truncated|cannot"):
        probe(path)


def test_v21_one_mp4_per_episode(make_sample):
    pytest.importorskip("av")
    root = make_sample(episodes=4, tasks=2, seed=2, mean_length=10, videos=1, version="v2.1")
    assert _video_findings(root) == []
    rel = "videos/chunk-000/observation.images.cam0/episode_000002.mp4"
    data = (root / rel).read_bytes()
    (root / rel).write_bytes(data[: len(data) // 2])
    assert _hits(_video_findings(root), "video.readable") == [(rel, 2)]
