"""The dataset quantiles of the writers whose stats policy is ``exact`` (the import, repair:
:mod:`episodekit.writers.sink_meta`), at memory flat in the frames: the features' range is
known from the episodes' own min and max (stats.json's, exact), so one pass over the written
data files counts every value in range bins (:class:`~episodekit.metadata.stats.range_counts.
RangeCounts`, a few KiB a feature; repair's verification has counted them already) and a second
selects each order statistic
(:func:`~episodekit.metadata.stats.range_counts.exact_from_counts`): numpy's linear rule over
all the values, bit for bit, as the stats pass's exact mode gives. A feature holding NaN goes
through the stats pass (``compute_stats``), as before; one whose every dimension holds one
value (``task_index`` of a single task) needs no pass: each quantile is that value. (A
dimension holding one value inside a feature that varies elsewhere is still selected: its
bracket holds all its values, five times; memory grows with the frames then.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from episodekit.metadata.stats import QUANTILE_KEYS, compute_stats
from episodekit.metadata.stats.range_counts import RangeCounts, counted, exact_from_counts
from episodekit.metadata.stats.scan import file_batches

BATCH_ROWS = 16_384


def exact_quantiles(
    folder: Path,
    rels: list[str],
    stats: dict[str, dict[str, list]],
    feats: dict[str, int],
    counts: dict[str, RangeCounts] | None = None,
    windows: dict | None = None,
    batch_rows: int = BATCH_ROWS,
) -> None:
    """Put the exact dataset quantiles of ``feats`` (name -> dims; those ``stats`` holds a
    quantile key of) over the data files ``rels`` into ``stats`` (stats.json's dict: their
    ``min``/``max`` give the range), in place. ``counts``: the features' range counts over
    ``rels`` taken already (repair's verification; a feature it lacks goes to the stats pass),
    else counted here; ``windows``: files read a window of row groups at a time (repair's
    salvaged files, :func:`~episodekit.metadata.stats.range_counts.exact_from_counts`)."""
    feats = {
        n: d for n, d in feats.items() if any(k in (stats.get(n) or {}) for k in QUANTILE_KEYS)
    }
    if not feats:
        return
    quantiles: dict[str, np.ndarray] = {}
    if counts is None:  # one counting pass here
        counts = {}
        for n in feats:
            lo = np.asarray(stats[n]["min"], np.float64).reshape(-1)
            hi = np.asarray(stats[n]["max"], np.float64).reshape(-1)
            if np.array_equal(lo, hi):  # one value (a single task): every quantile is it
                quantiles[n] = np.tile(lo, (len(QUANTILE_KEYS), 1))
            else:
                counts[n] = RangeCounts.over(lo, hi)
        for rel in rels if counts else []:
            for _ in counted(file_batches(str(folder), rel, list(feats), batch_rows, True), counts):
                pass
    else:
        counts = {n: c for n, c in counts.items() if n in feats}
    quantiles.update(exact_from_counts(str(folder), rels, counts, batch_rows, windows=windows))
    rest = [n for n in feats if n not in quantiles]  # NaN values: the stats pass decides
    if rest:
        res = compute_stats(str(folder), features=rest)
        quantiles.update({n: res.dataset[n].quantiles for n in rest})
    for n, q in quantiles.items():
        for i, key in enumerate(QUANTILE_KEYS):
            if key in stats[n]:
                stats[n][key] = q[i].tolist()
