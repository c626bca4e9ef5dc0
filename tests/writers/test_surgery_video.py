"""Surgery on vid24 (LeRobot's AV1 videos, two cameras rolling over at different episodes): the
kept episodes' frames decode pixel-equal to the source's (packet copy, no re-encode), the output
validates, merging concatenates videos, and streams that cannot share one are refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset

pytest.importorskip("av")

from episodekit.core.video import VideoFile  # noqa: E402
from episodekit.writers.edit import EditSpec, edit  # noqa: E402
from episodekit.writers.merge import merge  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
DROP = (3, 12)
KEYS = ("observation.images.top", "observation.images.wrist")


@pytest.fixture(scope="module")
def vid(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("vid")
    src = tmp / "vid24"
    shutil.copytree(FIXTURES / "vid24", src)
    edit(str(src), tmp / "out", EditSpec(drop_episodes=DROP))
    return src, tmp / "out"


def episode_frames(ds, key: str, row: int) -> np.ndarray:
    ep = ds.episodes.slice(row, 1).to_pylist()[0]
    rel = ds.video_path(key, ep[f"videos/{key}/chunk_index"], ep[f"videos/{key}/file_index"])
    t0 = ep[f"videos/{key}/from_timestamp"]
    vf = VideoFile(ds.join(rel))
    try:
        return np.stack(vf.read_seconds(t0 + np.arange(ep["length"]) / ds.fps, 1e-4))
    finally:
        vf.close()


@pytest.mark.parametrize("key", KEYS)
def test_kept_frames_are_pixel_equal(vid, key):
    src, out = open_dataset(str(vid[0])), open_dataset(str(vid[1]))
    kept = [e for e in range(src.num_episodes) if e not in DROP]
    assert out.num_episodes == len(kept)
    for new, old in enumerate(kept):
        np.testing.assert_array_equal(episode_frames(out, key, new), episode_frames(src, key, old))


def test_video_metadata_and_validate(vid):
    src, out = vid
    ds = open_dataset(str(out))
    for key in KEYS:
        files = sorted((out / "videos" / key).rglob("*.mp4"))
        assert files and all(f.stat().st_size > 0 for f in files)
        frm = ds.column(f"videos/{key}/from_timestamp")
        fidx = ds.column(f"videos/{key}/file_index")
        starts = np.flatnonzero(np.diff(np.concatenate([[-1], fidx])))
        assert np.all(frm[starts] == 0)  # each new mp4 starts again at 0
    v = subprocess.run([*CLI, "validate", str(out), "--deep", "--json"], capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert v.returncode == 0 and json.loads(v.stdout)["counts"]["error"] == 0, v.stdout


def test_loader_samples_equal_the_source(vid):
    from episodekit.loaders import FrameDataset

    src, out = vid
    delta = {"observation.images.top": [-1 / 30, 0], "action": [0, 1 / 30]}
    a = FrameDataset(str(src), delta_timestamps=delta, speed=False, video_backend="pyav")
    b = FrameDataset(str(out), delta_timestamps=delta, speed=False, video_backend="pyav")
    ds = open_dataset(str(src))
    kept = [e for e in range(ds.num_episodes) if e not in DROP]
    src_rows = np.concatenate(
        [np.arange(ds.column("dataset_from_index")[e], ds.column("dataset_to_index")[e])
         for e in kept]
    )  # fmt: skip
    for i in sorted({0, 1, len(b) - 1, *np.random.default_rng(1).integers(0, len(b), 20).tolist()}):
        sa, sb = a[int(src_rows[i])], b[i]
        for k in sa:
            if k not in ("index", "episode_index", "task_index"):
                np.testing.assert_array_equal(np.asarray(sb[k]), np.asarray(sa[k]), err_msg=k)


def test_merge_concatenates_videos(vid, tmp_path):
    src, out = vid
    merged = tmp_path / "merged"
    r = merge([str(src), str(out)], merged)
    assert r.episodes == 24 + 22 and r.video_files >= 4
    a, m = open_dataset(str(src)), open_dataset(str(merged))
    key = KEYS[1]
    for new, old in ((0, 0), (23, 23), (24, 0), (24 + 3, 4), (45, 23)):
        np.testing.assert_array_equal(episode_frames(m, key, new), episode_frames(a, key, old))


def test_merge_refuses_streams_that_differ(tmp_path):
    from episodekit.sample import write_sample

    a = write_sample(tmp_path / "a", episodes=2, videos=1, video_codec="av1")
    b = write_sample(tmp_path / "b", episodes=2, videos=1, video_codec="h264")
    r = subprocess.run([*CLI, "merge", str(a), str(b), "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "cannot be joined" in r.stderr and "codec av1 vs h264" in r.stderr
    assert not (tmp_path / "m").exists()


def test_a_remote_root_is_read_through_fsspec(vid, tmp_path):
    """A hub-like root (memory://): data read through fsspec, mp4s fetched for the copy."""
    import fsspec

    fs = fsspec.filesystem("memory")
    src = FIXTURES / "vid24"
    for p in src.rglob("*"):
        if p.is_file():
            fs.pipe(f"/surgery-vid24/{p.relative_to(src)}", p.read_bytes())
    try:
        r = edit("memory://surgery-vid24", tmp_path / "out", EditSpec(drop_episodes=DROP))
    finally:
        fs.rm("/surgery-vid24", recursive=True)
    assert r.write.status == "written"
    assert not (tmp_path / "out" / ".sources").exists()
    local = open_dataset(str(vid[1]))
    remote_out = open_dataset(str(tmp_path / "out"))
    assert remote_out.episodes.select(local.episodes.column_names).equals(local.episodes)
    for rel in local.data_files:
        a = (vid[1] / rel).read_bytes()
        assert a == (tmp_path / "out" / rel).read_bytes()
    for p in (vid[1] / "videos").rglob("*.mp4"):
        assert p.read_bytes() == (tmp_path / "out" / p.relative_to(vid[1])).read_bytes()
