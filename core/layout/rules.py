"""The rules of LeRobot's ``meta/info.json``, in one place: the default path templates and
sizes, the order LeRobot writes its keys in, its default features, the dtype names a feature may
declare, and the checks of one value (a positive number, a finite number, a feature entry).
:mod:`episodekit.core.layout.info` parses by them; ``repair`` rebuilds by them."""

from __future__ import annotations

import json
import math
import re

from episodekit.core.paths import (  # noqa: F401 - re-exported: the layout's default templates
    DATA_PATH_V2,
    DATA_PATH_V3,
    EPISODES_PATH_V3,
    VIDEO_PATH_V2,
    VIDEO_PATH_V3,
)

V3 = "v3.0"
# LeRobot 0.6.1's DatasetInfo fields, in its order (a new or rebuilt info.json is written in it).
ORDER = (
    "codebase_version", "fps", "features", "total_episodes", "total_frames", "total_tasks",
    "chunks_size", "data_files_size_in_mb", "video_files_size_in_mb", "data_path",
    "video_path", "robot_type", "splits",
)  # fmt: skip
DEFAULT_CHUNKS_SIZE = 1000
DEFAULT_DATA_FILES_SIZE_IN_MB = 100
DEFAULT_VIDEO_FILES_SIZE_IN_MB = 200
DEFAULT_SIZES = {
    "chunks_size": DEFAULT_CHUNKS_SIZE,
    "data_files_size_in_mb": DEFAULT_DATA_FILES_SIZE_IN_MB,
    "video_files_size_in_mb": DEFAULT_VIDEO_FILES_SIZE_IN_MB,
}
# LeRobot's DEFAULT_FEATURES: every recording has them, after the user's features.
DEFAULT_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
# The dtypes a feature may declare: datasets' Value names (LeRobot declares a column by one), its
# kinds (image, video, audio, language), and the nested kinds the loaders hand out as Python
# objects (loaders/frames.py ``python_valued``); datasets' parametrized names by PARAMETRIZED.
NUMERIC_DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64",
)  # fmt: skip
DTYPES = (
    *NUMERIC_DTYPES, "string", "large_string", "binary", "large_binary", "null", "date32",
    "date64", "image", "video", "audio", "language", "struct", "list",
)  # fmt: skip
PARAMETRIZED = re.compile(
    r"(timestamp|time32|time64|duration)\[[a-z]{1,2}(, tz=[^\]]+)?\]"
    r"|decimal(128|256)\(\d+, ?-?\d+\)"
)


def finite(value: object) -> bool:
    """No number in ``value`` (nested) is infinite or NaN (``1e999`` reads as infinity, which
    JSON cannot hold)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list):
        return all(finite(v) for v in value)
    return True


def positive(value: object) -> bool:
    """A positive finite number (not a bool)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def positive_int(value: object) -> bool:
    """A positive integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def non_negative_int(value: object) -> bool:
    """A count: an integer >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def shown(value: object) -> str:
    """A value as a message shows it: JSON, cut at 60 characters; "missing" for None."""
    if value is None:
        return "missing"
    text = json.dumps(value) if finite(value) else repr(value)
    return f"{text[:60]}..." if len(text) > 60 else text


def shape_ok(shape: object) -> bool:
    """A feature's shape: a non-empty list of positive integers."""
    return isinstance(shape, list) and bool(shape) and all(positive_int(x) for x in shape)


def feature_problem(name: str, feat: object) -> str:
    """Why one declared feature is not an entry LeRobot can read ("" when it is): an object with
    a dtype string, a shape (:func:`shape_ok`), ``names``, and only finite numbers."""
    if not isinstance(feat, dict):
        return f"features[{name!r}] is not an object"
    shape = feat.get("shape")
    if not isinstance(feat.get("dtype"), str):
        return f"features[{name!r}] has no dtype"
    if not shape_ok(shape):
        return f"features[{name!r}] has shape {shown(shape)}"
    if "names" not in feat:
        return f"features[{name!r}] has no names"
    if not finite(feat):
        return f"features[{name!r}] holds a number that is not finite"
    return ""


def dtype_problem(name: str, dtype: object) -> str:
    """Why a feature's dtype is not one of :data:`DTYPES` ("" when it is)."""
    if dtype in DTYPES or (isinstance(dtype, str) and PARAMETRIZED.fullmatch(dtype)):
        return ""
    if dtype is None:
        return f"features[{name!r}] has no dtype"
    return (
        f"features[{name!r}] has dtype {shown(dtype)}, not one LeRobot declares (float32, "
        "int64, string, image, video, ...)"
    )
