"""``meta/info.json`` as ``episodekit repair`` works from it and writes it: kept as it is when every
key LeRobot reads is sound; a damaged key (LeRobot rewrites info.json in place after every
episode, so a crash can leave it cut short, and other tools leave other damage) rebuilt from the
data where the data says it, else refused with one line naming the key. Never copied broken.

What LeRobot 0.6.1 writes (``DatasetInfo``, ``create_empty_dataset_info``) and what is derived:

- ``codebase_version`` "v3.0": kept when it says "v3.0"; another version is refused (repair reads
  v3.0); missing or not a string, "v3.0" when the root has the v3.0 layout;
- ``fps``: a positive finite number; else derived from the timestamps LeRobot wrote as
  ``frame_index / fps`` (stored float32) when one integer fps gives every stored timestamp bit
  for bit (:func:`derive_fps`), else refused;
- ``features``: every data column declared with a type that stores it (as ``validate`` checks),
  every entry ``{dtype, shape, names}``; else rebuilt: the data columns from the ``huggingface``
  schema metadata of a data file with a footer (else its Arrow types) the way
  ``get_hf_features_from_features`` declares them (images: their size from the first image),
  each camera of ``videos/`` from its first mp4 the way ``update_video_info`` probes it; a sound
  old entry's ``names`` (and a camera's ``info``) are kept;
- ``chunks_size`` (1000), ``data_files_size_in_mb`` (100), ``video_files_size_in_mb`` (200):
  positive numbers; else the chunk size the files' layout shows, or LeRobot's defaults;
- ``data_path``, ``video_path``: templates that name the files on disk; else LeRobot v3.0's;
- ``robot_type`` a string or null (else null); ``total_*`` and ``splits`` are the plan's
  (:mod:`episodekit.writers.repair_plan` compares them, the build writes them);
- any other key holding a number that is not finite (``1e999`` reads as infinity, which JSON
  cannot hold) is dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.errors import DatasetError
from episodekit.core.layout.info import Info
from episodekit.core.layout.rules import (
    DATA_PATH_V3,
    DEFAULT_FEATURES,
    DEFAULT_SIZES,
    ORDER,
    V3,
    VIDEO_PATH_V3,
    feature_problem,
    finite,
    positive,
    positive_int,
    shown,
)
from episodekit.core.paths import INFO_FILE as INFO
from episodekit.core.paths import UnsafePathError, format_template

LANGUAGE_COLUMNS = ("language_persistent", "language_events")
CHUNK_FILE = re.compile(r"chunk-(\d+)/file-(\d+)\.(?:parquet|mp4)$")
# pyarrow's name for a type -> the dtype string LeRobot (datasets' Value) declares
ARROW_DTYPES = {"float": "float32", "double": "float64", "halffloat": "float16"}


class InfoRefused(DatasetError):
    """A key of info.json is damaged and the data does not tell what it was."""


@dataclass
class CheckedInfo:
    """``info``: what repair works from (damaged keys rebuilt); ``on_disk``: info.json as read
    (None when unreadable); ``damages``: (file, what) pairs; ``fps_problem``: why fps must come
    from the timestamps ("" when it is sound)."""

    info: dict
    on_disk: dict | None
    damages: list[tuple[str, str]] = field(default_factory=list)
    fps_problem: str = ""


def _chunk_file(rel: str) -> tuple[int, int] | None:
    m = CHUNK_FILE.search(rel)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _v3_layout(root: Path) -> bool:
    return (root / "meta/episodes").is_dir() or any(root.glob("data/chunk-*/file-*.parquet"))


# --------------------------------------------------------------------------------------------
# features


def features_problem(feats: object, schema: pa.Schema | None, video_keys: list[str]) -> str:
    """Why info.json's features cannot be kept ("" when they can): not an object, an entry
    LeRobot cannot read, a declared data feature missing from the data or stored in a type that
    does not hold it, a camera of ``videos/`` not declared."""
    from episodekit.validate.meta import feature_type_problem

    if feats is None:
        return "features is missing"
    if not isinstance(feats, dict) or not feats:
        return f"features is {shown(feats)}"
    for name, feat in feats.items():
        why = feature_problem(name, feat)
        if why:
            return why
    for key in video_keys:
        if feats.get(key, {}).get("dtype") != "video":
            return f"features does not declare the camera {key} (videos/{key}/)"
    if schema is not None:
        for name, feat in feats.items():
            if feat["dtype"] == "video":
                continue
            if name not in schema.names:
                return f"features declares {name}, which no data file holds"
            why = feature_type_problem(name, feat, schema.field(name).type)
            if why:
                return why
        missing = [n for n in DEFAULT_FEATURES if n in schema.names and n not in feats]
        if missing:
            return f"features does not declare {missing[0]}"
    return ""


def _hf_features(schema: pa.Schema) -> dict:
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        hf = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        hf = {}
    return hf if isinstance(hf, dict) else {}


def _arrow_dtype(t: pa.DataType) -> str | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return ARROW_DTYPES.get(str(t), str(t))
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return None


def _declared(name: str, t: pa.DataType, hf: object) -> dict | None:
    """``{dtype, shape}`` of one data column as LeRobot declares it: from its datasets feature
    (``Value``, ``Sequence``/``List`` of a fixed length, ``Image``, ``ArrayND``), else its Arrow
    type; None when neither tells."""
    if name in LANGUAGE_COLUMNS:
        return {"dtype": "language", "shape": [1]}
    kind = hf.get("_type") if isinstance(hf, dict) else None
    if kind == "Image" or (
        kind is None and pa.types.is_struct(t) and t.get_field_index("bytes") >= 0
    ):
        return {"dtype": "image"}
    if kind == "Value" and isinstance(hf.get("dtype"), str):
        return {"dtype": hf["dtype"], "shape": [1]}
    if kind in ("Sequence", "List") and isinstance(hf.get("length"), int) and hf["length"] > 0:
        inner = hf.get("feature")
        if isinstance(inner, dict) and inner.get("_type") == "Value":
            return {"dtype": inner.get("dtype"), "shape": [hf["length"]]}
    if kind in ("Array2D", "Array3D", "Array4D", "Array5D") and isinstance(hf.get("shape"), list):
        return {"dtype": hf.get("dtype"), "shape": [int(x) for x in hf["shape"]]}
    if kind is not None:
        return None
    if _arrow_dtype(t):
        return {"dtype": _arrow_dtype(t), "shape": [1]}
    if pa.types.is_fixed_size_list(t) and _arrow_dtype(t.value_type):
        return {"dtype": _arrow_dtype(t.value_type), "shape": [t.list_size]}
    return None


def _image_shape(root: Path, rel: str, name: str) -> list[int]:
    """(height, width, channels) of the first image of column ``name`` in data file ``rel``."""
    import io

    import pyarrow.parquet as pq

    from episodekit.metadata.image_stats import _require_pil

    image = _require_pil()
    pf = pq.ParquetFile(root / rel)
    for g in range(pf.num_row_groups):
        col = pf.read_row_group(g, columns=[name]).column(name).combine_chunks()
        values = col.field("bytes") if pa.types.is_struct(col.type) else col
        for b in values.to_pylist():
            if b:
                with image.open(io.BytesIO(b)) as im:
                    w, h = im.size
                    return [h, w, len(im.getbands())]
    raise InfoRefused(f"features is damaged and image feature {name} has no image", rel)


def _channels(pix_fmt: str | None) -> int:
    """LeRobot's ``get_pix_fmt_channels``."""
    fmt = pix_fmt or ""
    if fmt.startswith("gray"):
        return 1
    if fmt.startswith(("yuva", "rgba", "bgra", "argb", "abgr", "ya")):
        return 4
    return 3


