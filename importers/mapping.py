"""The import map: which source keys become which LeRobot features, and what to do with
quirks. A TOML file (``--map MAP.toml``), or a reader's built-in one (``--print-map`` writes it
for the user to edit). Read with the standard library; every mistake is one line naming the map
and the key.

The structure (every table optional but ``[features]``; the reader's built-in map fills it)::

    fps = 10                        # frames per second; required when the source has no rate
    robot_type = "franka"           # info.json's robot_type

    [source]                        # the reader's options (format specific, e.g. ROS topics)

    [task]                          # the task of each frame: exactly one of
    key = "language_instruction"    #   a per-step text key (a change within an episode gives
                                    #   that frame its own task)
    # meta = "episode_metadata/task"  an episode-level value
    # text = "pick up the cube"       the same task for every episode

    [features."observation.state"]
    keys = ["observation/state", "observation/gripper"]  # concatenated on the last axis
    dtype = "float32"               # a declared cast (the output equals the source after it)
    names = ["x", "y", "z", "g"]    # per-dimension names (info.json)

    [features."observation.images.wrist"]
    keys = ["observation/wrist_image"]   # one image key
    channels = "bgr"                # the source's channel order (swapped to RGB); default "rgb"
    video = "av1"                   # "av1", "h264" or "none" (PNG in the rows); default --video

    [episodes]                      # what each quirk does: "refuse" (the default) or "skip"
    zero_length = "refuse"          # an episode without steps
    nan = "refuse"                  # NaN or inf in an array ("allow" keeps them)
    duplicate = "refuse"            # an episode id seen before
    missing_key = "refuse"          # a mapped key absent from an episode (a topic from a bag)
    image_size = "refuse"           # an image key whose size differs from the first episode's
    meta = ["episode_metadata/file_path"]   # episode-level values kept as per-episode columns

Names: a feature may not be one LeRobot reserves (``index``, ``episode_index``, ``frame_index``,
``timestamp``, ``task_index``, ``task``); image features are named ``observation.images.<cam>``
by convention (not enforced). Scalars per step become shape ``(1,)`` features, vectors ``(D,)``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.core.errors import DatasetError
from episodekit.importers.episode import Images, Key, RawEpisode, SourceError

RESERVED = ("index", "episode_index", "frame_index", "timestamp", "task_index", "task")
VIDEO = ("av1", "h264", "none")
CHANNELS = ("rgb", "bgr")
MAX_FPS = 1e6  # a rate at or above it is a typo (and inf has no whole frame count)
POLICIES: dict[str, tuple[str, ...]] = {  # quirk -> allowed answers (the first is the default)
    "zero_length": ("refuse", "skip"),
    "nan": ("refuse", "skip", "allow"),
    "duplicate": ("refuse", "skip"),
    "missing_key": ("refuse", "skip"),
    "image_size": ("refuse", "skip"),
}
TOP = ("fps", "robot_type", "format", "source", "task", "features", "episodes")
FEATURE_FIELDS = ("keys", "dtype", "names", "channels", "video")
NUMERIC = re.compile(r"^(bool|u?int(8|16|32|64)|float(16|32|64))$")


class MapError(ValueError):
    """The map is malformed or names what the source lacks (exit 2: the command as asked
    cannot run); one line naming the map and the key."""


@dataclass(frozen=True)
class FeatureMap:
    """One output feature: its source ``keys`` (arrays concatenated on the last axis, or one
    image key), an optional cast, names, and for images the channel order and video codec."""

    name: str
    keys: tuple[str, ...]
    kind: str  # "array" or "image"
    dtype: str | None = None
    names: tuple[str, ...] | None = None
    channels: str = "rgb"
    video: str | None = None


@dataclass(frozen=True)
class TaskRule:
    """Where each frame's task comes from: a per-step text ``key``, an episode-level ``meta``
    value, or a fixed ``text`` (exactly one is set)."""

    key: str | None = None
    meta: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class ImportMap:
    """A parsed, checked map (see the module docstring)."""

    features: tuple[FeatureMap, ...]
    task: TaskRule
    fps: float | None = None
    robot_type: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    policies: dict[str, str] = field(default_factory=dict)
    meta: tuple[str, ...] = ()

    def policy(self, quirk: str) -> str:
        return self.policies.get(quirk, POLICIES[quirk][0])


@dataclass
class MappedEpisode:
    """A source episode after the map: ``columns`` feature -> (T,) or (T, D) numpy arrays in
    the output dtype; ``images`` feature -> (images, channel order); ``tasks`` one string per
    frame; ``meta`` the kept episode-level values."""

    source: str
    length: int
    columns: dict[str, np.ndarray]
    images: dict[str, tuple[Images, str]]
    tasks: list[str]
    meta: dict[str, Any]
    report: dict[str, Any] = field(default_factory=dict)


class Skip(Exception):  # noqa: N818 - control flow: the map says to skip this episode
    """An episode the map's policy skips; ``reason`` is said in the report (one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Reading and checking a map


