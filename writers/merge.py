"""``episodekit merge``: several datasets with the same features into one new dataset (episodes
renumbered in the order of the roots, tasks unified by their string, videos concatenated
without re-encoding when their streams match). Stats are carried over; where the sources'
per-episode stats do not cover every episode alike (v2.1 roots have no quantiles, v2.0 none at
all), the output's are computed from its rows (:mod:`~episodekit.writers.stats_fill`)."""

from __future__ import annotations

import os

from episodekit.core.dataset import open_dataset
from episodekit.core.paths import DEFAULT_TARGET_MB
from episodekit.writers.sources import source_episodes
from episodekit.writers.writer import WriteOptions, WriteResult, write_dataset


def merge(
    roots: list[str],
    out: str | os.PathLike,
    target_mb: float = DEFAULT_TARGET_MB,
    executor: str = "local",
) -> WriteResult:
    """Write the episodes of every root, in order, as one dataset at ``out``."""
    if len(roots) < 2:
        raise ValueError("merge needs at least two roots")
    datasets = [open_dataset(r) for r in roots]
    keys = datasets[0].video_keys
    if keys:
        from episodekit.writers.video import check_joinable

        check_joinable(datasets, keys)  # before anything is written: a clear refusal
    sources = [s for ds in datasets for s in source_episodes(ds)]
    # a v2.x root's episodes carry no quantiles (v2.0: no stats): merged with v3.0 roots the
    # output's stats would have gaps, so then they are computed from the written rows
    options = WriteOptions(
        what="episodekit merge", target_mb=target_mb, executor=executor, fill_stats="missing"
    )
    return write_dataset(sources, out, options)