def _video_feature(root: Path, key: str, fps: object) -> dict:
    """A camera declared the way LeRobot 0.6.1 declares it: shape (height, width, channels), its
    ``info`` from the first mp4 (``update_video_info`` without the encoder settings, which the
    file does not record)."""
    from episodekit.core.video import VideoError, canonical_codec, probe

    files = sorted(
        (p for p in (root / "videos" / key).glob("*/*.mp4") if _chunk_file(p.as_posix())),
        key=lambda p: _chunk_file(p.as_posix()),
    )
    for path in files:
        try:
            v = probe(path)
        except (VideoError, OSError):
            continue
        channels = _channels(v.pix_fmt)
        rate = fps if positive(fps) else v.fps
        return {
            "dtype": "video",
            "shape": [v.height, v.width, channels],
            "names": ["height", "width", "channels"],
            "info": {
                "video.height": v.height,
                "video.width": v.width,
                "video.codec": canonical_codec(v.codec),
                "video.pix_fmt": v.pix_fmt,
                "video.fps": int(round(float(rate))),
                "video.channels": channels,
                "has_audio": bool(v.has_audio),
                "is_depth_map": False,
            },
        }
    raise InfoRefused(
        f"features does not declare the camera {key} and none of its mp4s can be read",
        str(root / INFO),
    )


