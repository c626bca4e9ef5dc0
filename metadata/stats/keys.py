"""The stats' file names, keys and defaults, and which features get stats."""

from __future__ import annotations

import errno
from collections.abc import Sequence

from episodekit.metadata.episode_stats import QUANTILE_KEYS

STATS_FILE = "meta/stats.json"
SUMMARY_FILE = "meta/episodekit_stats.parquet"
SUMMARY_KEY = b"episodekit_stats"
STATS_VERSION = 1
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
STAT_KEYS = ("min", "max", "mean", "std", "count", *QUANTILE_KEYS)
ORDERED_KEYS = ("min", *QUANTILE_KEYS, "max")  # must be ascending
NON_NUMERIC_DTYPES = ("image", "video", "string", "language")
QUANTILE_MODES = ("exact", "sketch")
DEFAULT_SKETCH_POINTS = 1024  # order statistics kept per batch of rows (per dimension)
STORED_SKETCH_POINTS = 2048  # points per dimension kept in the summary file
DEFAULT_MEMORY_MB = 4096.0  # budget for the sorted columns the exact selection holds
BLOCK_BYTES = 64 * 2**20  # decoded feature bytes per block: prepare's 32 MiB row groups fit whole
READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def numeric_features(info: dict, only: list[str] | None = None) -> dict[str, int]:
    """``{name: dims}`` of the features stats are computed for: every non-image/video/string
    feature of one-dimensional shape (``[D]``), in info.json order; ``only`` selects some."""
    feats = info.get("features") or {}
    out: dict[str, int] = {}
    for name, f in feats.items():
        if not isinstance(f, dict) or f.get("dtype") in NON_NUMERIC_DTYPES:
            continue
        shape = f.get("shape") or [1]
        if len(shape) != 1:
            continue  # multi-dimensional tensors: not normalized per dimension by LeRobot either
        out[name] = int(shape[0])
    return pick_features(out, only, "this dataset")


def pick_features(found: dict, only: Sequence[str] | None, of: str) -> dict:
    """``found`` restricted to the ``--features`` names in ``only`` (all when None); a name that
    is not in ``found`` is a ValueError listing the choices (``of``: whose features, for it)."""
    if not only:
        return found
    unknown = [n for n in only if n not in found]
    if unknown:
        raise ValueError(
            f"--features {unknown}: not numeric one-dimensional features of {of} "
            f"(choose from {sorted(found)})"
        )
    return {n: d for n, d in found.items() if n in only}
