"""The HDF5 readers against h5py's own reading of fixtures written by the formats' tools
(tests/fixtures/import/make_hdf5_fixtures.py)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from episodekit.importers.episode import SourceError
from episodekit.importers.hdf5 import AlohaReader, RobomimicReader
from episodekit.importers.mapping import MapError, parse_map

FIX = Path(__file__).parents[1] / "fixtures" / "import"
CAMS = ["cam_high", "cam_left_wrist"]  # the recorder's creation order (compress_len rows)


def test_aloha_raw_equals_h5py_bit_for_bit():
    r = AlohaReader(FIX / "aloha_raw")
    assert r.episodes() == ["episode_0.hdf5", "episode_1.hdf5", "episode_2.hdf5"]
    for ref in r.episodes():
        ep = r.read(ref)
        with h5py.File(FIX / "aloha_raw" / ref) as f:
            for k in ("action", "observations/qpos", "observations/qvel"):
                assert ep.arrays[k].dtype == f[k].dtype
                assert ep.arrays[k].tobytes() == f[k][()].tobytes()
            for c in CAMS:
                got = np.stack(list(ep.images[f"observations/images/{c}"].frames()))
                assert np.array_equal(got, f[f"observations/images/{c}"][()])
        assert ep.length == 20


def test_aloha_jpeg_frames_are_the_recorded_jpegs():
    r = AlohaReader(FIX / "aloha_jpeg")
    keys = r.keys()
    assert keys["observations/images/cam_high"].encoding == "jpeg"
    assert keys["observations/images/cam_high"].shape == (24, 32, 3)
    ep = r.read("episode_1.hdf5")
    with h5py.File(FIX / "aloha_jpeg" / "episode_1.hdf5") as f:
        lengths = f["compress_len"][()]
        for ci, c in enumerate(CAMS):
            rows = f[f"observations/images/{c}"][()]
            img = ep.images[f"observations/images/{c}"]
            blobs = img.encoded()
            assert [len(b) for b in blobs] == lengths[ci].astype(int).tolist()
            want = [rows[i, : int(n)].tobytes() for i, n in enumerate(lengths[ci])]
            assert list(blobs) == want
            first = np.asarray(Image.open(io.BytesIO(want[0])).convert("RGB"))
            assert np.array_equal(next(iter(img.frames())), first)


def test_robomimic_values_fps_and_splits():
    r = RobomimicReader(FIX / "robomimic.hdf5")
    assert r.fps() == 20.0
    assert r.episodes() == ["demo_0", "demo_1", "demo_2"]
    with h5py.File(FIX / "robomimic.hdf5") as f:
        for ref in r.episodes():
            ep = r.read(ref)
            g = f["data"][ref]
            for k in ("actions", "states", "rewards", "dones", "obs/robot0_eef_pos"):
                assert ep.arrays[k].tobytes() == g[k][()].tobytes()
            img = np.stack(list(ep.images["obs/agentview_image"].frames()))
            assert np.array_equal(img, g["obs/agentview_image"][()])
            assert ep.length == g.attrs["num_samples"]
    assert r.read("demo_2").meta == {"split": "valid"}
    assert RobomimicReader(FIX / "robomimic.hdf5", {"split": "train"}).episodes() == [
        "demo_0",
        "demo_1",
    ]
    with pytest.raises(SourceError, match="no mask/test"):
        RobomimicReader(FIX / "robomimic.hdf5", {"split": "test"}).episodes()


def test_detection_by_layout(tmp_path):
    assert AlohaReader.detect(FIX / "aloha_raw")
    assert not AlohaReader.detect(FIX / "robomimic.hdf5")
    assert RobomimicReader.detect(FIX / "robomimic.hdf5")
    assert not RobomimicReader.detect(FIX / "aloha_raw")
    (tmp_path / "episode_0.hdf5").write_text("not hdf5")
    assert not AlohaReader.detect(tmp_path)


def test_truncated_hdf5_is_one_line_naming_the_file(tmp_path):
    src = tmp_path / "aloha"
    shutil.copytree(FIX / "aloha_raw", src)
    path = src / "episode_1.hdf5"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    r = AlohaReader(src)
    r.read("episode_0.hdf5")  # the others still read
    with pytest.raises(SourceError) as err:
        r.read("episode_1.hdf5")
    msg = str(err.value)
    assert str(path) in msg and "episode_1.hdf5" in msg and "\n" not in msg


def test_corrupt_dataset_bytes_name_file_episode_and_key(tmp_path):
    src = tmp_path / "robomimic.hdf5"
    shutil.copy(FIX / "robomimic.hdf5", src)
    with h5py.File(src) as f:
        ds = f["data/demo_1/obs/agentview_image"]
        offset = ds.id.get_chunk_info(0).byte_offset
    with open(src, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * 64)  # the gzip stream of the first chunk broken
    r = RobomimicReader(src)
    r.read("demo_0")
    with pytest.raises(SourceError) as err:
        r.read("demo_1")
    msg = str(err.value)
    assert str(src) in msg and "demo_1" in msg and "obs/agentview_image" in msg
    assert "\n" not in msg


def test_a_map_key_missing_from_the_source_is_one_line():
    r = AlohaReader(FIX / "aloha_raw")
    doc = r.default_map()
    doc["features"]["observation.state"] = {"keys": ["observations/effort"]}
    with pytest.raises(MapError) as err:
        parse_map(doc, r.keys(), "my.toml")
    msg = str(err.value)
    assert msg.startswith("my.toml: features.'observation.state'.keys: 'observations/effort'")
    assert "\n" not in msg


def test_missing_h5py_names_the_extra(monkeypatch):
    import sys

    from episodekit.importers.episode import MissingExtra

    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(MissingExtra, match=r"pip install 'episodekit\[hdf5\]'"):
        AlohaReader(FIX / "aloha_raw").keys()
