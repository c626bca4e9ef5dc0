"""``episodekit repair`` on a damaged ``meta/info.json`` (writers/repair_info.py): each damaged
key is rebuilt from the data where the data tells it, else the run is refused with one line
naming the key; a broken info.json is never published, and what is published passes
``validate --deep``. (LeRobot rewrites info.json in place after every episode: a crash can also
leave it cut short.)"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.writers.repair import RepairOptions, repair
from episodekit.writers.repair_info import InfoRefused
from tests.writers.test_repair import check_against_reference

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
INFO = "meta/info.json"


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def damaged(name: str, tmp: Path, change) -> tuple[Path, dict]:
    """A copy of fixture ``name`` whose info.json is ``change(info)`` (a dict, or the text to
    write); returns the copy and the fixture's own info.json."""
    root = tmp / name
    shutil.copytree(FIXTURES / name, root)
    info = json.loads((root / INFO).read_text())
    got = change(json.loads(json.dumps(info)))
    text = got if isinstance(got, str) else json.dumps(got, indent=4)
    (root / INFO).write_text(text)
    return root, info


def published(out: Path) -> dict:
    """The output's info.json, read strictly (no Infinity/NaN), and ``validate --deep`` on it."""

    def refuse(name):
        raise AssertionError(f"info.json holds {name}")

    info = json.loads((out / INFO).read_text(), parse_constant=refuse)
    p = cli("validate", out, "--deep")
    assert p.returncode == 0, p.stdout + p.stderr
    return info


def info_damages(result) -> list[str]:
    return [d["damage"] for d in result.damages if d["file"] == INFO]


def without_names(features: dict) -> dict:
    return {k: {**f, "names": None} if f["dtype"] not in ("image", "video") else f
            for k, f in features.items()}  # fmt: skip


def test_infinite_fps_is_rebuilt_from_the_timestamps(tmp_path):
    """``"fps": 1e999`` (JSON reads it as infinity; copied, it was written back as
    ``Infinity``, which no JSON reader takes): rebuilt as the integer fps whose
    frame_index / fps gives every timestamp bit for bit."""

    def change(d):
        return json.dumps(d, indent=4).replace('"fps": 30', '"fps": 1e999')

    src, info = damaged("crash_rec7", tmp_path, change)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert info_damages(result) == [
        "fps is inf: rebuilt as 30 from the timestamps (frame_index / fps)"
    ]
    assert result.files[INFO] == "rebuilt fps"
    got = published(out)
    assert got == info  # every other key as it was
    check_against_reference(out, "crash_rec7", 7, result.rebuilt)


def test_missing_features_are_rebuilt_from_the_schema(tmp_path):
    """No features: rebuilt from the ``huggingface`` schema metadata of the data file with a
    footer (the other one has none) as LeRobot declares them (the user's names of a vector
    cannot be told: null), back where LeRobot 0.6.1 writes the key; the rest unchanged."""
    src, info = damaged(
        "crash_rec7", tmp_path, lambda d: {k: v for k, v in d.items() if k != "features"}
    )
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert result.status == "repaired"
    assert info_damages(result) == ["features is missing: rebuilt from the data files' schema"]
    got = published(out)
    assert got["features"] == without_names(info["features"])
    assert list(got) == list(info)
    assert {k: v for k, v in got.items() if k != "features"} == {
        k: v for k, v in info.items() if k != "features"
    }
    check_against_reference(out, "crash_rec7", 7, result.rebuilt)
    assert repair(out, RepairOptions(dry_run=True)).status == "nothing to repair"


def test_missing_camera_and_image_features(tmp_path):
    """Cameras (mp4s) and image columns (PNG bytes) get LeRobot's shape (height, width,
    channels) and names; a camera its ``info`` from its first mp4."""
    pytest.importorskip("PIL")
    for name, kind in (("vid24", "video"), ("img6", "image")):
        src, info = damaged(name, tmp_path, lambda d: {**d, "features": {}})
        out = tmp_path / f"{name}-out"
        repair(src, RepairOptions(out=str(out)))
        got = published(out)["features"]
        assert list(got) == list(info["features"])
        for key, f in info["features"].items():
            if f["dtype"] == kind:
                assert {k: got[key][k] for k in ("dtype", "shape", "names")} == {
                    k: f[k] for k in ("dtype", "shape", "names")
                }, key
                if kind == "video":  # what the mp4 tells (encoder settings: not recorded there)
                    want = {k: v for k, v in f["info"].items() if k != "video.is_depth_map"}
                    assert got[key]["info"] == {**want, "is_depth_map": False}