def rebuilt_features(
    root: Path, old: object, schema: pa.Schema, data_rel: str, video_keys: list[str], fps: object
) -> dict:
    """The features LeRobot declares for these data columns and cameras (module docstring):
    the user's data features, the cameras, then LeRobot's default features, each column in the
    data's order; a sound old entry's ``names`` (and a camera's ``info``) kept."""
    old = old if isinstance(old, dict) else {}
    hf = _hf_features(schema)
    data: dict[str, dict] = {}
    for f in schema:
        if f.name.startswith("__index_level"):
            continue
        got = _declared(f.name, f.type, hf.get(f.name))
        if got is None:
            raise InfoRefused(
                f"features is damaged and column {f.name} ({f.type}) does not say its dtype "
                "and shape: put the features back into meta/info.json",
                str(root / INFO),
            )
        if got["dtype"] == "image":
            got["shape"] = _image_shape(root, data_rel, f.name)
        prev = old.get(f.name)
        same = isinstance(prev, dict) and not feature_problem(f.name, prev)
        same = same and prev.get("dtype") == got["dtype"] and prev.get("shape") == got["shape"]
        if same:
            names = prev["names"]
        elif got["dtype"] == "image":
            names = ["height", "width", "channels"]
        else:
            names = None
        data[f.name] = {"dtype": got["dtype"], "shape": got["shape"], "names": names}
    cameras = {}
    for key in video_keys:
        prev = old.get(key)
        ok = isinstance(prev, dict) and not feature_problem(key, prev)
        ok = ok and prev.get("dtype") == "video"
        cameras[key] = prev if ok else _video_feature(root, key, fps)
    user = {k: v for k, v in data.items() if k not in DEFAULT_FEATURES}
    defaults = {k: v for k, v in data.items() if k in DEFAULT_FEATURES}
    return {**user, **cameras, **defaults}


# --------------------------------------------------------------------------------------------
# the other keys


def _chunks_size(value: object, files: list[str], path: str) -> tuple[int, str]:
    """(chunks_size, why it is rebuilt or ""): the value when it is a positive integer every
    file's index is below; else what the layout shows (the last file of chunk 0 of a kind that
    went on to chunk 1), else LeRobot's default."""
    places = [p for p in map(_chunk_file, files) if p]
    if positive_int(value):
        if all(f < value for _, f in places):
            return value, ""
        why = f"chunks_size is {value}, but a file index reaches {max(f for _, f in places)}"
    else:
        why = f"chunks_size is {shown(value)}"
    kinds: dict[str, list[tuple[int, int]]] = {}
    for rel in files:
        p = _chunk_file(rel)
        if p:
            kinds.setdefault(rel.rsplit("/", 2)[0], []).append(p)
    told = {max(f for c, f in ps if c == 0) + 1 for ps in kinds.values() if any(c for c, _ in ps)}
    if len(told) > 1:
        raise InfoRefused(f"{why}, and the files' chunks disagree on it ({sorted(told)})", path)
    size = min(told) if told else DEFAULT_SIZES["chunks_size"]
    if any(f >= size for _, f in places):
        raise InfoRefused(f"{why}, and the files do not tell it", path)
    how = "as the files' chunks show" if told else "LeRobot's default"
    return size, f"{why}: rebuilt as {size} ({how})"


def _template_ok(template: object, rels: list[str], **fields: object) -> bool:
    """``template`` names each of ``rels`` from its chunk and file index."""
    if not isinstance(template, str):
        return False
    for rel in rels:
        p = _chunk_file(rel)
        if p is None:
            return False
        try:
            if format_template(template, chunk_index=p[0], file_index=p[1], **fields) != rel:
                return False
        except UnsafePathError:
            return False
    return True


