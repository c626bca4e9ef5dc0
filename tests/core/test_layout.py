"""The typed layout model (core/layout): info.json parsed strictly (one line naming the key) or
tolerantly (findings), written back byte for byte as LeRobot wrote it, and the one file
roll-over rule equal to the two copies it replaced."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from episodekit.core.errors import DatasetError
from episodekit.core.layout import Info, InfoError, chunk_file, file_path, roll_over
from episodekit.core.layout.rules import DATA_PATH_V3, VIDEO_PATH_V3
from episodekit.core.paths import UnsafePathError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
INFOS = sorted(p.relative_to(FIXTURES).as_posix() for p in FIXTURES.glob("*/meta/info.json"))


def rec40() -> dict:
    return json.loads((FIXTURES / "rec40/meta/info.json").read_text())


def test_there_are_lerobot_written_infos():
    assert {"rec40/meta/info.json", "vid24/meta/info.json", "lang5/meta/info.json"} <= set(INFOS)


@pytest.mark.parametrize("rel", INFOS)
def test_round_trip_is_byte_identical(rel):
    """Every info.json LeRobot wrote (and v21vid8) comes back byte for byte through the writer,
    its unknown keys (``splits``, ``total_chunks``, ``tools``) and key order kept."""
    text = (FIXTURES / rel).read_text()
    obj = json.loads(text)
    info = Info.parse(obj)
    assert info.to_json() == text
    assert json.dumps(info.to_dict(), indent=4) == json.dumps(obj, indent=4)
    assert list(info.to_dict()) == list(obj)
    assert Info.parse_tolerant(obj) == (info, [])


def test_typed_values():
    info = Info.parse(json.loads((FIXTURES / "vid24/meta/info.json").read_text()))
    assert info.codebase_version == "v3.0" and info.fps == 30
    assert info.video_keys == ["observation.images.top", "observation.images.wrist"]
    top = info.features["observation.images.top"]
    assert top.shape == (96, 128, 3) and top.info["video.codec"] == "av1"
    assert info.features["action"].dtype == "float32"
    assert info.data_path == DATA_PATH_V3 and info.template("video") == VIDEO_PATH_V3
    assert info.splits == {"train": "0:24"} and info.extra == {}


def test_a_feature_without_names_stays_without():
    obj = rec40()
    del obj["features"]["action"]["names"]
    obj["features"]["action"]["unit"] = "rad"
    info = Info.parse(obj)
    assert info.features["action"].names is None
    assert info.to_dict() == obj and list(info.to_dict()["features"]["action"]) == [
        "dtype",
        "shape",
        "unit",
    ]


def test_to_dict_is_a_copy():
    info = Info.parse(rec40())
    info.to_dict()["features"]["action"]["names"].append("x")
    assert "x" not in info.features["action"].names


def test_a_key_set_later_goes_where_lerobot_writes_it():
    from dataclasses import replace

    obj = json.loads((FIXTURES / "crash_rec7/meta/info.json").read_text())  # LeRobot 0.6.1's order
    del obj["total_tasks"]
    out = replace(Info.parse(obj), total_tasks=8).to_dict()
    keys = list(out)
    assert keys.index("total_tasks") == keys.index("total_frames") + 1
    new = Info(codebase_version="v3.0", fps=30, features={}).to_dict()
    assert list(new)[:3] == ["codebase_version", "fps", "features"]


def broken(change) -> dict:
    obj = rec40()
    change(obj)
    return obj


STRICT = [
    ("missing fps", lambda o: o.pop("fps"), "fps is missing"),
    ("missing features", lambda o: o.pop("features"), "features is missing"),
    ("zero fps", lambda o: o.update(fps=0), "fps must be a positive number, got 0"),
    ("string fps", lambda o: o.update(fps="30"), 'fps must be a positive number, got "30"'),
    ("bool fps", lambda o: o.update(fps=True), "fps must be a positive number, got true"),
    ("inf fps", lambda o: o.update(fps=float("inf")), "fps must be a positive number, got inf"),
    (
        "negative chunks_size",
        lambda o: o.update(chunks_size=-5),
        "chunks_size must be a positive integer, got -5",
    ),
    (
        "float chunks_size",
        lambda o: o.update(chunks_size=2.5),
        "chunks_size must be a positive integer, got 2.5",
    ),
    (
        "negative total",
        lambda o: o.update(total_frames=-1),
        "total_frames must be an integer >= 0, got -1",
    ),
    (
        "unknown dtype",
        lambda o: o["features"]["action"].update(dtype="float33"),
        "features['action'] has dtype \"float33\"",
    ),
    (
        "no dtype",
        lambda o: o["features"]["action"].pop("dtype"),
        "features['action'] has no dtype",
    ),
    (
        "non-list shape",
        lambda o: o["features"]["action"].update(shape=14),
        "features['action'] has shape 14: it must be a list of positive integers",
    ),
    (
        "zero in shape",
        lambda o: o["features"]["action"].update(shape=[0]),
        "features['action'] has shape [0]",
    ),
    (
        "names a string",
        lambda o: o["features"]["action"].update(names="abc"),
        "features['action'] has names \"abc\"",
    ),
    (
        "not finite elsewhere",
        lambda o: o.update(custom=[1.0, float("nan")]),
        "custom holds a number that is not finite",
    ),
]


@pytest.mark.parametrize("what,change,message", STRICT, ids=[s[0] for s in STRICT])
def test_strict_errors_name_the_key(what, change, message):
    with pytest.raises(InfoError) as exc:
        Info.parse(broken(change), "root/meta/info.json")
    text = str(exc.value)
    assert text.startswith("root/meta/info.json: ") and message in text, text
    assert "\n" not in text
    assert isinstance(exc.value, DatasetError) and exc.value.exit_code == 1


@pytest.mark.parametrize("dtype", ["struct", "list", "large_string", "timestamp[us]", "language"])
def test_other_dtypes_lerobot_or_the_loaders_read_are_known(dtype):
    """datasets' Value names and the nested kinds the loaders hand out as Python objects."""
    info = Info.parse(broken(lambda o: o["features"]["action"].update(dtype=dtype)))
    assert info.features["action"].dtype == dtype


