"""``episodekit import`` as a user runs it (a subprocess), on the HDF5 fixtures written by the
formats' own tools: the output passes ``validate --deep``, its numbers equal the source's bit for
bit, timestamps are frame_index / fps, the cameras come back through video within a PSNR."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pyarrow.parquet as pq
import pytest
import tomllib

from episodekit.writers.image_video import psnr_db
from tests.app.hostile import cli as ek
from tests.importers.outputs import column, data, decoded

FIX = Path(__file__).parents[1] / "fixtures" / "import"
CAMS = ["cam_high", "cam_left_wrist"]
MIN_PSNR_DB = 28.0  # measured 30.09 dB worst (aloha_raw cam_high: sparse noise pixels), 34.15 jpeg


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("imports")
    out = {}
    for name in ("aloha_raw", "aloha_jpeg", "robomimic.hdf5"):
        r = ek("import", str(FIX / name), "--out", str(base / name))
        assert r.returncode == 0, r.stderr
        assert "(verified)" in r.stdout
        out[name] = base / name
    return out


@pytest.mark.parametrize("name", ["aloha_raw", "aloha_jpeg", "robomimic.hdf5"])
def test_validate_deep_passes(imported, name):
    r = ek("validate", "--deep", str(imported[name]))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", ["aloha_raw", "aloha_jpeg"])
def test_aloha_numbers_equal_the_source_bit_for_bit(imported, name):
    t = data(imported[name])
    info = json.loads((imported[name] / "meta/info.json").read_text())
    assert info["fps"] == 50 and info["total_episodes"] == 3 and info["total_frames"] == 60
    ep = column(t, "episode_index")
    for e in range(3):
        rows = ep == e
        with h5py.File(FIX / name / f"episode_{e}.hdf5") as f:
            for feat, key in (
                ("observation.state", "observations/qpos"),
                ("observation.velocity", "observations/qvel"),
                ("action", "action"),
            ):
                got = column(t, feat)[rows]
                assert got.dtype == np.float64
                assert got.tobytes() == f[key][()].tobytes()
        fi = column(t, "frame_index")[rows]
        assert np.array_equal(fi, np.arange(20))
        assert column(t, "timestamp")[rows].tobytes() == (fi / 50).astype(np.float32).tobytes()
    assert np.array_equal(column(t, "index"), np.arange(60))


def test_robomimic_numbers_splits_and_fps(imported):
    root = imported["robomimic.hdf5"]
    t = data(root)
    info = json.loads((root / "meta/info.json").read_text())
    assert info["fps"] == 20 and info["total_frames"] == 53
    ep = column(t, "episode_index")
    with h5py.File(FIX / "robomimic.hdf5") as f:
        for e in range(3):
            g = f["data"][f"demo_{e}"]
            rows = ep == e
            state = np.concatenate(
                [g["obs/robot0_eef_pos"][()], g["obs/robot0_gripper_qpos"][()]], axis=1
            )
            assert column(t, "observation.state")[rows].tobytes() == state.tobytes()
            assert column(t, "action")[rows].tobytes() == g["actions"][()].tobytes()
            assert column(t, "next.reward")[rows].tobytes() == g["rewards"][()].tobytes()
            assert column(t, "next.done")[rows].tobytes() == g["dones"][()].tobytes()
            fi = column(t, "frame_index")[rows]
            want = (fi / 20).astype(np.float32)
            assert column(t, "timestamp")[rows].tobytes() == want.tobytes()
    episodes = pq.read_table(next((root / "meta/episodes").rglob("*.parquet")))
    assert episodes["split"].to_pylist() == ["train", "train", "valid"]
    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.column(tasks.num_columns - 1).to_pylist() == ["Lift"]


@pytest.mark.parametrize("name", ["aloha_raw", "aloha_jpeg"])
def test_cameras_through_video_within_psnr(imported, name):
    from episodekit.importers.hdf5 import AlohaReader

    reader = AlohaReader(FIX / name)
    for c in CAMS:
        mp4s = sorted((imported[name] / f"videos/observation.images.{c}").rglob("*.mp4"))
        assert len(mp4s) == 1
        got = decoded(mp4s[0])
        want = np.concatenate(
            [
                np.stack(list(reader.read(ref).images[f"observations/images/{c}"].frames()))
                for ref in reader.episodes()
            ]
        )
        assert got.shape == want.shape == (60, 24, 32, 3)
        worst = min(psnr_db(g, w) for g, w in zip(got, want))
        print(f"{name} {c}: min PSNR {worst:.2f} dB over {len(got)} frames")
        assert worst >= MIN_PSNR_DB


def test_print_map_round_trips(tmp_path, imported):
    r = ek("import", str(FIX / "robomimic.hdf5"), "--print-map")
    assert r.returncode == 0, r.stderr
    doc = tomllib.loads(r.stdout)
    from episodekit.importers.hdf5 import RobomimicReader

    assert doc == RobomimicReader(FIX / "robomimic.hdf5").default_map()
    m = tmp_path / "map.toml"
    m.write_text(r.stdout)
    out = tmp_path / "out"
    r = ek("import", str(FIX / "robomimic.hdf5"), "--out", str(out), "--map", str(m))
    assert r.returncode == 0, r.stderr
    a, b = data(out), data(imported["robomimic.hdf5"])
    assert a.equals(b)


def test_dry_run_writes_nothing(tmp_path):
    out = tmp_path / "out"
    r = ek("import", str(FIX / "aloha_jpeg"), "--out", str(out), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "would import 3 aloha episodes" in r.stdout
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_unknown_layout_is_one_line_exit_2(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    r = ek("import", str(tmp_path), "--out", str(tmp_path / "out"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "is no layout episodekit imports" in lines[0]
    assert "notes.txt" in lines[0] and "--format" in lines[0]


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--fps", "inf", "fps inf: must be a positive number"),
        ("--data-mb", "inf", "Invalid value for '--data-mb'"),
        ("--video-mb", "1e300", "Invalid value for '--video-mb'"),
    ],
)
def test_an_infinite_rate_or_size_is_one_line_exit_2(tmp_path, option, value, says):
    # inf passed the option's range: the sizes failed after every episode was written, the
    # fps crashed (OverflowError) before anything was
    r = ek("import", str(FIX / "aloha_raw"), "--out", str(tmp_path / "out"), option, value)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def test_rerun_is_idempotent(tmp_path):
    out = tmp_path / "out"
    assert ek("import", str(FIX / "aloha_raw"), "--out", str(out)).returncode == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    r = ek("import", str(FIX / "aloha_raw"), "--out", str(out))
    assert r.returncode == 0 and "nothing to do" in r.stdout
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_corrupt_episode_in_the_middle_publishes_nothing(tmp_path):
    src = tmp_path / "aloha"
    shutil.copytree(FIX / "aloha_raw", src)
    path = src / "episode_1.hdf5"
    path.write_bytes(path.read_bytes()[:5000])
    out = tmp_path / "out"
    r = ek("import", str(src), "--out", str(out))
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and str(path) in errors[0]  # one line (the others are progress)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aloha"]  # no staging left


def test_video_none_with_cameras_is_refused(tmp_path):
    r = ek("import", str(FIX / "aloha_raw"), "--out", str(tmp_path / "o"), "--video", "none")
    assert r.returncode == 2 and "--video av1 or h264" in r.stderr
    assert not (tmp_path / "o").exists()


def test_jobs_2_writes_the_same_bytes_as_jobs_1(tmp_path, imported):
    out = tmp_path / "j2"
    r = ek("import", str(FIX / "aloha_jpeg"), "--out", str(out), "--jobs", "2")
    assert r.returncode == 0, r.stderr
    one = imported["aloha_jpeg"]
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    differ = [str(f) for f in files if (one / f).read_bytes() != (out / f).read_bytes()]
    assert differ == []


def test_jobs_2_corrupt_episode_is_one_line_and_publishes_nothing(tmp_path):
    src = tmp_path / "aloha"
    shutil.copytree(FIX / "aloha_raw", src)
    path = src / "episode_1.hdf5"
    path.write_bytes(path.read_bytes()[:5000])
    out = tmp_path / "out"
    r = ek("import", str(src), "--out", str(out), "--jobs", "2")
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and str(path) in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aloha"]


RLDS = FIX / "rlds" / "ek_rlds_fixture"


def test_rlds_imports_verified_with_tfds_values_bit_for_bit(tmp_path):
    """The RLDS fixture (written by TFDS) through the CLI as a user runs it: validate --deep
    passes; state and action equal what TFDS read, episode by episode; tasks per frame (the
    instruction changes within an episode in this fixture)."""
    pytest.importorskip("google_crc32c")
    out = tmp_path / "rlds"
    r = ek("import", str(RLDS / "1.0.0"), "--out", str(out), "--fps", "10")
    assert r.returncode == 0, r.stderr
    v = ek("validate", "--deep", str(out))
    assert v.returncode == 0, v.stdout + v.stderr
    expected = json.loads((RLDS / "expected.json").read_text())["episodes"]
    t = data(out).sort_by("index")
    ep = t["episode_index"].to_numpy()
    for key, feature in (("observation/state", "observation.state"), ("action", "action")):
        got = column(t, feature)
        for e, want in enumerate(expected):
            x = np.frombuffer(bytes.fromhex(want[key]["hex"]), want[key]["dtype"])
            np.testing.assert_array_equal(got[ep == e], x.reshape(want[key]["shape"]))
    ts = t["timestamp"].to_numpy()
    np.testing.assert_array_equal(ts, (t["frame_index"].to_numpy() / 10).astype(ts.dtype))
    tasks = pq.read_table(out / "meta/tasks.parquet")  # LeRobot: the task text is the index
    names = dict(zip(tasks["task_index"].to_pylist(), tasks["__index_level_0__"].to_pylist()))
    text = [names[i] for i in t["task_index"].to_pylist()]
    assert text == [s for want in expected for s in want["language_instruction"]]


def test_format_choices_are_the_registered_readers():
    """--format's choices are written out (the CLI imports no reader at --help time): they must
    be the registry's, so a new reader is never importable by detection only."""
    from episodekit.cli.import_ import import_command
    from episodekit.importers.registry import READERS

    opt = next(p for p in import_command.params if p.name == "fmt" or "--format" in p.opts)
    assert sorted(opt.type.choices) == sorted(READERS)
