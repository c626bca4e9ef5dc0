"""Normalization statistics: exact per-episode and dataset stats in LeRobot v3.0's layout.

For every numeric feature (per dimension) the LeRobot keys ``min, max, mean, std, count, q01, q10,
q50, q90, q99``: per episode in the ``stats/{feature}/{key}`` columns of ``meta/episodes/*.parquet``
(``list<double>``, count ``list<int64>``) and for the dataset in ``meta/stats.json`` (lists of
floats, count ``[N]``), so LeRobot's ``load_stats`` / episode reader take them unchanged.

How (one streaming pass per data file, files in parallel through the executor):

- data is decoded in blocks of about 64 MiB of feature values (``block_rows``): consecutive
  whole row groups (faster than record batches; prepare's 32 MiB groups are one block each), a
  larger group cut into record batches; an episode that continues into the next block is carried
  over, so every episode is reduced whole;
- per block and feature, one C-order ``(D, rows)`` copy; per episode: mean/M2 by segment
  reductions (``np.add.reduceat``, one dimension at a time), min/max/quantiles exact from a padded
  per-episode sort (episodes grouped by length so padding stays small), numpy's "linear" rule
  (``np.quantile``'s default) reproduced to the bit. One comparison pass finds dimensions
  already ascending inside every episode (index, frame_index, timestamp, constants): their order
  statistics are read in place, unsorted; dimensions ascending over the whole block skip the
  block sort too;
- dataset mean/std: counts-weighted parallel merge of the per-episode (count, mean, M2) (Chan et
  al.), min/max of the episodes' min/max;
- dataset quantiles: every block contributes a mergeable rank summary (``m`` order statistics
  of its sorted columns, each weighted by the ranks it stands for; a summary's rank error is its
  largest weight - 1, and errors of merged summaries add). ``quantiles="exact"``: each scan job
  appends its blocks' sorted columns to one spill file (run-length encoded where values repeat,
  with every 512th value kept in memory as a fence); the merged summary brackets every wanted
  order statistic, and a selection reads only the windows the searches need and the few values
  inside the brackets (``pread``, no memory map), which gives exactly what ``np.quantile`` over
  the whole column gives, as long as the columns fit ``memory_mb``; beyond it, or with
  ``quantiles="sketch"``, the quantiles come from the summary and their rank-error bound is
  recorded. Never from an envelope of per-episode quantiles.

Modules: :mod:`.keys` (file names, keys, defaults, features), pure computations in
:mod:`.sketch` (quantile rule, rank summary, merge) and :mod:`.blocks` (one decoded block), the
scanning in :mod:`.scan` with :mod:`.spill`, :mod:`.select` (exact quantiles), :mod:`.compute`
(the whole dataset), :mod:`.summary`, :mod:`.write` and :mod:`.fresh` (freshness, entry points).

Provenance lives in ``meta/episodekit_stats.parquet`` (never in stats.json, which LeRobot reads as
features): one row per (feature, dimension) with the dataset's compacted rank summary (what a
mixture merges, see :func:`merge_stats`), and JSON key-value metadata: version, fingerprint, the
data files' state (size, parquet footer), mode and rank-error bounds per feature, and what
was written.
Writes are atomic and rank-gated (only the global main process writes); a read-only or remote root
gets the in-memory result and one warning.
"""

from __future__ import annotations

from episodekit.metadata.stats.blocks import feature_values
from episodekit.metadata.stats.compute import (
    StatsOptions,
    StatsResult,
    block_rows,
    column_bytes,
    compute_stats,
    data_state,
    refine_quantiles,
)
from episodekit.metadata.stats.fresh import (
    ensure_stats,
    load_lerobot_stats,
    stale_reason,
    stats_report,
)
from episodekit.metadata.stats.keys import (
    DEFAULT_MEMORY_MB,
    DEFAULT_SKETCH_POINTS,
    NON_NUMERIC_DTYPES,
    ORDERED_KEYS,
    QUANTILE_KEYS,
    QUANTILE_MODES,
    QUANTILES,
    STAT_KEYS,
    STATS_FILE,
    SUMMARY_FILE,
    numeric_features,
    pick_features,
)
from episodekit.metadata.stats.sketch import (
    FeatureStats,
    Sketch,
    lerp_quantile,
    merge_sketches,
    merge_stats,
    order_indices,
)
from episodekit.metadata.stats.summary import read_sketches, read_summary_meta
from episodekit.metadata.stats.write import episode_columns, write_stats

__all__ = [
    "DEFAULT_MEMORY_MB",
    "DEFAULT_SKETCH_POINTS",
    "NON_NUMERIC_DTYPES",
    "ORDERED_KEYS",
    "QUANTILES",
    "QUANTILE_KEYS",
    "QUANTILE_MODES",
    "STATS_FILE",
    "STAT_KEYS",
    "SUMMARY_FILE",
    "FeatureStats",
    "Sketch",
    "StatsOptions",
    "StatsResult",
    "block_rows",
    "column_bytes",
    "compute_stats",
    "data_state",
    "ensure_stats",
    "episode_columns",
    "feature_values",
    "load_lerobot_stats",
    "lerp_quantile",
    "merge_sketches",
    "merge_stats",
    "numeric_features",
    "order_indices",
    "pick_features",
    "read_sketches",
    "read_summary_meta",
    "refine_quantiles",
    "stale_reason",
    "stats_report",
    "write_stats",
]
