"""Stats a converted dataset lacks, computed on the staged output before it is verified.

v2.1's ``episodes_stats.jsonl`` has min/max/mean/std/count but no quantiles (LeRobot added
q01..q99 with v3.0, and QUANTILES normalization needs them); v2.0 has no per-episode stats at
all; some v2.1 datasets carry empty ones. A v3.0 dataset without them fails ``stats.present``.
So when any ``stats/<feature>/<key>`` column is missing or null, the whole set is computed from
the written rows (``episodekit metadata stats``'s pass: exact quantiles, image/video features
from sampled frames, LeRobot's aggregation for the dataset), instead of half carried over and
half computed. Complete source stats are kept as carried over.
"""

from __future__ import annotations

from pathlib import Path

from episodekit.core.dataset import episodes_files, open_dataset, read_parquet
from episodekit.metadata.image_stats import image_features
from episodekit.metadata.stats import STAT_KEYS, compute_stats, numeric_features, write_stats


def missing_stats(root: str) -> str | None:
    """Why the per-episode stats of the v3.0 ``root`` are incomplete, or None when they are not."""
    ds = open_dataset(root)
    feats = [*numeric_features(ds.info), *image_features(ds.info)]
    wanted = [f"stats/{n}/{k}" for n in feats for k in STAT_KEYS]
    for f in episodes_files(ds.fs, ds.path):
        t = read_parquet(ds.fs, f)
        absent = [c for c in wanted if c not in t.column_names]
        if len(absent) == len(wanted):
            return "the source has no per-episode stats"
        quantiles = [c for c in absent if c.rsplit("/", 1)[-1].startswith("q")]
        if absent and len(quantiles) == len(absent):
            return "the source's stats have no quantiles"
        if absent:
            return f"the source's stats lack {absent[0]}"
        nulls = [c for c in wanted if t[c].null_count]
        if nulls:
            return f"the source's stats have gaps ({nulls[0]})"
    return None


def fill_missing_stats(staging: Path) -> str:
    """Compute and write every stat of the staged v3.0 dataset when its carried-over stats are
    incomplete; returns what happened, for the summary (``carried over`` or ``computed (why)``)."""
    why = missing_stats(str(staging))
    if why is None:
        return "carried over"
    ds = open_dataset(str(staging))
    res = compute_stats(ds, images=bool(image_features(ds.info)))
    write_stats(res, ds)
    return f"computed ({why})"
