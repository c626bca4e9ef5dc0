"""Declared feature fields (info.json ``features``) against each other, the video streams and the
images: what ``info.features``, ``data.shape`` and the ``video.*`` stream checks leave out.

- ``info.names``: a feature's ``names`` is null, a list of strings, or (older LeRobot) a
  ``{group: [strings]}``; for a vector (shape ``[D]``) one name per dimension, for an image or
  video one per axis (height, width, channels: what tells the shape's order). Repeated names are
  a warning (a name no longer says which dimension it is).
- ``info.video``: a video feature's shape, read through its names, agrees with its
  ``video.height``, ``video.width`` and ``video.channels``.
- ``video.channels``, ``video.audio``, ``video.gop``: every mp4 of a camera against the
  ``video.channels`` (or the shape's channels), ``has_audio`` and ``video.g`` (the keyframe
  interval LeRobot >= 0.6 records) declared for it; run by the ``video.*`` pass on each file it
  probes (:func:`stream_findings`), so no file is opened twice.
- ``data.image_shape`` (``--deep``): the first image of every data file has the declared height,
  width and channels (read from the PNG/JPEG header, nothing decoded).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from episodekit.core import interrupt
from episodekit.core.paths import INFO_FILE
from episodekit.core.video import VideoIndex, require_av
from episodekit.validate.raw import ERROR, WARNING, Finding, RawRoot

# The checks this module reports (described in episodekit.validate.checks).
CHECKS = (
    "info.names",
    "info.video",
    "video.channels",
    "video.audio",
    "video.gop",
    "data.image_shape",
)
AXES = {  # axis names LeRobot versions have used -> the axis
    "height": "height",
    "h": "height",
    "width": "width",
    "w": "width",
    "channels": "channels",
    "channel": "channels",
    "c": "channels",
}
VISUAL = ("image", "video")


def _feature_items(raw: RawRoot) -> list[tuple[str, dict]]:
    return [(k, f) for k, f in raw.features.items() if isinstance(f, dict)]


def _shape(feat: dict) -> list[int] | None:
    shape = feat.get("shape")
    if isinstance(shape, (list, tuple)) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        return list(shape)
    return None


def visual_axes(feat: dict) -> dict[str, int | None]:
    """Height, width and channels of an image/video feature's shape, placed by its axis names
    (``["channels", "height", "width"]`` in older datasets), else in LeRobot's HWC order."""
    shape = _shape(feat) or []
    names = feat.get("names")
    order = ["height", "width", "channels"]
    if isinstance(names, list) and len(names) == len(shape) == 3:
        axes = [AXES.get(str(n).lower()) for n in names]
        if sorted(a for a in axes if a) == sorted(order):
            order = axes
    out: dict[str, int | None] = dict.fromkeys(("height", "width", "channels"))
    if len(shape) == 3:
        out.update(zip(order, shape))
    return out


def _names_problem(name: str, feat: dict) -> tuple[str, str] | None:
    """(severity, message) of a ``names`` that does not describe the shape, else None."""
    names = feat.get("names")
    shape = _shape(feat)
    if names is None or shape is None:
        return None
    if isinstance(names, dict):
        groups = list(names.values())
        if not all(isinstance(g, list) for g in groups):
            return ERROR, f"feature {name}: names must map each group to a list, got {names!r}"
        flat = [n for g in groups for n in g]
        if len(shape) == 1 and shape[0] not in {len(flat), *map(len, groups)}:
            sizes = " + ".join(str(len(g)) for g in groups) or "0"
            return ERROR, f"feature {name}: {sizes} names for shape {shape}"
    elif isinstance(names, list):
        flat = names
        if feat.get("dtype") in VISUAL:
            axes = {AXES.get(str(n).lower()) for n in names}
            if len(names) != len(shape) or axes != {"height", "width", "channels"}:
                return ERROR, (
                    f"feature {name}: names {names} must name the {len(shape)} axes of shape "
                    f"{shape} (height, width, channels)"
                )
        elif len(shape) == 1 and len(names) != shape[0]:
            return ERROR, f"feature {name}: {len(names)} names for shape {shape}"
    else:
        return ERROR, f"feature {name}: names must be null, a list or an object, got {names!r}"
    if not all(isinstance(n, str) for n in flat):
        return ERROR, f"feature {name}: names must be strings, got {flat[:5]!r}"
    repeated = sorted({n for n in flat if flat.count(n) > 1})
    if repeated:
        return WARNING, f"feature {name}: repeated names {repeated[:5]}"
    return None


def _video_field_problems(name: str, feat: dict) -> list[str]:
    """How a video feature's shape disagrees with its ``video.height/width/channels``."""
    info = feat.get("info")
    if not isinstance(info, dict):
        return []
    shape = _shape(feat)
    if shape is None or len(shape) != 3:
        return [f"feature {name}: a video's shape must be [height, width, channels], got {shape}"]
    axes = visual_axes(feat)
    out = []
    for axis in ("height", "width", "channels"):
        declared = info.get(f"video.{axis}")
        if declared is not None and declared != axes[axis]:
            said = f"the shape {shape} says {axes[axis]}"
            out.append(f"feature {name}: video.{axis} is {declared} but {said}")
    return out


