"""Every declared field of a feature against the others, the streams and the images: names
(``info.names``), a video's shape vs its ``video.*`` fields (``info.video``), the stream's
channels, audio and keyframe interval (``video.channels``, ``video.audio``, ``video.gop``), the
images' size (``data.image_shape``, ``--deep``). Silent on LeRobot's own datasets and on our
samples; each check catches its corruption (``validate`` run as a subprocess)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from episodekit.validate.declared import CHECKS, _names_problem, image_size, visual_axes

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-m", "episodekit.cli"]
TOP = "observation.images.top"


def validate_json(root: Path, *extra: str) -> tuple[int, list[dict]]:
    r = subprocess.run(
        [*CLI, "validate", str(root), "--json", *extra], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)["findings"]


def edit_info(root: Path, fn) -> None:
    path = root / "meta/info.json"
    info = json.loads(path.read_text())
    fn(info)
    path.write_text(json.dumps(info, indent=4))


def copy(name: str, tmp_path: Path) -> Path:
    if name == "vid24":
        pytest.importorskip("av")
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    return root


@pytest.mark.parametrize("name", ["rec40", "edited35", "vid24", "v21vid8"])
def test_lerobot_datasets_have_no_declared_field_finding(name, tmp_path):
    code, findings = validate_json(copy(name, tmp_path), "--deep")
    assert code == 0
    assert [f for f in findings if f["check"] in CHECKS] == []


def test_samples_with_images_and_videos_have_none(make_sample):
    pytest.importorskip("av")
    for spec in (
        dict(episodes=8, tasks=2, seed=1, images=True, videos=2),
        dict(episodes=6, tasks=2, seed=2, images=True, style="edited", version="v2.1"),
        dict(episodes=6, tasks=3, seed=5, videos=1, video_codec="h264", gop=7),
    ):
        code, findings = validate_json(make_sample(copy=False, **spec), "--deep")
        assert code == 0 and [f for f in findings if f["check"] in CHECKS] == [], spec


def test_audio_and_keyframe_interval_declared_wrong_are_warnings(tmp_path):
    root = copy("vid24", tmp_path)

    def fn(info):
        info["features"][TOP]["info"]["has_audio"] = True
        info["features"][TOP]["info"]["video.g"] = 1  # the files have a keyframe every 2

    edit_info(root, fn)
    code, findings = validate_json(root)
    assert code == 0
    got = {(f["check"], f["severity"], f["file"]) for f in findings if f["check"] in CHECKS}
    files = sorted(str(p.relative_to(root)) for p in root.glob(f"videos/{TOP}/*/*.mp4"))
    assert got == {(c, "warning", f) for c in ("video.audio", "video.gop") for f in files}
    msgs = [f["message"] for f in findings if f["check"] == "video.gop"]
    assert all("keyframes up to 2 frames apart but info.json video.g is 1" in m for m in msgs)
    code, _ = validate_json(root, "--fail-on", "warning")
    assert code == 1
    edit_info(root, lambda info: info["features"][TOP]["info"].update({"video.g": 2}))
    assert "video.gop" not in {f["check"] for f in validate_json(root)[1]}


def test_a_channels_first_shape_is_read_through_its_names(tmp_path):
    """Older datasets declare [channels, height, width]: the stream's size is compared with the
    axes the names give (was: shape[0] taken as the height)."""
    root = copy("vid24", tmp_path)

    def fn(info):
        feat = info["features"][TOP]
        feat.update(shape=[3, 96, 128], names=["channels", "height", "width"])
        for k in ("video.height", "video.width"):
            del feat["info"][k]

    edit_info(root, fn)
    code, findings = validate_json(root, "--checks", "info,video")
    assert code == 0 and findings == []
    edit_info(root, lambda info: info["features"][TOP].update(names=["c", "h", "w", "x"]))
    code, findings = validate_json(root, "--checks", "info,video")
    assert code == 1 and "info.names" in {f["check"] for f in findings}  # then read as HWC


def test_image_shape_against_the_images(make_sample):
    root = make_sample(episodes=8, tasks=2, seed=1, images=True, data_files_size_in_mb=0.05)
    key = "observation.images.wrist"
    assert validate_json(root, "--deep")[0] == 0
    edit_info(root, lambda info: info["features"][key].update(shape=[4, 2, 3]))
    code, findings = validate_json(root, "--deep")
    hits = [f for f in findings if f["check"] == "data.image_shape"]
    files = sorted(str(p.relative_to(root)) for p in root.glob("data/*/*.parquet"))
    assert code == 1 and sorted(f["file"] for f in hits) == files and len(files) > 1
    assert (
        "image of 2x2x3 (height x width x channels) but the shape [4, 2, 3]" in hits[0]["message"]
    )
    assert "data.image_shape" not in {f["check"] for f in validate_json(root)[1]}  # deep only


def test_image_headers():
    pil = pytest.importorskip("PIL.Image")
    for mode, size, channels in (("RGB", (5, 3), 3), ("L", (7, 2), 1), ("RGBA", (1, 4), 4)):
        for fmt in ("PNG", "JPEG"):
            if fmt == "JPEG" and mode == "RGBA":
                continue
            buf = io.BytesIO()
            pil.new(mode, size).save(buf, format=fmt)
            assert image_size(buf.getvalue()) == (size[1], size[0], channels), (mode, fmt)
    assert image_size(b"GIF89a....") is None and image_size(b"\x89PNG\r\n\x1a\n") is None


@pytest.mark.parametrize(
    "feat, problem",
    [
        ({"dtype": "float32", "shape": [3], "names": ["x", "y", "z"]}, None),
        ({"dtype": "float32", "shape": [3], "names": None}, None),
        ({"dtype": "float32", "shape": [3], "names": {"motors": ["a", "b", "c"]}}, None),
        ({"dtype": "float32", "shape": [3], "names": {"arm": ["a", "b"], "grip": ["g"]}}, None),
        ({"dtype": "float32", "shape": [3], "names": ["x", "y"]}, "2 names for shape [3]"),
        ({"dtype": "float32", "shape": [2], "names": {"motors": ["a"]}}, "1 names for shape"),
        ({"dtype": "float32", "shape": [2], "names": ["a", "a"]}, "repeated names ['a']"),
        ({"dtype": "float32", "shape": [2], "names": [1, 2]}, "must be strings"),
        ({"dtype": "float32", "shape": [2], "names": "ab"}, "must be null, a list"),
        ({"dtype": "image", "shape": [4, 5, 3], "names": ["height", "width", "channel"]}, None),
        ({"dtype": "video", "shape": [3, 4, 5], "names": ["channels", "height", "width"]}, None),
        ({"dtype": "video", "shape": [4, 5, 3], "names": ["a", "b", "c"]}, "must name the 3"),
    ],
)
def test_names_rules(feat, problem):
    got = _names_problem("f", feat)
    assert (got is None) if problem is None else (problem in got[1]), got


def test_visual_axes():
    assert visual_axes({"shape": [3, 4, 5], "names": ["channels", "height", "width"]}) == {
        "height": 4,
        "width": 5,
        "channels": 3,
    }
    assert visual_axes({"shape": [4, 5, 3], "names": None})["height"] == 4


def test_multi_dimensional_shapes_against_the_stored_type():
    import pyarrow as pa

    from episodekit.validate.meta import feature_type_problem

    feat = {"dtype": "float32", "shape": [2, 3]}
    nested = pa.list_(pa.list_(pa.float32(), 3), 2)
    assert feature_type_problem("x", feat, nested) is None
    assert feature_type_problem("x", feat, pa.list_(pa.float32(), 6)) is None  # flattened
    assert feature_type_problem("x", feat, pa.list_(pa.list_(pa.float32()))) is None
    assert "shape [3, 2] stored as" in feature_type_problem("x", {**feat, "shape": [3, 2]}, nested)
    assert "float64 values" in feature_type_problem("x", {**feat, "dtype": "float64"}, nested)