@dataclass
class _Keys:
    """info.json being checked: ``given`` as read ({} when unreadable), ``info`` what repair
    works from, ``out`` the result; ``layout`` ``given`` parsed tolerantly (a bad key is None
    there) and ``bad`` the keys that parse found at fault."""

    root: Path
    given: dict
    info: dict
    out: CheckedInfo
    layout: Info
    bad: set[str]

    @property
    def path(self) -> str:
        return str(self.root / INFO)

    def rebuilt(self, key: str, value: object, why: str) -> None:
        self.info[key] = value
        if self.out.on_disk is not None:  # (else one damage says every key is rebuilt)
            self.out.damages.append((INFO, why))


def check_info(
    root: Path,
    on_disk: dict | None,
    problem: str,
    data_files: list[str],
    schema: tuple[pa.Schema, str] | None,
    files: list[str],
    episodes_schema: pa.Schema | None = None,
) -> CheckedInfo:
    """info.json checked key by key (module docstring) before repair reads anything with it.

    ``on_disk``: info.json as read (None when it is not a JSON object: ``problem`` says why);
    ``data_files``: the data files (relative); ``schema``: the schema of a data file with a
    footer and that file, when one has; ``files``: every data, episodes and video file
    (relative), for the chunk layout; ``episodes_schema``: that of a ``meta/episodes`` file
    with a footer, when one has (its ``videos/K/...`` columns say which cameras the episodes
    have: a folder of ``videos/`` they do not name is not one of them). fps is checked here
    but derived later (the timestamps are read with the data): :attr:`CheckedInfo.fps_problem`.
    Raises :class:`InfoRefused` (one line naming the key) when a damaged key cannot be rebuilt,
    ``ValueError`` for another version."""
    given = on_disk if on_disk is not None else {}
    layout, found = Info.parse_tolerant(given)
    assert layout is not None  # (given is an object)
    bad = {f.key for f in found}
    k = _Keys(root, given, dict(given), CheckedInfo(info={}, on_disk=on_disk), layout, bad)
    if on_disk is None:
        if not _v3_layout(root):
            raise InfoRefused(
                f"is {problem}, and the root does not have LeRobot's v3.0 layout", k.path
            )
        k.out.damages.append((INFO, f"{problem}: every key rebuilt from the data"))
    _check_version(k)
    if k.layout.fps is None:  # missing, or not a positive finite number
        k.out.fps_problem = f"fps is {shown(given.get('fps'))}"
        k.info["fps"] = None  # derived with the data: derive_fps
    cams = sorted(
        p.name for p in (root / "videos").glob("*") if p.is_dir() and any(p.glob("*/*.mp4"))
    )
    if episodes_schema is not None:
        cams = [c for c in cams if f"videos/{c}/chunk_index" in episodes_schema.names]
    _check_features(k, schema, cams, problem)
    size, why = _chunks_size(given.get("chunks_size"), files, k.path)
    if why:
        k.rebuilt("chunks_size", size, why)
    for key in ("data_files_size_in_mb", "video_files_size_in_mb"):
        value = given.get(key)
        if getattr(k.layout, key) is None:  # missing, or not a positive finite number
            default = DEFAULT_SIZES[key]
            k.rebuilt(key, default, f"{key} is {shown(value)}: rebuilt as {default} (LeRobot's "
                      "default)")  # fmt: skip
    _check_paths(k, data_files, [r for r in files if r.startswith("videos/")], cams)
    value = given.get("robot_type")
    if "robot_type" in k.bad:  # neither a string nor null
        k.rebuilt("robot_type", None, f"robot_type is {shown(value)}: rebuilt as null")
    k.info.setdefault("robot_type", None)
    for key in [x for x in k.info if x not in ORDER and not finite(k.info[x])]:
        del k.info[key]
        k.out.damages.append((INFO, f"{key} holds a number that is not finite: dropped"))
    for key in ("total_episodes", "total_frames", "total_tasks", "splits"):
        k.info.setdefault(key, None)  # the plan's values (repair_plan compares, the build writes)
    k.out.info = _ordered(k.info, given)
    return k.out