def check_declared(raw: RawRoot) -> list[Finding]:
    """``info.names`` and ``info.video``: the declared fields against each other (metadata only)."""
    out = []
    for name, feat in _feature_items(raw):
        problem = _names_problem(name, feat)
        if problem:
            out.append(Finding("info.names", problem[0], problem[1], INFO_FILE))
        if feat.get("dtype") == "video":
            for msg in _video_field_problems(name, feat):
                out.append(Finding("info.video", ERROR, msg, INFO_FILE))
    return out


def pix_fmt_channels(pix_fmt: str | None) -> int | None:
    """Components of a pixel format (yuv420p: 3, gray: 1, yuva420p: 4), LeRobot's
    ``video.channels``; None when unknown."""
    if not pix_fmt:
        return None
    av = require_av()
    try:
        return len(av.VideoFormat(pix_fmt).components)
    except (ValueError, TypeError):
        return None


def stream_findings(index: VideoIndex, feat: dict, rel: str, episode: int) -> list[Finding]:
    """``video.channels``, ``video.audio`` and ``video.gop`` for one probed mp4 of a camera."""
    info = feat.get("info") if isinstance(feat.get("info"), dict) else {}
    out = []
    want = info.get("video.channels", visual_axes(feat)["channels"])
    have = pix_fmt_channels(index.pix_fmt)
    if want is not None and have is not None and want != have:
        msg = f"pix_fmt {index.pix_fmt} has {have} channels but info.json declares {want}"
        out.append(Finding("video.channels", ERROR, msg, rel, episode))
    audio = info.get("has_audio")
    if isinstance(audio, bool) and audio != index.has_audio:
        msg = "an audio stream" if index.has_audio else "no audio stream"
        out.append(Finding("video.audio", WARNING, f"{msg} but has_audio is {audio}", rel, episode))
    g = info.get("video.g")
    if isinstance(g, int) and not isinstance(g, bool) and g >= 1 and index.num_frames:
        keys = np.flatnonzero(index.keyframe)
        gap = int(np.diff(np.append(keys, index.num_frames)).max()) if len(keys) else 0
        if not len(keys) or keys[0] != 0:
            gap = index.num_frames
        if gap > g:
            msg = f"keyframes up to {gap} frames apart but info.json video.g is {g}"
            out.append(Finding("video.gop", WARNING, msg, rel, episode))
    return out


# ---------------------------------------------------------------------------------------------
# Images: the header of the first image of each data file.


def image_size(data: bytes) -> tuple[int, int, int | None] | None:
    """(height, width, channels) from a PNG or JPEG header (channels None when the header does
    not fix them, e.g. a palette PNG); None for other formats or a cut header."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 26 and data[12:16] == b"IHDR":
        width, height = struct.unpack(">II", data[16:24])
        channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(data[25])
        return height, width, channels
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            size = struct.unpack(">H", data[i + 2 : i + 4])[0]
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[i + 5 : i + 9])
                return height, width, data[i + 9] if i + 9 < len(data) else None
            i += 2 + size
    return None


def _first_image(raw: RawRoot, rel: str, column: str) -> bytes | None:
    from episodekit.core.parquet_read import open_data_file

    with open_data_file(raw.join(rel), raw.fs) as df:
        if column not in df.schema.names:
            return None
        for batch in df.batches(64, [column]):
            for value in batch.column(0).to_pylist():
                data = value.get("bytes") if isinstance(value, dict) else value
                if data:
                    return bytes(data)
    return None


def check_images(raw: RawRoot, rels: list[str]) -> list[Finding]:
    """``data.image_shape``: the first image of each data file against the declared shape."""
    feats = [(k, f) for k, f in _feature_items(raw) if f.get("dtype") == "image"]
    out = []
    for rel in rels:
        for name, feat in feats:
            try:
                data = _first_image(raw, rel, name)
            except Exception:  # noqa: BLE001 - an unreadable file is data.read's finding
                interrupt.check()  # Ctrl-C that a library turned into an error: not the file's
                continue
            got = image_size(data) if data else None
            if got is None:
                continue
            want = visual_axes(feat)
            have: dict[str, Any] = dict(zip(("height", "width", "channels"), got))
            if any(have[a] not in (None, want[a]) and want[a] is not None for a in have):
                msg = (
                    f"feature {name}: image of {have['height']}x{have['width']}"
                    f"x{have['channels'] or '?'} (height x width x channels) but the shape "
                    f"{feat.get('shape')} says {want['height']}x{want['width']}x{want['channels']}"
                )
                out.append(Finding("data.image_shape", ERROR, msg, rel))
    return out
