"""``edit --images-to-video`` on img6 (LeRobot 0.6.1's recorder, two image features stored as
PNG bytes in the data rows): the features become video declared as LeRobot 0.6.1 declares it,
the image columns leave the data files, every decoded frame is within 40 dB PSNR of its source
image with frame count and timestamps exact, stats keep LeRobot's (3,1,1) image shape, the
output validates; a bad request is one line, exit 2; a stream that fails verification is never
published."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.core.errors import DatasetError
from episodekit.writers import image_video
from episodekit.writers.edit import EditSpec, edit

av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-m", "episodekit.cli"]
SRC = FIXTURES / "img6"
CAMS = ("observation.images.wrist", "observation.images.top")
# LeRobot 0.6.1's info block of a video feature (its recorder's, fixture lang5), size aside
LEROBOT_INFO = json.loads((FIXTURES / "lang5/meta/info.json").read_text())["features"][
    "observation.images.top"
]["info"]


def rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    return pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)


def source_images(key: str) -> dict[tuple[int, int], np.ndarray]:
    """``{(episode, frame): RGB}`` of the source's image column ``key``."""
    t = rows(SRC)
    out = {}
    for e, f, cell in zip(t["episode_index"].to_pylist(), t["frame_index"].to_pylist(),
                          t[key].to_pylist()):  # fmt: skip
        out[(e, f)] = np.asarray(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"))
    return out


def decoded(root: Path, key: str) -> dict[tuple[int, int], np.ndarray]:
    """``{(episode, frame): RGB}`` decoded from ``root``'s video of ``key`` through its episodes
    table (each episode at ``from_timestamp``), checking every frame's timestamp."""
    ds = open_dataset(str(root))
    fps = ds.fps
    frames: dict[str, list] = {}
    out = {}
    for row, e in enumerate(ds.column("episode_index").tolist()):
        rel = ds.video_path(
            key,
            int(ds.column(f"videos/{key}/chunk_index")[row]),
            int(ds.column(f"videos/{key}/file_index")[row]),
        )
        if rel not in frames:
            with av.open(ds.join(rel)) as c:
                frames[rel] = [(fr.time, fr.to_ndarray(format="rgb24")) for fr in c.decode(video=0)]
        start = float(ds.column(f"videos/{key}/from_timestamp")[row])
        end = float(ds.column(f"videos/{key}/to_timestamp")[row])
        n = int(ds.column("length")[row])
        assert end - start == pytest.approx(n / fps, abs=1e-9)
        first = round(start * fps)
        for i in range(n):
            t, img = frames[rel][first + i]
            assert t == pytest.approx(start + i / fps, abs=1e-6)
            out[(e, i)] = img
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return image_video.psnr_db(a, b)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("i2v") / "out"
    r = subprocess.run([*CLI, "edit", str(SRC), "--out", str(out), "--images-to-video", "--json"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return out, json.loads(r.stdout)


def test_images_become_lerobot_video_features(converted):
    out, report = converted
    info = json.loads((out / "meta/info.json").read_text())
    src = json.loads((SRC / "meta/info.json").read_text())
    assert (
        info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    )
    for key in CAMS:
        f = info["features"][key]
        assert f["dtype"] == "video"
        assert f["shape"] == src["features"][key]["shape"]
        assert f["names"] == src["features"][key]["names"]
        assert f["info"] == LEROBOT_INFO  # same size (96x128) and defaults as LeRobot 0.6.1
        assert list(f["info"]) == list(LEROBOT_INFO)
    assert info["total_frames"] == src["total_frames"] == report["frames"]
    assert report["images_to_video"]["features"] == list(CAMS)
    assert report["images_to_video"]["min_rgb_psnr_db"] >= 40
    assert report["images_to_video"]["min_psnr_db"] >= image_video.MIN_PSNR_DB


def test_image_columns_leave_the_data_files(converted):
    out, _ = converted
    a, b = rows(SRC), rows(out)
    assert not set(CAMS) & set(b.column_names)
    hf = json.loads(b.schema.metadata[b"huggingface"])["info"]["features"]
    assert not set(CAMS) & set(hf) and "action" in hf
    for name in b.column_names:
        assert b[name].equals(a[name]), name
    eps = pq.read_table(open_dataset(str(out)).join("meta/episodes/chunk-000/file-000.parquet"))
    for key in CAMS:
        for field in ("chunk_index", "file_index", "from_timestamp", "to_timestamp"):
            assert f"videos/{key}/{field}" in eps.column_names


@pytest.mark.parametrize("key", CAMS)
def test_every_frame_decodes_within_40_db_of_its_image(converted, key):
    out, _ = converted
    want, got = source_images(key), decoded(out, key)
    assert sorted(got) == sorted(want)  # every frame, none extra, timestamps checked
    worst = min(psnr(got[k], want[k]) for k in want)
    assert worst >= 40, worst


def test_stats_keep_lerobot_image_shape(converted):
    out, _ = converted
    stats = json.loads((out / "meta/stats.json").read_text())
    src = json.loads((SRC / "meta/stats.json").read_text())
    for key in CAMS:
        for k in ("min", "max", "mean", "std"):
            assert np.asarray(stats[key][k]).shape == (3, 1, 1)
            np.testing.assert_allclose(stats[key][k], src[key][k], rtol=1e-6)  # re-aggregated
    eps = pq.read_table(open_dataset(str(out)).join("meta/episodes/chunk-000/file-000.parquet"))
    assert np.asarray(eps["stats/observation.images.top/mean"][0].as_py()).shape == (3, 1, 1)


def test_output_validates_deep_and_rerun_is_a_no_op(converted):
    out, _ = converted
    r = subprocess.run([*CLI, "validate", str(out), "--deep"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    again = subprocess.run([*CLI, "edit", str(SRC), "--out", str(out), "--images-to-video"],
                           capture_output=True, text=True)  # fmt: skip
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_one_key_with_frames_cut(tmp_path):
    """Only the named feature is encoded (the other stays an image column); frames dropped
    inside an episode are left out of the video too, and the stats are recomputed."""
    out = tmp_path / "out"
    spec = EditSpec(images_to_video=("observation.images.top",), drop_frames=np.array([[2, 1, 4]]),
                    drop_episodes=(4,))  # fmt: skip
    r = edit(str(SRC), out, spec)
    assert r.write.images_to_video["features"] == ["observation.images.top"]
    info = json.loads((out / "meta/info.json").read_text())
    assert info["features"]["observation.images.wrist"]["dtype"] == "image"
    assert "observation.images.wrist" in rows(out).column_names
    want = source_images("observation.images.top")
    got = decoded(out, "observation.images.top")
    src = open_dataset(str(SRC))
    lengths = dict(zip(src.column("episode_index").tolist(), src.column("length").tolist()))
    expect = {}
    new_e = 0
    for e in sorted(lengths):
        if e == 4:
            continue
        kept = [f for f in range(lengths[e]) if not (e == 2 and 1 <= f < 4)]
        for i, f in enumerate(kept):
            expect[(new_e, i)] = want[(e, f)]
        new_e += 1
    assert sorted(got) == sorted(expect)
    assert min(psnr(got[k], expect[k]) for k in expect) >= 40
    assert r.write.stats.startswith("computed while writing (1 episode cut inside)")
    stats = json.loads((out / "meta/stats.json").read_text())["observation.images.top"]
    assert np.asarray(stats["mean"]).shape == (3, 1, 1)
    assert 0 < np.asarray(stats["mean"]).min() and np.asarray(stats["max"]).max() <= 1


@pytest.mark.parametrize(
    "args, words",
    [
        (["--images-to-video", "action"], "--images-to-video action: a float32 feature"),
        (["--images-to-video", "nope"], "--images-to-video nope: no such feature"),
        (
            [
                "--images-to-video",
                "observation.images.top",
                "--remove-feature",
                "observation.images.top",
            ],
            "also given to --remove-feature",
        ),  # fmt: skip
    ],
)
def test_bad_requests_are_one_line_exit_2(args, words, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([*CLI, "edit", str(SRC), "--out", str(out), *args],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert not out.exists()


def test_a_dataset_without_images_is_exit_2(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([*CLI, "edit", str(FIXTURES / "rec40"), "--out", str(out),
                        "--images-to-video"], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2
    assert "has no image feature stored in parquet" in r.stderr.strip().splitlines()[-1]
    assert not out.exists()


def test_a_stream_failing_verification_is_not_published(tmp_path, monkeypatch):
    """Frames encoded wrong (inverted here) are caught by reading the file back: nothing is
    published, no staging folder is left."""
    real = image_video._writer

    class Inverting:
        def __init__(self, w):
            self.w, self.path, self.container = w, w.path, w.container

        @property
        def bytes(self):
            return self.w.bytes

        def write(self, frames, keyframe_first=True):
            self.w.write(255 - frames, keyframe_first)

        def close(self):
            self.w.close()

    monkeypatch.setattr(image_video, "_writer", lambda *a: Inverting(real(*a)))
    out = tmp_path / "out"
    with pytest.raises(DatasetError, match="failed verification, nothing was published.*PSNR"):
        edit(str(SRC), out, EditSpec(images_to_video=("all",)))
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name != "out"]


def test_files_roll_over_at_the_video_size_limit(tmp_path):
    """A small ``video_files_size_in_mb``: a new file once the current one reaches it (episodes
    whole, each file's timestamps from 0), every frame still in place."""
    import shutil

    src = tmp_path / "src"
    shutil.copytree(SRC, src)
    info = json.loads((src / "meta/info.json").read_text())
    info["video_files_size_in_mb"] = 0.0006  # ~600 bytes (its video: ~4 KB): several files
    (src / "meta/info.json").write_text(json.dumps(info, indent=4))
    out = tmp_path / "out"
    r = edit(str(src), out, EditSpec(images_to_video=("observation.images.top",)))
    ds = open_dataset(str(out))
    files = ds.column("videos/observation.images.top/file_index")
    assert r.write.images_to_video["video_files"] == len(set(files.tolist())) >= 3
    assert np.all(np.diff(files) >= 0)
    start = ds.column("videos/observation.images.top/from_timestamp")
    first_of_file = np.r_[True, files[1:] != files[:-1]]
    assert np.all(start[first_of_file] == 0) and np.all(start[~first_of_file] > 0)
    want, got = source_images("observation.images.top"), decoded(out, "observation.images.top")
    assert sorted(got) == sorted(want)
    assert min(psnr(got[k], want[k]) for k in want) >= 40
    v = subprocess.run([*CLI, "validate", str(out), "--deep"], capture_output=True, text=True)
    assert v.returncode == 0, v.stdout + v.stderr


def test_killed_after_encoding_publishes_nothing_and_the_rerun_completes(tmp_path):
    """kill -9 once the videos are encoded (while the staged stats are written): --out stays
    as it was, the source untouched; the rerun removes the killed run's staging folder."""
    from episodekit.core.atomic import KILL_HOOK_ENV
    from tests.app.hostile import cli, copy_fixture, ok, tree

    src = copy_fixture("img6", tmp_path / "src")
    out = tmp_path / "out"
    before = tree(src)
    argv = ["edit", src, "--out", out, "--images-to-video"]
    killed = cli(*argv, env={KILL_HOOK_ENV: "stats.json"})
    assert killed.returncode == -9, killed.stderr
    assert not out.exists()  # not even a folder holding a lock file (issue 48)
    staged = [p for p in tmp_path.iterdir() if ".episodekit-" in p.name]
    assert len(staged) == 1 and list(staged[0].rglob("*.mp4"))  # killed after encoding
    ok(cli(*argv))
    assert (out / "meta/info.json").exists()
    assert not [p for p in tmp_path.iterdir() if ".episodekit-" in p.name]
    assert tree(src) == before


def test_images_too_small_for_the_encoder_are_one_line_exit_2(make_sample, tmp_path):
    """The sample writer's 2x2 PNGs: libsvtav1 needs 4x4; one line naming the feature, no
    encoder traceback, nothing published."""
    src = make_sample(episodes=3, images=True, copy=False)
    out = tmp_path / "out"
    r = subprocess.run([*CLI, "edit", str(src), "--out", str(out), "--images-to-video"],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "observation.images.wrist: 2x2 images" in last and "Traceback" not in r.stderr
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".episodekit-" in p.name]


def test_psnr_of_a_large_frame_far_off_is_its_true_low_value():
    # 1080p off by 200 everywhere: the squared differences sum past 2**31 (int32 wrapped: NaN)
    a = np.zeros((1080, 1920, 3), np.uint8)
    b = np.full_like(a, 200)
    want = 10 * np.log10(255.0**2 / 200.0**2)
    assert image_video.psnr_db(a, b) == pytest.approx(want, abs=1e-9)
    assert image_video.psnr_db(a, a) == float("inf")