def test_strict_refuses_what_is_not_an_object():
    with pytest.raises(InfoError, match="must be a JSON object, got list"):
        Info.parse([1, 2])


def test_tolerant_reports_every_problem_and_keeps_the_rest():
    def change(o):
        o["fps"] = -30
        o["chunks_size"] = "many"
        o["features"]["action"]["shape"] = "14"
        o["features"]["observation.state"]["dtype"] = "tensor"
        o["robot_type"] = 7

    info, found = Info.parse_tolerant(broken(change))
    assert sorted(f.key for f in found) == sorted(
        ["robot_type", "chunks_size", "fps", "features['observation.state']", "features['action']"]
    )
    assert "fps must be a positive number, got -30" in [f.message for f in found]
    assert info is not None
    assert info.fps is None and info.chunks_size is None and info.robot_type is None
    assert info.chunks == 1000  # LeRobot's default stands in
    assert "action" not in info.features and "observation.state" not in info.features
    assert info.features["timestamp"].dtype == "float32"
    assert info.total_episodes == 40


def test_tolerant_on_a_missing_key_and_a_non_object():
    obj = rec40()
    del obj["codebase_version"]
    info, found = Info.parse_tolerant(obj)
    assert info is not None and info.codebase_version is None
    assert [(f.key, f.message) for f in found] == [
        ("codebase_version", "codebase_version is missing")
    ]
    assert Info.parse_tolerant("x")[0] is None and len(Info.parse_tolerant("x")[1]) == 1


# ---------------------------------------------------------------------------------------------
# files


def old_writers_roll_over(byte_sizes, limit_bytes):
    """writers/plan.py ``roll_over`` as it was before core.layout.files (copied)."""
    file_of = np.zeros(len(byte_sizes), dtype=np.int64)
    current, acc = 0, 0.0
    for i, b in enumerate(np.asarray(byte_sizes, dtype=np.float64).tolist()):
        if acc > 0 and acc + b > limit_bytes:
            current, acc = current + 1, 0.0
        file_of[i] = current
        acc += b
    return file_of


def old_sample_plan_files(byte_sizes, limit_bytes):
    """sample/tables.py ``plan_files`` as it was before core.layout.files (copied)."""
    file_of = np.zeros(len(byte_sizes), dtype=np.int64)
    current, acc = 0, 0.0
    for i, b in enumerate(byte_sizes.tolist()):  # per episode, not per frame
        if acc > 0 and acc + b > limit_bytes:
            current, acc = current + 1, 0.0
        file_of[i] = current
        acc += b
    return file_of


sizes = st.one_of(
    st.lists(st.integers(0, 300 << 20), max_size=200).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.floats(0, 3e8, allow_nan=False), max_size=200).map(np.array),
)


@settings(max_examples=300, deadline=None)
@given(byte_sizes=sizes, limit=st.floats(1, 2e8, allow_nan=False))
def test_roll_over_equals_both_old_rules(byte_sizes, limit):
    got = roll_over(byte_sizes, limit)
    assert got.dtype == np.int64
    assert np.array_equal(got, old_writers_roll_over(byte_sizes, limit))
    assert np.array_equal(got, old_sample_plan_files(byte_sizes, limit))


def test_roll_over_rule():
    mib = 1 << 20
    assert roll_over(np.array([60, 50, 10, 200, 1]) * mib, 100 * mib).tolist() == [0, 1, 1, 2, 3]
    assert roll_over(np.array([], dtype=np.int64), 1.0).tolist() == []


def test_chunk_file_and_file_path():
    assert chunk_file(2500, 1000) == (2, 500)
    c, f = chunk_file(np.array([0, 999, 1000]), 1000)
    assert c.tolist() == [0, 0, 1] and f.tolist() == [0, 999, 0]
    with pytest.raises(ValueError, match="chunks_size"):
        chunk_file(3, 0)
    assert file_path(DATA_PATH_V3, 1, 7) == "data/chunk-001/file-007.parquet"
    assert file_path(VIDEO_PATH_V3, 0, 2, video_key="top") == "videos/top/chunk-000/file-002.mp4"
    with pytest.raises(UnsafePathError):
        file_path(VIDEO_PATH_V3, 0, 2, video_key="..")


def test_open_dataset_parses_info_strictly(tmp_path):
    """The reader refuses an info.json LeRobot never writes, in one line naming file and key,
    and keeps the parsed model on the dataset."""
    import shutil

    from episodekit.core.dataset import open_dataset

    root = tmp_path / "rec40"
    shutil.copytree(FIXTURES / "rec40", root)
    ds = open_dataset(str(root))
    assert ds.layout is not None and ds.layout.to_dict() == ds.info and ds.layout.fps == 30
    path = root / "meta/info.json"
    path.write_text(path.read_text().replace('"chunks_size": 1000', '"chunks_size": -1000'))
    with pytest.raises(InfoError) as exc:
        open_dataset(str(root))
    assert str(exc.value) == (
        f"{root}/meta/info.json: chunks_size must be a positive integer, got -1000"
    )