def _check_version(k: _Keys) -> None:
    version = k.given.get("codebase_version")
    if isinstance(version, str) and version != V3:
        raise ValueError(
            f"{k.root}: codebase_version {version!r}: repair reads LeRobot v3.0 roots (what "
            "LeRobot's recorder writes); convert a v2.x root first"
        )
    if version != V3:
        if not _v3_layout(k.root):
            raise InfoRefused(f"codebase_version is {shown(version)}, and the root does not "
                              "have LeRobot's v3.0 layout", k.path)  # fmt: skip
        k.rebuilt("codebase_version", V3, f"codebase_version is {shown(version)}: rebuilt as "
                  "v3.0 (the files' layout)")  # fmt: skip


def _check_features(
    k: _Keys, schema: tuple[pa.Schema, str] | None, cams: list[str], problem: str
) -> None:
    feats = k.given.get("features")
    why = features_problem(feats, schema[0] if schema else None, cams)
    if not why:
        return
    if schema is None:
        said = why if k.out.on_disk is not None else f"is {problem}"
        raise InfoRefused(
            f"{said}, and no data file has a footer to read the columns from: put the "
            "features back into meta/info.json",
            k.path,
        )
    fps = k.given.get("fps")
    rebuilt = rebuilt_features(k.root, feats, *schema, cams, fps)
    from_what = "the data files' schema" + (" and the mp4s" if cams else "")
    k.rebuilt("features", rebuilt, f"{why}: rebuilt from {from_what}")


def _check_paths(k: _Keys, data_files: list[str], videos: list[str], cams: list[str]) -> None:
    """data_path and video_path name the files on disk; else LeRobot v3.0's templates."""
    value = k.given.get("data_path")
    if not _template_ok(value, data_files):
        if not _template_ok(DATA_PATH_V3, data_files):
            raise InfoRefused(
                f"data_path is {shown(value)}, and the data files are not named as LeRobot "
                "v3.0 names them",
                k.path,
            )
        k.rebuilt("data_path", DATA_PATH_V3, f"data_path is {shown(value)}: rebuilt as "
                  "LeRobot v3.0's")  # fmt: skip
    value = k.given.get("video_path")
    has_videos = any(
        isinstance(f, dict) and f.get("dtype") == "video" for f in k.info["features"].values()
    )
    if has_videos:
        named = all(
            _template_ok(value, [r for r in videos if r.split("/")[1] == c], video_key=c)
            for c in cams
        )
        if not named:
            k.rebuilt("video_path", VIDEO_PATH_V3, f"video_path is {shown(value)}: rebuilt as "
                      "LeRobot v3.0's")  # fmt: skip
    elif value is not None and not isinstance(value, str):
        k.rebuilt("video_path", None, f"video_path is {shown(value)}: rebuilt as null (no "
                  "cameras)")  # fmt: skip
    elif "video_path" not in k.given:
        k.info["video_path"] = None


def _ordered(info: dict, given: dict) -> dict:
    """``info`` with the keys of ``given`` in their order (an undamaged info.json stays byte for
    byte as it was), each key it lacks placed after the key LeRobot writes before it."""
    keys = [k for k in given if k in info]
    for k in ORDER:
        if k in info and k not in keys:
            before = ORDER[: ORDER.index(k)]
            at = max((i + 1 for i, x in enumerate(keys) if x in before), default=0)
            keys.insert(at, k)
    keys += [k for k in info if k not in keys]
    return {k: info[k] for k in keys}


def derive_fps(timestamps: np.ndarray, frame_index: np.ndarray, problem: str, root: Path) -> int:
    """The fps LeRobot recorded at: the integer ``F`` for which ``frame_index / F``, stored as
    the timestamps' dtype, is every stored timestamp bit for bit (what the recorder writes);
    :class:`InfoRefused` when no integer does or no frame past the first tells it."""
    ts = np.asarray(timestamps)
    fi = np.asarray(frame_index, dtype=np.int64)
    moving = (fi > 0) & (ts > 0)
    path = str(root / INFO)
    if not moving.any():
        raise InfoRefused(f"{problem}, and no timestamp past a first frame tells it", path)
    guess = round(float(np.median(fi[moving] / ts[moving].astype(np.float64))))
    if guess >= 1 and np.array_equal((fi / guess).astype(ts.dtype), ts):
        return guess
    raise InfoRefused(
        f"{problem}, and the timestamps are not frame_index / fps for one fps: write the "
        "recording's fps into meta/info.json",
        path,
    )
