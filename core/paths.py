"""Where things live in a root: LeRobot path templates, artifact names, defaults, and the one rule
that keeps every path built from dataset metadata inside the root.

A root's ``info.json`` comes from a hub and is untrusted: its ``data_path``/``video_path`` templates
are formatted here and nowhere else, with integer fields and plain width specs only (no attribute
access, no huge padding), and the result must be a relative path that stays inside the root, also
after resolving symlinks on a local disk.
"""

from __future__ import annotations

import os
import posixpath
import re
import string

from episodekit.core.errors import EnvironmentProblem

MIB = 1024 * 1024
DEFAULT_TARGET_MB = 32.0  # prep's row-group target (uncompressed MiB)
DEFAULT_IDLE_THRESHOLD = 0.01  # edit --trim-idle: a move is > 1% of a dimension's std in one frame
MAX_TARGET_MB = float(1 << 20)  # a size beyond 1 TiB is a typo (and inf overflows int())

DATA_PATH_V3 = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH_V3 = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH_V3 = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DATA_PATH_V2 = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH_V2 = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def check_target_mb(value: float, name: str = "target_mb") -> float:
    """A size target in MiB, checked once where the options are parsed (``0 < MiB <=``
    :data:`MAX_TARGET_MB`; ValueError naming the option ``name``). It stays MiB until the
    writer converts it (:func:`target_bytes`)."""
    if not 0 < value <= MAX_TARGET_MB:
        raise ValueError(f"{name} must be > 0 and <= {MAX_TARGET_MB:g}, got {value}")
    return float(value)


def target_bytes(target_mb: float) -> int:
    """The writer's unit: the bytes of a target in MiB (the one MiB -> bytes conversion)."""
    return int(round(target_mb * MIB))


INFO_FILE = "meta/info.json"
SPEED_FILE = "meta/speed_percentiles.jsonl"
COST_FILE = "meta/episode_costs.parquet"
PLAN_DIR = "meta/shard_plans"
STAMP_FILE = "meta/episodekit_validation.json"
STATS_FILE = "meta/stats.json"  # LeRobot's dataset stats (metadata.stats writes it)
STATS_SUMMARY_FILE = "meta/episodekit_stats.parquet"  # what episodekit's stats were made from
EPISODES_FILES = "meta/episodes/*/*.parquet"  # per-episode stats columns live here (v3.0)

# Choices the library accepts (here, so the CLI can offer them without importing the heavy modules).
COMPRESSIONS = ("keep", "snappy", "zstd", "none")  # prep's output codec
COST_MODELS = {
    "frames": "length (one sample per frame)",
    "compute": "length x action_dim x cameras (each factor at least 1)",
    "bytes": "data_bytes + video_bytes",
    "decode": "measured seconds to decode the episode's video frames (PyAV, sampled per file)",
}
VIDEO_CODECS = ("av1", "h264")  # what the sample writer and `prep videos` encode

INT_FIELDS = ("chunk_index", "file_index", "episode_chunk", "episode_index")
STR_FIELDS = ("video_key",)
_SPEC = re.compile(r"^0?[1-9]?\d?d?$")  # "", "d", "3d", "03d", "06d", "010d": plain widths only
MAX_WIDTH = 20


class UnsafePathError(EnvironmentProblem, ValueError):
    """A path built from dataset metadata would leave the root (or ``--out``), or a template is
    not plain. An environment problem for the commands (exit 2: we refuse to touch that path);
    ``validate`` reports it as an ``info.paths`` finding instead."""


def format_template(template: object, **fields: object) -> str:
    """Format a LeRobot path template safely and return a normalized path relative to the root.

    Only the fields of :data:`INT_FIELDS` (integers, optional plain width spec such as ``03d``)
    and ``video_key`` (a string without a format spec) are allowed. The result must be relative
    and must not climb out of the root (``..``); anything else raises :class:`UnsafePathError`.
    """
    if not isinstance(template, str) or not template:
        raise UnsafePathError(f"path template must be a non-empty string, got {template!r}")
    out = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise UnsafePathError(f"bad path template {template!r} ({exc})") from exc
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is None:
            continue
        if conversion or (name not in INT_FIELDS and name not in STR_FIELDS):
            raise UnsafePathError(f"path template {template!r}: field {{{name}}} is not allowed")
        if name not in fields:
            raise UnsafePathError(f"path template {template!r}: field {{{name}}} has no value")
        value = fields[name]
        if name in STR_FIELDS:
            if spec:
                raise UnsafePathError(f"path template {template!r}: {{{name}}} takes no spec")
            out.append(check_component(str(value)))
            continue
        if not _SPEC.match(spec or "") or int(re.sub(r"\D", "", spec) or 0) > MAX_WIDTH:
            raise UnsafePathError(f"path template {template!r}: spec {spec!r} is not a plain width")
        out.append(format(int(value), spec or "d"))
    return check_relative("".join(out))


def check_component(name: str) -> str:
    """A single path component from metadata (e.g. a video key): no separators, not ``..``."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise UnsafePathError(f"{name!r} is not a safe path component")
    return name


def check_relative(rel: str) -> str:
    """Normalize a relative path and refuse absolute paths and ``..`` that leaves the root."""
    if "\\" in rel or "\0" in rel:
        raise UnsafePathError(f"path {rel!r} has a backslash or NUL")
    if rel.startswith("/") or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", rel):
        raise UnsafePathError(f"path {rel!r} is absolute; it must be relative to the root")
    norm = posixpath.normpath(rel)
    if norm == "." or norm == ".." or norm.startswith("../"):
        raise UnsafePathError(f"path {rel!r} leaves the root")
    return norm


def inside_root(root: str | os.PathLike, rel: str) -> str:
    """Join ``rel`` to a local ``root`` and refuse a result that resolves (symlinks followed)
    outside it. Returns the joined (unresolved) path."""
    rel = check_relative(rel)
    full = os.path.join(os.fspath(root), rel)
    real_root = os.path.realpath(root)
    real = os.path.realpath(full)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafePathError(f"path {rel!r} resolves outside the root (to {real})")
    return full