def test_paths_and_sizes_are_rebuilt_as_lerobot_defaults(tmp_path):
    """data_path missing, video_path not naming the mp4s, chunks_size 0, a size not finite,
    totals wrong: LeRobot v3.0's templates and defaults, the data's totals."""

    def change(d):
        del d["data_path"]
        d.update(video_path="videos/{video_key}/{file_index}.mp4", chunks_size=0)
        d.update(data_files_size_in_mb=-1, total_frames="many", total_tasks=99)
        text = json.dumps(d, indent=4)
        return text.replace('"video_files_size_in_mb": 0.02', '"video_files_size_in_mb": NaN')

    src, info = damaged("crash_vid5", tmp_path, change)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert info_damages(result) == [
        "chunks_size is 0: rebuilt as 1000 (LeRobot's default)",
        "data_files_size_in_mb is -1: rebuilt as 100 (LeRobot's default)",
        "video_files_size_in_mb is nan: rebuilt as 200 (LeRobot's default)",
        "data_path is missing: rebuilt as LeRobot v3.0's",
        'video_path is "videos/{video_key}/{file_index}.mp4": rebuilt as LeRobot v3.0\'s',
        "total_frames is many, the data has 31",
        "total_tasks is 99, the data has 5",
    ]
    got = published(out)
    assert got["data_path"] == info["data_path"] and got["video_path"] == info["video_path"]
    assert (got["chunks_size"], got["data_files_size_in_mb"], got["video_files_size_in_mb"]) == (
        1000, 100, 200,
    )  # fmt: skip
    assert (got["total_frames"], got["total_tasks"]) == (info["total_frames"], info["total_tasks"])
    check_against_reference(out, "crash_vid5", 5, result.rebuilt)


def test_info_cut_short_is_rebuilt_whole(tmp_path):
    """info.json cut short (the recorder killed while rewriting it): every key rebuilt from
    the data; which episodes were saved comes from stats.json's count (rewritten after
    info.json), so the three whose metadata rows were still buffered are kept."""
    src, info = damaged("crash_rec7", tmp_path, lambda d: json.dumps(d, indent=4)[:700])
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert info_damages(result)[0].startswith("not valid JSON (")
    assert result.episodes == 7 and result.rebuilt == [4, 5, 6] and not result.dropped
    got = published(out)
    lost = {"robot_type": None, "data_files_size_in_mb": 100}  # not in the data: defaults
    assert got == {**info, **lost, "features": without_names(info["features"])}
    check_against_reference(out, "crash_rec7", 7, result.rebuilt)


def test_non_finite_extra_key_is_dropped(tmp_path):
    def change(d):
        return json.dumps({**d, "x": 1}).replace('"x": 1', '"x": 1e999')

    src, info = damaged("rec40", tmp_path, change)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert info_damages(result) == ["x holds a number that is not finite: dropped"]
    assert published(out) == info


def _jitter_timestamps(root: Path) -> None:
    f = root / "data/chunk-000/file-000.parquet"
    t = pq.read_table(f)
    ts = t["timestamp"].to_numpy().copy()
    ts[1::2] += 0.001  # no one fps gives these
    pos = t.schema.get_field_index("timestamp")
    pq.write_table(t.set_column(pos, t.schema.field(pos), pa.array(ts, pa.float32())), f)


@pytest.mark.parametrize(
    "case, key",
    [("fps", "fps is missing"), ("features", "features is missing"), ("version", "v2.1")],
)
def test_refused_with_one_line_naming_the_key(tmp_path, case, key):
    """What the data does not tell is refused: fps when the timestamps are not frame_index /
    fps for one fps, features when no data file has a footer to read them from. One line
    naming the key, exit 1 (the data), nothing published."""
    if case == "fps":
        src, _ = damaged("rec40", tmp_path, lambda d: {**d, "fps": None})
        _jitter_timestamps(src)
    elif case == "features":
        src, _ = damaged("crash_vid5", tmp_path, lambda d: {**d, "features": None})
    else:
        src, _ = damaged("rec40", tmp_path, lambda d: {**d, "codebase_version": "v2.1"})
    with pytest.raises((InfoRefused, ValueError), match=key):
        repair(src, RepairOptions(out=str(tmp_path / "lib")))
    out = tmp_path / "out"
    p = cli("repair", src, "--out", out)
    lines = [line for line in p.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in p.stderr, p.stderr
    assert p.returncode == (2 if case == "version" else 1), p.stderr
    assert str(src / INFO) in lines[0] or case == "version"
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    assert not (tmp_path / "lib").exists()


def test_healthy_info_json_is_kept_byte_for_byte(tmp_path):
    """An undamaged info.json is taken as it is (totals only rewritten when they change, in
    LeRobot's own format), whatever order its keys are in."""
    src = tmp_path / "vid24"
    shutil.copytree(FIXTURES / "vid24", src)
    (src / "meta/stats.json").unlink()  # some damage, so that repair writes an output
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert info_damages(result) == [] and INFO not in result.files
    assert (out / INFO).read_bytes() == (src / INFO).read_bytes()
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in published(out).values())
