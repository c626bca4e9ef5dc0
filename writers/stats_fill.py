"""Stats a converted dataset lacks, computed on the staged output before it is verified.

v2.0 has no per-episode stats at all, and some v2.1 datasets carry empty ones: a v3.0 dataset
without them fails ``stats.present``, so then the whole set is computed from the written rows
(``episodekit metadata stats``'s pass: exact quantiles, image/video features from sampled
frames, LeRobot's aggregation for the dataset). v2.1's usual ``episodes_stats.jsonl`` has
min/max/mean/std/count but no quantiles (LeRobot added q01..q99 with v3.0; only QUANTILES
normalization needs them): those are carried over as LeRobot's converter does (``validate``
warns), unless ``complete`` asks for the full set (``convert --stats complete``), which reads
the data once more (and decodes sampled frames of every camera).
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
            return NO_QUANTILES
        if absent:
            return f"the source's stats lack {absent[0]}"
        nulls = [c for c in wanted if t[c].null_count]
        if nulls:
            return f"the source's stats have gaps ({nulls[0]})"
    return None


NO_QUANTILES = "the source's stats have no quantiles"


def fill_missing_stats(staging: Path, complete: bool = False) -> str:
    """Compute and write every stat of the staged v3.0 dataset when its carried-over stats are
    incomplete (with ``complete=False``, stats lacking only the quantiles are kept); returns what
    happened, for the summary (``carried over ...`` or ``computed (why)``)."""
    why = missing_stats(str(staging))
    if why is None:
        return "carried over"
    if why == NO_QUANTILES and not complete:
        return "carried over (no quantiles, as in v2.1: --stats complete computes them)"
    ds = open_dataset(str(staging))
    res = compute_stats(ds, images=bool(image_features(ds.info)))
    write_stats(res, ds)
    return f"computed ({why})"
