"""The RLDS reader against a dataset TFDS wrote and what TFDS reads back from it
(tests/fixtures/import/rlds: generator, expected.json, versions), without TensorFlow."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("google_crc32c")
pytest.importorskip("PIL")

from episodekit.importers.episode import MissingExtra, SourceError  # noqa: E402
from episodekit.importers.mapping import apply_map, parse_map  # noqa: E402
from episodekit.importers.rlds import RldsReader, parse_example  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "import" / "rlds" / "ek_rlds_fixture"
ROOT = FIXTURE / "1.0.0"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())["episodes"]
SHARD0 = "ek_rlds_fixture-train.tfrecord-00000-of-00002"
SHARD1 = "ek_rlds_fixture-train.tfrecord-00001-of-00002"


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dest = tmp_path / "1.0.0"
    shutil.copytree(ROOT, dest)
    return dest


def test_detect_the_dataset_folder_and_its_name_folder_not_others(tmp_path: Path) -> None:
    assert RldsReader.detect(ROOT) and RldsReader.detect(FIXTURE)
    assert RldsReader(FIXTURE).root == ROOT
    assert not RldsReader.detect(tmp_path)
    assert not RldsReader.detect(Path(__file__).parents[1] / "fixtures" / "lerobot")


def test_keys_come_from_features_json() -> None:
    keys = RldsReader(ROOT).keys()
    assert sorted(keys) == sorted([
        "action", "discount", "is_first", "is_last", "is_terminal", "language_instruction",
        "observation/image", "observation/state", "observation/wrist_image", "reward",
    ])  # fmt: skip
    assert (keys["observation/state"].kind, keys["observation/state"].dtype) == ("array", "float32")
    assert keys["observation/state"].shape == (8,) and keys["action"].shape == (7,)
    assert (keys["is_first"].dtype, keys["is_first"].shape) == ("bool", ())
    assert (keys["observation/image"].encoding, keys["observation/image"].shape) == (
        "jpeg", (32, 32, 3))  # fmt: skip
    assert keys["observation/wrist_image"].encoding == "png"
    assert keys["language_instruction"].kind == "text"


def test_every_value_equals_what_tfds_reads_bit_for_bit() -> None:
    reader = RldsReader(ROOT)
    refs = reader.episodes()
    assert [(r.shard, r.record) for r in refs] == [
        (SHARD0, 0), (SHARD0, 1), (SHARD1, 0), (SHARD1, 1)]  # fmt: skip
    assert len(refs) == len(EXPECTED)
    for ref, want in zip(refs, EXPECTED):
        ep = reader.read(ref)
        assert ep.meta == {"split": "train", "episode_metadata/file_path": want["file_path"]}
        assert ep.length == want["length"] and ep.source == f"{ref.shard}#record {ref.record}"
        for key in ("observation/state", "action", "reward", "discount", "is_first", "is_last",
                    "is_terminal"):  # fmt: skip
            got = ep.arrays[key]
            assert str(got.dtype) == want[key]["dtype"] and list(got.shape) == want[key]["shape"]
            assert got.tobytes().hex() == want[key]["hex"], key
        assert ep.texts["language_instruction"] == want["language_instruction"]
        for cam in ("observation/image", "observation/wrist_image"):
            images = ep.images[cam]
            assert len(images) == ep.length
            assert [sha(b) for b in images.encoded()] == want[cam]["file_sha256"]
            frames = list(images.frames())
            assert all(f.dtype == np.uint8 and list(f.shape) == want[cam]["shape"] for f in frames)
            pixels = [sha(f.tobytes()) for f in frames]
            # Pillow's JPEG decode is libjpeg's default (ISLOW) = TF's INTEGER_ACCURATE; TFDS
            # decodes with INTEGER_FAST, so only the PNG camera equals TFDS's default decode
            assert pixels == want[cam]["pixels_sha256_islow"]
            if images.encoding == "png":
                assert pixels == want[cam]["pixels_sha256"]
    assert len(set(EXPECTED[0]["language_instruction"])) == 2  # the task changes mid-episode


def test_reader_and_refs_pickle_for_worker_processes() -> None:
    reader = RldsReader(ROOT)
    ref = reader.episodes()[3]
    again = pickle.loads(pickle.dumps(reader))
    got = again.read(pickle.loads(pickle.dumps(ref)))
    assert got.arrays["action"].tobytes().hex() == EXPECTED[3]["action"]["hex"]


def test_default_map_parses_and_maps_an_episode() -> None:
    reader = RldsReader(ROOT)
    keys = reader.keys()
    doc = reader.default_map()
    m = parse_map(doc, keys, "the built-in map")
    assert {f.name: f.keys for f in m.features} == {
        "observation.state": ("observation/state",),
        "action": ("action",),
        "observation.images.image": ("observation/image",),
        "observation.images.wrist_image": ("observation/wrist_image",),
        "next.reward": ("reward",),
    }
    assert all(f.channels == "rgb" for f in m.features if f.kind == "image")
    assert m.task.key == "language_instruction" and m.meta == ("episode_metadata/file_path",)
    mapped = apply_map(reader.read(reader.episodes()[0]), m, keys)
    assert mapped.tasks == EXPECTED[0]["language_instruction"]
    assert mapped.columns["observation.state"].tobytes().hex() == EXPECTED[0][
        "observation/state"]["hex"]  # fmt: skip
    assert mapped.meta == {"episode_metadata/file_path": EXPECTED[0]["file_path"]}


def test_a_truncated_shard_is_one_line_naming_file_and_record(copy: Path) -> None:
    shard = copy / SHARD1
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(SourceError) as err:
        RldsReader(copy).episodes()
    msg = str(err.value)
    assert "\n" not in msg and str(shard) in msg and "truncated" in msg and "record 1" in msg


def test_a_flipped_data_byte_is_a_crc_error_naming_file_and_record(copy: Path) -> None:
    reader = RldsReader(copy)
    refs = reader.episodes()
    shard = copy / SHARD0
    data = bytearray(shard.read_bytes())
    data[refs[1].offset + 12 + 500] ^= 0x01  # inside record 1's data
    shard.write_bytes(bytes(data))
    assert reader.episodes() == refs  # headers intact: the listing does not read data
    reader.read(refs[0])
    with pytest.raises(SourceError) as err:
        reader.read(refs[1])
    msg = str(err.value)
    assert "\n" not in msg and str(shard) in msg and "record 1" in msg and "CRC" in msg


def test_a_flipped_length_byte_is_a_crc_error_when_listing(copy: Path) -> None:
    shard = copy / SHARD0
    data = bytearray(shard.read_bytes())
    data[0] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=r"record 0 at byte 0: length CRC mismatch") as err:
        RldsReader(copy).episodes()
    assert str(shard) in str(err.value)


def test_a_shard_with_fewer_records_than_dataset_info_says(copy: Path) -> None:
    info = json.loads((copy / "dataset_info.json").read_text())
    info["splits"][0]["shardLengths"] = ["3", "2"]
    (copy / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match=r"2 records, dataset_info.json says 3"):
        RldsReader(copy).episodes()


def test_missing_features_json_is_not_detected_and_a_clear_error(copy: Path) -> None:
    (copy / "features.json").unlink()
    assert not RldsReader.detect(copy)
    with pytest.raises(SourceError, match=r"not a TFDS dataset folder \(no dataset_info.json "
                       r"and features.json\)"):  # fmt: skip
        RldsReader(copy)


def _declare(copy: Path, name: str, spec: dict) -> None:
    doc = json.loads((copy / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    steps["features"]["observation"]["featuresDict"]["features"][name] = spec
    (copy / "features.json").write_text(json.dumps(doc))


def _tensor(dtype: str, dims: list[str]) -> dict:
    return {
        "pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
        "tensor": {"dtype": dtype, "encoding": "none", "shape": {"dimensions": dims}},
    }


def test_a_key_missing_from_the_record_names_the_key(copy: Path) -> None:
    _declare(copy, "joint_vel", _tensor("float32", ["7"]))
    reader = RldsReader(copy)
    assert "observation/joint_vel" in reader.keys()
    with pytest.raises(SourceError) as err:
        reader.read(reader.episodes()[0])
    msg = str(err.value)
    assert "\n" not in msg and str(copy / SHARD0) in msg and "episode 0 (record 0)" in msg
    assert "key 'steps/observation/joint_vel': missing from the record" in msg


def test_a_shape_the_values_do_not_fill_is_ragged(copy: Path) -> None:
    doc = json.loads((copy / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    obs = steps["features"]["observation"]["featuresDict"]["features"]
    obs["state"] = _tensor("float32", ["5"])  # 13 steps x 8 floats: not a whole number of 5s
    (copy / "features.json").write_text(json.dumps(doc))
    reader = RldsReader(copy)
    with pytest.raises(SourceError, match=r"key 'steps/observation/state': .*ragged"):
        reader.read(reader.episodes()[0])


def test_splits_option(copy: Path) -> None:
    assert len(RldsReader(copy, {"splits": ["train"]}).episodes()) == 4
    with pytest.raises(SourceError, match=r"no split 'val' \(it has: train\)"):
        RldsReader(copy, {"splits": ["val"]})


def test_missing_crc_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "google_crc32c", None)
    with pytest.raises(MissingExtra, match=r"pip install 'episodekit\[rlds\]'"):
        RldsReader(ROOT).episodes()


# --------------------------------------------------------------------------------------------
# The wire decoder on forms TFDS does not write (unpacked lists, multi-byte and negative ints)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _example(features: dict[str, bytes]) -> bytes:
    entries = b"".join(_ld(1, _ld(1, k.encode()) + _ld(2, v)) for k, v in features.items())
    return _ld(1, entries)


def test_wire_decoder_packed_unpacked_and_negative_values() -> None:
    ints = [0, 1, 127, 128, 300, 2**40, -1, -5, 2**63 - 1, -(2**63)]
    packed = _ld(3, _ld(1, b"".join(_varint(i) for i in ints)))
    unpacked = _ld(3, b"".join(_varint(1 << 3 | 0) + _varint(i) for i in ints))
    floats = np.array([1.5, -2.25, np.inf], "<f4")
    fpacked = _ld(2, _ld(1, floats.tobytes()))
    funpacked = _ld(2, b"".join(_varint(1 << 3 | 5) + struct.pack("<f", f) for f in floats))
    blist = _ld(1, _ld(1, b"ab") + _ld(1, b"") + _ld(1, b"\x00\xff"))
    empty = _ld(2, b"")
    ex = parse_example(_example({
        "p": packed, "u": unpacked, "fp": fpacked, "fu": funpacked, "b": blist, "e": empty,
    }))  # fmt: skip
    assert ex["p"][0] == "int64" and ex["p"][1].tolist() == ints
    assert ex["u"][1].tolist() == ints
    assert ex["fp"][1].tobytes() == floats.tobytes() == ex["fu"][1].tobytes()
    assert ex["b"] == ("bytes", [b"ab", b"", b"\x00\xff"])
    assert ex["e"][0] == "float" and ex["e"][1].size == 0


def test_an_image_of_free_size_takes_the_first_episodes_size(copy: Path) -> None:
    doc = json.loads((copy / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    cam = steps["features"]["observation"]["featuresDict"]["features"]["wrist_image"]
    cam["image"]["shape"]["dimensions"] = ["-1", "-1", "3"]
    (copy / "features.json").write_text(json.dumps(doc))
    reader = RldsReader(copy)
    assert reader.leaves and reader.keys()["observation/wrist_image"].shape == (32, 32, 3)
    frames = list(reader.read(reader.episodes()[0]).images["observation/wrist_image"].frames())
    want = EXPECTED[0]["observation/wrist_image"]["pixels_sha256"]
    assert [sha(f.tobytes()) for f in frames] == want


def test_the_codec_comes_from_the_bytes_not_the_declaration(copy: Path) -> None:
    # TFDS keeps image files given as bytes or paths as they are, whatever encoding_format says
    doc = json.loads((copy / "features.json").read_text())
    steps = doc["featuresDict"]["features"]["steps"]["sequence"]["feature"]["featuresDict"]
    steps["features"]["observation"]["featuresDict"]["features"]["wrist_image"]["image"][
        "encodingFormat"
    ] = "jpeg"
    (copy / "features.json").write_text(json.dumps(doc))
    reader = RldsReader(copy)
    images = reader.read(reader.episodes()[0]).images["observation/wrist_image"]
    assert images.encoding == "png"
    want = EXPECTED[0]["observation/wrist_image"]["pixels_sha256"]
    assert [sha(f.tobytes()) for f in images.frames()] == want


def _frame(data: bytes) -> bytes:
    """``data`` as one TFRecord record (length, masked CRC32C of it, data, masked CRC32C)."""
    import google_crc32c

    def masked(b: bytes) -> bytes:
        crc = google_crc32c.value(b)
        return struct.pack("<I", ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8)
                           & 0xFFFFFFFF)  # fmt: skip

    head = struct.pack("<Q", len(data))
    return head + masked(head) + data + masked(data)


def _rewrite_record0(copy: Path, key: str, replacement: bytes | None) -> RldsReader:
    """Shard 0 with record 0's ``key`` entry dropped (None) or its Feature replaced, CRCs
    valid: a well-framed record that TFDS itself would refuse to parse."""
    from episodekit.importers.rlds import _fields, read_record

    reader = RldsReader(copy)
    refs = reader.episodes()
    shard = copy / SHARD0
    data = read_record(shard, refs[0].offset, 0)
    (_, _, a, b), = [f for f in _fields(data, 0, len(data)) if f[0] == 1]  # fmt: skip
    entries = b""
    for _, _, c, d in _fields(data, a, b):
        (_, _, e, h), *_ = _fields(data, c, d)
        if data[e:h].decode() != key:
            entries += _ld(1, data[c:d])
        elif replacement is not None:
            entries += _ld(1, _ld(1, key.encode()) + _ld(2, replacement))
    rest = shard.read_bytes()[refs[1].offset :]
    shard.write_bytes(_frame(_ld(1, entries)) + rest)
    return RldsReader(copy)


def test_a_well_framed_record_without_a_declared_key_names_the_key(copy: Path) -> None:
    reader = _rewrite_record0(copy, "steps/observation/state", None)
    refs = reader.episodes()
    assert reader.read(refs[1]).length == EXPECTED[1]["length"]
    with pytest.raises(SourceError) as err:
        reader.read(refs[0])
    msg = str(err.value)
    assert "\n" not in msg and str(copy / SHARD0) in msg and "episode 0 (record 0)" in msg
    assert "key 'steps/observation/state': missing from the record" in msg


def test_text_that_is_not_utf8_names_the_key(copy: Path) -> None:
    n = EXPECTED[0]["length"]
    texts = _ld(1, b"".join(_ld(1, b"ok") for _ in range(n - 1)) + _ld(1, b"\xff\xfe"))
    reader = _rewrite_record0(copy, "steps/language_instruction", texts)
    with pytest.raises(SourceError, match=r"key 'steps/language_instruction': text that is not"):
        reader.read(reader.episodes()[0])


def test_a_list_of_the_wrong_kind_names_the_key(copy: Path) -> None:
    n = EXPECTED[0]["length"]
    ints = _ld(3, _ld(1, bytes(n)))
    reader = _rewrite_record0(copy, "steps/reward", ints)
    with pytest.raises(SourceError, match=r"key 'steps/reward': stored as int64 values, "
                       r"features.json declares float32"):  # fmt: skip
        reader.read(reader.episodes()[0])
