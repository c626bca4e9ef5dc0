"""The zarr reader (diffusion policy / UMI ReplayBuffer) against zarr's own reading of fixtures
written by zarr 2.18, zarr 3 and imagecodecs (tests/fixtures/import/make_zarr_fixtures.py), and
``episodekit import`` on them as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import pickle
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

zarr = pytest.importorskip("zarr", minversion="3")
pytest.importorskip("imagecodecs")

from episodekit.importers.episode import MissingExtra, SourceError  # noqa: E402
from episodekit.importers.registry import detect  # noqa: E402
from episodekit.importers.zarr_replay import ZarrReader  # noqa: E402
from episodekit.writers.image_video import psnr_db  # noqa: E402
from tests.app.hostile import cli as ek  # noqa: E402
from tests.importers.outputs import column, data, decoded  # noqa: E402

FIX = Path(__file__).parents[1] / "fixtures" / "import"
NAMES = ["pusht_v2.zarr", "pusht_v3.zarr", "umi.zarr.zip"]
FRAMES = {"pusht_v2.zarr": 53, "pusht_v3.zarr": 53, "umi.zarr.zip": 36}
CAMERA = {"pusht_v2.zarr": "img", "pusht_v3.zarr": "img", "umi.zarr.zip": "camera0_rgb"}
UMI_STATE = ["robot0_eef_pos", "robot0_eef_rot_axis_angle", "robot0_gripper_width"]
MIN_PSNR_DB = 28.0  # measured worst frames: see test_cameras_through_video_within_psnr


def zarr_root(path: Path):
    """The store opened by zarr itself (imagecodecs' numcodecs registered for UMI's JPEG-XL)."""
    from imagecodecs.numcodecs import register_codecs

    register_codecs()
    if path.name.endswith(".zip"):
        return zarr.open_group(store=zarr.storage.ZipStore(path, mode="r"), mode="r")
    return zarr.open_group(str(path), mode="r")


def slices(root) -> list[slice]:
    ends = root["meta/episode_ends"][:].tolist()
    return [slice(a, b) for a, b in zip([0, *ends[:-1]], ends)]


# --------------------------------------------------------------------------------------------
# The reader


@pytest.mark.parametrize("name", NAMES)
def test_detected_as_zarr(name):
    assert detect(FIX / name) is ZarrReader


def test_other_layouts_are_not_zarr():
    for name in ("aloha_raw", "robomimic.hdf5", "rlds/ek_rlds_fixture/1.0.0"):
        assert not ZarrReader.detect(FIX / name)


@pytest.mark.parametrize("name", NAMES)
def test_values_equal_zarr_bit_for_bit(name):
    root = zarr_root(FIX / name)
    reader = ZarrReader(FIX / name)
    assert reader.fps() is None
    assert reader.episodes() == [0, 1, 2]
    data_keys = sorted(f"data/{k}" for k in root["data"].array_keys())
    assert sorted(reader.keys()) == data_keys
    for ref, sl in zip(reader.episodes(), slices(root)):
        ep = reader.read(ref)
        assert ep.length == sl.stop - sl.start
        for k, want in ((k, root[k][sl]) for k in data_keys):
            if k in ep.images:
                got = np.stack(list(ep.images[k].frames()))
            else:
                got = ep.arrays[k]
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes()


def test_keys_and_encodings():
    pusht = ZarrReader(FIX / "pusht_v3.zarr").keys()
    assert pusht["data/img"].kind == "image" and pusht["data/img"].encoding == "raw"
    assert pusht["data/img"].shape == (24, 32, 3)
    assert pusht["data/keypoint"].kind == "array" and pusht["data/keypoint"].shape == (9, 2)
    umi = ZarrReader(FIX / "umi.zarr.zip").keys()
    assert umi["data/camera0_rgb"].encoding == "jxl"
    assert umi["data/robot0_gripper_width"].shape == (1,)


def test_umi_default_map_state_order():
    doc = ZarrReader(FIX / "umi.zarr.zip").default_map()
    assert doc["features"]["observation.state"]["keys"] == [f"data/{k}" for k in UMI_STATE]
    assert doc["features"]["observation.images.camera0_rgb"] == {"keys": ["data/camera0_rgb"]}
    assert "fps" not in doc


def test_reader_pickles_after_use():
    reader = ZarrReader(FIX / "umi.zarr.zip")
    first = reader.read(0)
    again = pickle.loads(pickle.dumps(reader)).read(0)
    assert again.arrays["data/robot0_eef_pos"].tobytes() == (
        first.arrays["data/robot0_eef_pos"].tobytes()
    )


def test_missing_imagecodecs_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "imagecodecs.numcodecs", None)
    with pytest.raises(MissingExtra, match=r"pip install 'episodekit\[zarr\]'"):
        ZarrReader(FIX / "umi.zarr.zip").keys()
    ZarrReader(FIX / "pusht_v2.zarr").keys()  # no JPEG-XL: imagecodecs not needed


def test_missing_zarr_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "zarr", None)
    assert ZarrReader.detect(FIX / "pusht_v2.zarr")  # detection imports nothing
    with pytest.raises(MissingExtra, match=r"pip install 'episodekit\[zarr\]'"):
        ZarrReader(FIX / "pusht_v2.zarr").episodes()


def _set_ends(path: Path, ends: list[int]) -> None:
    """meta/episode_ends rewritten with zarr itself (a copy of a fixture)."""
    root = zarr.open_group(str(path), mode="r+")
    root["meta/episode_ends"][:] = np.asarray(ends, dtype=np.int64)


@pytest.fixture
def v2_copy(tmp_path) -> Path:
    src = tmp_path / "pusht.zarr"
    shutil.copytree(FIX / "pusht_v2.zarr", src)
    return src


def test_decreasing_episode_ends_is_a_source_error(v2_copy):
    _set_ends(v2_copy, [20, 15, 53])
    with pytest.raises(
        SourceError, match=r"meta/episode_ends.*decreases at episode 1 \(20, then 15\)"
    ):
        ZarrReader(v2_copy).episodes()


def test_arrays_shorter_than_the_last_end_is_a_source_error(v2_copy):
    zarr.open_group(str(v2_copy), mode="r+")["data/state"].resize((50, 5))
    with pytest.raises(
        SourceError, match=r"key 'data/state': 50 steps, meta/episode_ends ends at 53"
    ):
        ZarrReader(v2_copy).episodes()


# --------------------------------------------------------------------------------------------
# The CLI


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("zarr_imports")
    out = {}
    for name in NAMES:
        r = ek("import", str(FIX / name), "--out", str(base / name), "--fps", "10")
        assert r.returncode == 0, r.stderr
        assert "(verified)" in r.stdout
        out[name] = base / name
    return out


@pytest.mark.parametrize("name", NAMES)
def test_validate_deep_passes(imported, name):
    r = ek("validate", "--deep", str(imported[name]))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", NAMES)
def test_numbers_equal_the_source_bit_for_bit(imported, name):
    out = imported[name]
    info = json.loads((out / "meta/info.json").read_text())
    assert info["fps"] == 10 and info["total_episodes"] == 3
    assert info["total_frames"] == FRAMES[name]
    t = data(out).sort_by("index")
    root = zarr_root(FIX / name)
    if name.startswith("pusht"):
        feats = {"observation.state": ["state"], "action": ["action"]}
    else:
        feats = {"observation.state": UMI_STATE}
    for feat, keys in feats.items():
        want = np.concatenate([root[f"data/{k}"][:] for k in keys], axis=1)
        got = column(t, feat)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    ep, fi = column(t, "episode_index"), column(t, "frame_index")
    for e, sl in enumerate(slices(root)):
        assert np.array_equal(fi[ep == e], np.arange(sl.stop - sl.start))
    ts = column(t, "timestamp")
    assert ts.tobytes() == (fi / 10).astype(ts.dtype).tobytes()
    tasks = pq.read_table(out / "meta/tasks.parquet")
    assert tasks.column(tasks.num_columns - 1).to_pylist() == [name.split(".")[0]]


@pytest.mark.parametrize("name", NAMES)
def test_cameras_through_video_within_psnr(imported, name):
    cam = CAMERA[name]
    mp4s = sorted((imported[name] / f"videos/observation.images.{cam}").rglob("*.mp4"))
    assert len(mp4s) == 1
    got = decoded(mp4s[0])
    want = zarr_root(FIX / name)[f"data/{cam}"][:]
    assert got.shape == want.shape
    worst = min(psnr_db(g, w) for g, w in zip(got, want))
    print(f"{name} {cam}: min PSNR {worst:.2f} dB over {len(got)} frames")
    assert worst >= MIN_PSNR_DB


def test_no_fps_names_the_option(tmp_path):
    r = ek("import", str(FIX / "pusht_v3.zarr"), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "--fps" in r.stderr
    assert not (tmp_path / "o").exists()


def test_print_map_round_trips(tmp_path):
    import tomllib

    r = ek("import", str(FIX / "umi.zarr.zip"), "--print-map")
    assert r.returncode == 0, r.stderr
    assert tomllib.loads(r.stdout) == ZarrReader(FIX / "umi.zarr.zip").default_map()


def _one_error(r, *parts: str) -> str:
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, r.stderr
    for part in parts:
        assert part in errors[0], errors[0]
    return errors[0]


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])


def _rezip(src: Path, dst: Path, member: str) -> None:
    """A copy of the zip with ``member`` cut to half its bytes."""
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w") as b:
        for info in a.infolist():
            raw = a.read(info)
            b.writestr(info, raw[: len(raw) // 2] if info.filename == member else raw)


@pytest.mark.parametrize(
    "name, member, key",
    [
        ("pusht_v2.zarr", "data/state/2.0", "data/state"),  # Blosc: steps 32:48
        ("pusht_v3.zarr", "data/action/c/2/0", "data/action"),  # zstd
        ("umi.zarr.zip", "data/camera0_rgb/13.0.0.0", "data/camera0_rgb"),  # JPEG-XL step 13
    ],
)
def test_corrupt_chunk_is_one_line_and_publishes_nothing(tmp_path, name, member, key):
    src = tmp_path / name
    if name.endswith(".zip"):
        _rezip(FIX / name, src, member)
    else:
        shutil.copytree(FIX / name, src)
        _truncate(src / member)
    out = tmp_path / "out"
    r = ek("import", str(src), "--out", str(out), "--fps", "10")
    _one_error(r, str(src), "episode 1", repr(key))
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # no staging left


def test_decreasing_episode_ends_is_one_line(tmp_path, v2_copy):
    _set_ends(v2_copy, [20, 15, 53])
    out = tmp_path / "out"
    r = ek("import", str(v2_copy), "--out", str(out), "--fps", "10")
    _one_error(r, str(v2_copy), "meta/episode_ends", "decreases at episode 1")
    assert not out.exists()


def test_jobs_2_writes_the_same_bytes_as_jobs_1(tmp_path, imported):
    """Workers reopen the store and register the JPEG-XL codec themselves."""
    out = tmp_path / "j2"
    r = ek("import", str(FIX / "umi.zarr.zip"), "--out", str(out), "--fps", "10", "--jobs", "2")
    assert r.returncode == 0, r.stderr
    one = imported["umi.zarr.zip"]
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert [str(f) for f in files if (one / f).read_bytes() != (out / f).read_bytes()] == []
