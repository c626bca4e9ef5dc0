"""``meta/info.json`` as a typed value: :class:`Info` and its :class:`Feature` entries, parsed
once from the JSON object.

Two ways to parse: :meth:`Info.parse` (strict, for readers) raises :class:`InfoError`, one line
naming the key at fault; :meth:`Info.parse_tolerant` (``validate``, ``repair``) returns what could
be read and a :class:`LayoutFinding` per problem, a bad key read as missing. Either way nothing
is lost: keys the model does not know are kept with their values, and every key in its place,
so :meth:`Info.to_dict` gives back the object read, which the writers dump byte for byte as it
was (:meth:`Info.to_json`).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, fields
from typing import Any

from episodekit.core.errors import DatasetError
from episodekit.core.layout.rules import (
    DATA_PATH_V2,
    DATA_PATH_V3,
    DEFAULT_CHUNKS_SIZE,
    ORDER,
    VIDEO_PATH_V2,
    VIDEO_PATH_V3,
    dtype_problem,
    finite,
    non_negative_int,
    positive,
    positive_int,
    shape_ok,
    shown,
)
from episodekit.core.paths import INFO_FILE


class InfoError(DatasetError):
    """A key of info.json is missing or holds what LeRobot never writes there (one line)."""


@dataclass(frozen=True)
class LayoutFinding:
    """One problem of info.json found by :meth:`Info.parse_tolerant`: the key (``fps``,
    ``features``, ``features['action']``) and what is wrong with it."""

    key: str
    message: str


@dataclass(frozen=True)
class Feature:
    """One entry of info.json's ``features``: dtype, shape, ``names`` (null, a list of strings,
    or older LeRobot's ``{group: [strings]}``), a camera's ``info``; ``extra``: keys the model
    does not know; ``keys``: the entry's keys in their order on disk (None: a new entry)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    names: Any = field(default=None, hash=False)
    info: dict | None = field(default=None, hash=False)
    extra: dict = field(default_factory=dict, hash=False)
    keys: tuple[str, ...] | None = None

    @property
    def is_video(self) -> bool:
        return self.dtype == "video"

    @property
    def is_image(self) -> bool:
        return self.dtype == "image"

    def to_dict(self) -> dict:
        """The entry as info.json holds it (a copy)."""
        known = {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}
        if self.info is not None:
            known["info"] = self.info
        order = list(self.keys) if self.keys is not None else list(known)
        set_since = [k for k, v in known.items() if v is not None]  # (names: null if new)
        order += [k for k in (*set_since, *self.extra) if k not in order]
        out = {}
        for k in order:
            if k in self.extra:
                out[k] = self.extra[k]
            elif k in known:
                out[k] = known[k]
        return copy.deepcopy(out)


# Info's typed keys (each a field of the same name), with the rule a present value must follow.
_SCALARS: dict[str, tuple[Any, str]] = {
    "codebase_version": (lambda v: isinstance(v, str), "a string"),
    "fps": (positive, "a positive number"),
    "total_episodes": (non_negative_int, "an integer >= 0"),
    "total_frames": (non_negative_int, "an integer >= 0"),
    "total_tasks": (non_negative_int, "an integer >= 0"),
    "chunks_size": (positive_int, "a positive integer"),
    "data_files_size_in_mb": (positive, "a positive number"),
    "video_files_size_in_mb": (positive, "a positive number"),
    "data_path": (lambda v: isinstance(v, str) and bool(v), "a path template"),
    "video_path": (lambda v: isinstance(v, str) and bool(v), "a path template"),
    "robot_type": (lambda v: isinstance(v, str), "a string"),
    "splits": (lambda v: isinstance(v, dict), "an object"),
}
REQUIRED = ("codebase_version", "fps", "features")