def load_map(path: str | Path) -> dict[str, Any]:
    """The TOML file at ``path`` as a dict (:class:`MapError` if unreadable)."""
    import tomllib

    p = Path(path)
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise MapError(f"{p}: cannot read the map ({exc.strerror or exc})") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise MapError(f"{p}: not a valid TOML map ({exc})") from exc


def _fail(where: str, message: str) -> MapError:
    return MapError(f"{where}: {message}")


def _str_list(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise _fail(where, "must be a string or a non-empty list of strings")
    return tuple(value)


def _choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise _fail(where, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _unknown(table: dict, known: tuple[str, ...], where: str) -> None:
    extra = [k for k in table if k not in known]
    if extra:
        raise _fail(where, f"unknown key {extra[0]!r} (known: {', '.join(known)})")


def parse_map(doc: dict[str, Any], keys: dict[str, Key], name: str = "map") -> ImportMap:
    """Check ``doc`` (a TOML map as a dict) against the source's ``keys`` and return it parsed.
    ``name`` names the map in errors (its path, or "the built-in map")."""
    if not isinstance(doc, dict):
        raise _fail(name, "must be a table")
    _unknown(doc, TOP, name)
    fps = doc.get("fps")
    if fps is not None and (
        isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < MAX_FPS
        or not math.isfinite(fps)
    ):  # fmt: skip
        raise _fail(f"{name}: fps", f"must be a positive number, got {fps!r}")
    robot = doc.get("robot_type")
    if robot is not None and not isinstance(robot, str):
        raise _fail(f"{name}: robot_type", "must be a string")
    source = doc.get("source", {})
    if not isinstance(source, dict):
        raise _fail(f"{name}: [source]", "must be a table")
    features = _features(doc.get("features"), keys, name)
    task = _task(doc.get("task"), keys, name)
    policies, meta = _episodes(doc.get("episodes", {}), name)
    return ImportMap(
        features=features,
        task=task,
        fps=float(fps) if fps is not None else None,
        robot_type=robot,
        source=dict(source),
        policies=policies,
        meta=meta,
    )


def _features(table: Any, keys: dict[str, Key], name: str) -> tuple[FeatureMap, ...]:
    if not isinstance(table, dict) or not table:
        raise _fail(f"{name}: [features]", "must map at least one feature")
    out = []
    used: dict[str, str] = {}
    for feat, spec in table.items():
        where = f"{name}: features.{feat!r}"
        if feat in RESERVED or not feat or feat != feat.strip():
            raise _fail(where, f"{feat!r} is a name LeRobot reserves or not a name")
        if not isinstance(spec, dict):
            raise _fail(where, "must be a table with keys = [...]")
        _unknown(spec, FEATURE_FIELDS, where)
        src = _str_list(spec.get("keys"), f"{where}.keys")
        for k in src:
            if k not in keys:
                known = ", ".join(sorted(keys)[:12])
                raise _fail(f"{where}.keys", f"{k!r} is not in the source (it has: {known})")
            if k in used and keys[k].kind == "image":
                raise _fail(f"{where}.keys", f"{k!r} is already mapped to {used[k]!r}")
            used.setdefault(k, feat)
        kinds = {keys[k].kind for k in src}
        if kinds == {"image"}:
            kind = "image"
            if len(src) != 1:
                raise _fail(f"{where}.keys", "an image feature takes exactly one image key")
        elif kinds == {"array"}:
            kind = "array"
            shapes = [keys[k].shape for k in src]
            if any(len(s) > 1 for s in shapes):
                raise _fail(
                    f"{where}.keys",
                    "arrays of more than one dimension per step are not mapped "
                    "(flatten them in the source or map each part)",  # fmt: skip
                )
        else:
            raise _fail(f"{where}.keys", f"mixes {' and '.join(sorted(kinds))} keys")
        dtype = spec.get("dtype")
        if dtype is not None and (kind != "array" or not NUMERIC.match(str(dtype))):
            raise _fail(f"{where}.dtype", f"must be a numeric dtype of an array, got {dtype!r}")
        names = spec.get("names")
        if names is not None:
            names = _str_list(names, f"{where}.names")
            width = sum(max(1, int(np.prod(keys[k].shape))) for k in src)
            if kind != "array" or len(names) != width:
                raise _fail(f"{where}.names", f"needs {width} names, got {len(names)}")
        channels = _choice(spec.get("channels", "rgb"), CHANNELS, f"{where}.channels")
        video = spec.get("video")
        if video is not None:
            _choice(video, VIDEO, f"{where}.video")
        if kind != "image" and ("channels" in spec or video is not None):
            raise _fail(where, "channels and video apply to image features only")
        out.append(FeatureMap(feat, src, kind, dtype, names, channels, video))
    return tuple(out)


def _task(table: Any, keys: dict[str, Key], name: str) -> TaskRule:
    where = f"{name}: [task]"
    if table is None:
        return TaskRule(text="")
    if not isinstance(table, dict):
        raise _fail(where, "must be a table")
    _unknown(table, ("key", "meta", "text"), where)
    given = {k: v for k, v in table.items() if v is not None}
    if len(given) != 1 or not all(isinstance(v, str) for v in given.values()):
        raise _fail(where, "needs exactly one of key, meta or text (a string)")
    key = given.get("key")
    if key is not None and (key not in keys or keys[key].kind != "text"):
        texts = ", ".join(k for k, v in sorted(keys.items()) if v.kind == "text") or "none"
        raise _fail(f"{where}.key", f"{key!r} is not a text key of the source (it has: {texts})")
    return TaskRule(**given)


def _episodes(table: Any, name: str) -> tuple[dict[str, str], tuple[str, ...]]:
    where = f"{name}: [episodes]"
    if not isinstance(table, dict):
        raise _fail(where, "must be a table")
    _unknown(table, (*POLICIES, "meta"), where)
    policies = {q: _choice(table[q], POLICIES[q], f"{where}.{q}") for q in POLICIES if q in table}
    meta = _str_list(table["meta"], f"{where}.meta") if "meta" in table else ()
    return policies, meta


# --------------------------------------------------------------------------------------------
# Writing a map (``--print-map``)


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def dump_map(doc: dict[str, Any], comment: str = "") -> str:
    """``doc`` (a map as :func:`parse_map` takes it) as TOML text that reads back equal; a
    leading ``comment`` (lines prefixed ``# ``). Tables nest one level below the top
    (``[features."observation.state"]``), which is all a map has."""
    lines = [f"# {line}".rstrip() for line in comment.splitlines()] if comment else []
    plain = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in plain.items()]
    for k, v in doc.items():
        if not isinstance(v, dict):
            continue
        subs = {a: b for a, b in v.items() if isinstance(b, dict)}
        flat = {a: b for a, b in v.items() if not isinstance(b, dict)}
        if flat or not subs:
            lines += ["", f"[{_toml_key(k)}]"]
            lines += [f"{_toml_key(a)} = {_toml_value(b)}" for a, b in flat.items()]
        for a, b in subs.items():
            lines += ["", f"[{_toml_key(k)}.{_toml_key(a)}]"]
            for c, d in b.items():
                if isinstance(d, dict):
                    raise TypeError(f"map tables nest two levels at most ({k}.{a}.{c})")
                lines.append(f"{_toml_key(c)} = {_toml_value(d)}")
    return "\n".join(lines).lstrip("\n") + "\n"


# --------------------------------------------------------------------------------------------
# Applying a map to an episode


def feature_shape(f: FeatureMap, keys: dict[str, Key]) -> tuple[int, ...]:
    """The output shape of ``f`` per frame: (D,) for arrays (a scalar is (1,)), (H, W, C) for
    images (the source's first episode's, from ``keys``)."""
    if f.kind == "image":
        return tuple(keys[f.keys[0]].shape)
    return (sum(max(1, int(np.prod(keys[k].shape))) for k in f.keys),)


def feature_dtype(f: FeatureMap, keys: dict[str, Key]) -> str:
    """The output dtype of ``f``: its declared cast, else the source's (concatenated keys of
    different dtypes take numpy's common type)."""
    if f.kind == "image":
        return "uint8"
    if f.dtype:
        return f.dtype
    return str(np.result_type(*[np.dtype(keys[k].dtype) for k in f.keys]))


def apply_map(
    raw: RawEpisode, m: ImportMap, keys: dict[str, Key], file: str | None = None
) -> MappedEpisode:
    """``raw`` through ``m``: arrays concatenated and cast, images with their channel order,
    the tasks per frame, the kept meta. Quirks follow the map's policies: ``refuse`` raises
    :class:`SourceError` (one line: file, episode, key), ``skip`` raises :class:`Skip`."""
    n = raw.length
    ep = raw.source

    def quirk(what: str, message: str, key: str | None = None) -> None:
        if m.policy(what) == "skip":
            raise Skip(f"{ep}: {f'key {key!r}: ' if key else ''}{message}")
        raise SourceError(
            f"{message} ([episodes] {what} = \"skip\" in the map skips such episodes)",
            file, ep, key,
        )  # fmt: skip

    if n == 0:
        quirk("zero_length", "the episode has no steps")
    columns: dict[str, np.ndarray] = {}
    images: dict[str, tuple[Images, str]] = {}
    for f in m.features:
        if f.kind == "image":
            k = f.keys[0]
            img = raw.images.get(k)
            if img is None:
                quirk("missing_key", "the mapped image key is missing", k)
                continue
            if len(img) != n:
                raise SourceError(f"{len(img)} images for {n} steps", file, ep, k)
            images[f.name] = (img, f.channels)
            continue
        parts = []
        for k in f.keys:
            a = raw.arrays.get(k)
            if a is None:
                quirk("missing_key", "the mapped key is missing", k)
                continue
            a = np.asarray(a)
            if a.shape[:1] != (n,):
                got = a.shape[0] if a.ndim else 0
                raise SourceError(f"{got} values for {n} steps", file, ep, k)
            want = keys[k].shape
            if a.shape[1:] != tuple(want) and not (a.ndim == 1 and tuple(want) in ((), (1,))):
                raise SourceError(
                    f"shape per step {a.shape[1:]}, the source declares {tuple(want)} (ragged)",
                    file, ep, k,
                )  # fmt: skip
            parts.append(a.reshape(n, -1))
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        out = out.astype(feature_dtype(f, keys), copy=False)
        if out.dtype.kind == "f" and m.policy("nan") != "allow":
            bad = ~np.isfinite(out)
            if bad.any():
                step = int(np.argwhere(bad)[0][0])
                quirk("nan", f"NaN or inf at step {step}", ",".join(f.keys))
        columns[f.name] = out
    tasks = _tasks(raw, m, file)
    meta = {k: raw.meta[k] for k in m.meta if k in raw.meta}
    missing = [k for k in m.meta if k not in raw.meta]
    if missing:
        quirk("missing_key", "the episode-level value is missing", missing[0])
    return MappedEpisode(ep, n, columns, images, tasks, meta, dict(raw.report))


def _tasks(raw: RawEpisode, m: ImportMap, file: str | None) -> list[str]:
    rule = m.task
    if rule.key is not None:
        texts = raw.texts.get(rule.key)
        if texts is None or len(texts) != raw.length:
            raise SourceError("the task key is missing or not one per step", file, raw.source,
                              rule.key)  # fmt: skip
        return [str(t) for t in texts]
    if rule.meta is not None:
        if rule.meta not in raw.meta:
            raise SourceError("the task value is missing", file, raw.source, rule.meta)
        return [str(raw.meta[rule.meta])] * raw.length
    return [rule.text or ""] * raw.length


def check_task(tasks: list[str], source: str, file: str | None = None) -> None:
    """LeRobot needs a non-empty task for every frame."""
    if any(not t for t in tasks):
        raise DatasetError(
            f'episode {source}: a frame has no task; give [task] text = "..." in the map',
            file,
        )