@dataclass(frozen=True)
class Info:
    """info.json: the keys LeRobot writes, typed (None: absent or null), ``features`` by name,
    ``extra`` the keys the model does not know (``total_chunks``, ``tools``, ...) and ``keys``
    the order of the keys on disk (None: a new info.json, written in LeRobot's order)."""

    codebase_version: str
    fps: int | float
    features: dict[str, Feature] = field(default_factory=dict, hash=False)
    total_episodes: int | None = None
    total_frames: int | None = None
    total_tasks: int | None = None
    chunks_size: int | None = None
    data_files_size_in_mb: int | float | None = None
    video_files_size_in_mb: int | float | None = None
    data_path: str | None = None
    video_path: str | None = None
    robot_type: str | None = None
    splits: dict | None = field(default=None, hash=False)
    extra: dict = field(default_factory=dict, hash=False)
    keys: tuple[str, ...] | None = None

    # ---------------------------------------------------------------------------------------
    # reading

    @classmethod
    def parse(cls, obj: object, path: str = INFO_FILE) -> Info:
        """info.json read strictly (readers): :class:`InfoError` naming ``path`` and the first
        key that is missing (codebase_version, fps, features) or holds a value LeRobot never
        writes there (a non-positive fps or size, a negative total, a feature without a known
        dtype or with a shape that is not a list of positive integers, a number not finite)."""
        found: list[LayoutFinding] = []
        info = _parse(obj, found, strict=True)
        if found:
            raise InfoError(found[0].message, path)
        assert info is not None
        return info

    @classmethod
    def parse_tolerant(cls, obj: object) -> tuple[Info | None, list[LayoutFinding]]:
        """info.json read as far as it can be (validate, repair): the :class:`Info` with each bad
        key read as absent (a bad feature entry left out), and one finding per problem; None
        when ``obj`` is not a JSON object."""
        found: list[LayoutFinding] = []
        return _parse(obj, found, strict=False), found

    # ---------------------------------------------------------------------------------------
    # what readers ask

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_video]

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.is_image]

    @property
    def chunks(self) -> int:
        """Files per chunk folder (LeRobot's default when info.json does not say)."""
        return self.chunks_size or DEFAULT_CHUNKS_SIZE

    def template(self, kind: str) -> str:
        """``data_path`` or ``video_path`` (``kind``: "data", "video"), else the version's
        default template."""
        v2 = self.codebase_version in ("v2.0", "v2.1")
        if kind == "data":
            return self.data_path or (DATA_PATH_V2 if v2 else DATA_PATH_V3)
        return self.video_path or (VIDEO_PATH_V2 if v2 else VIDEO_PATH_V3)

    # ---------------------------------------------------------------------------------------
    # writing

    def to_dict(self) -> dict:
        """info.json's object (a copy): the keys read in their order, a key set since placed
        after the key LeRobot writes before it, the keys the model does not know kept."""
        values: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("extra", "keys"):
                continue
            v = getattr(self, f.name)
            if f.name == "features":
                v = {name: feat.to_dict() for name, feat in v.items()}
            values[f.name] = v
        if self.keys is None:
            order = [k for k in ORDER]
        else:
            order = [k for k in self.keys if k in self.extra or k in values]
            for k in ORDER:  # set since parsing: after the key LeRobot writes before it
                if k not in order and values.get(k) is not None:
                    before = ORDER[: ORDER.index(k)]
                    at = max((i + 1 for i, x in enumerate(order) if x in before), default=0)
                    order.insert(at, k)
        order += [k for k in self.extra if k not in order]
        out = {k: (self.extra[k] if k in self.extra else values[k]) for k in order}
        return copy.deepcopy(out)

    def to_json(self) -> str:
        """info.json's text as episodekit writes it (LeRobot's indent); a number that is not
        finite is an error (``ValueError``), never written as ``Infinity``."""
        return json.dumps(self.to_dict(), indent=4, allow_nan=False)


def _parse(obj: object, found: list[LayoutFinding], strict: bool) -> Info | None:
    """Both parses: ``found`` gets a finding per problem (strict: stop at the first)."""
    if not isinstance(obj, dict):
        found.append(LayoutFinding("", f"must be a JSON object, got {type(obj).__name__}"))
        return None
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key in REQUIRED:
        if obj.get(key) is None:
            found.append(LayoutFinding(key, f"{key} is missing"))
            if strict:
                return None
    for key, value in obj.items():
        if key == "features":
            values[key] = _features(value, found, strict)
        elif key in _SCALARS:
            ok, what = _SCALARS[key]
            if value is None or ok(value):
                values[key] = value
            else:
                found.append(LayoutFinding(key, f"{key} must be {what}, got {shown(value)}"))
        elif finite(value):
            extra[key] = value
        else:
            found.append(LayoutFinding(key, f"{key} holds a number that is not finite"))
        if strict and found:
            return None
    values.setdefault("codebase_version", None)
    values.setdefault("fps", None)
    values["features"] = values.get("features") or {}
    return Info(**values, extra=extra, keys=tuple(obj))


def _features(value: object, found: list[LayoutFinding], strict: bool) -> dict[str, Feature]:
    if not isinstance(value, dict):
        found.append(LayoutFinding("features", f"features must be an object, got "
                                   f"{shown(value)}"))  # fmt: skip
        return {}
    out = {}
    for name, entry in value.items():
        why = _feature_entry_problem(name, entry)
        if why:
            found.append(LayoutFinding(f"features[{name!r}]", why))
            if strict:
                return out
            continue
        known = ("dtype", "shape", "names", "info")
        out[name] = Feature(
            name=name,
            dtype=entry["dtype"],
            shape=tuple(entry["shape"]),
            names=entry.get("names"),
            info=entry.get("info"),
            extra={k: v for k, v in entry.items() if k not in known},
            keys=tuple(entry),
        )
    return out


def _feature_entry_problem(name: str, entry: object) -> str:
    """Why a features entry cannot be read ("" when it can); ``names`` may be absent."""
    if not isinstance(entry, dict):
        return f"features[{name!r}] is not an object"
    why = dtype_problem(name, entry.get("dtype"))
    if why:
        return why
    if not shape_ok(entry.get("shape")):
        return f"features[{name!r}] has shape {shown(entry.get('shape'))}: it must be a " \
            "list of positive integers"  # fmt: skip
    names = entry.get("names")
    if names is not None and not isinstance(names, (list, dict)):
        return f"features[{name!r}] has names {shown(names)}: null, a list or an object"
    if entry.get("info") is not None and not isinstance(entry["info"], dict):
        return f"features[{name!r}] has info {shown(entry['info'])}: it must be an object"
    if not finite(entry):
        return f"features[{name!r}] holds a number that is not finite"
    return ""
