"""The import's dataset quantiles, exact, at memory flat in the frames: the features' range is
known from the episodes' own min and max (stats.json's, exact), so one pass over the written
data files counts every value in range bins (:class:`~episodekit.metadata.stats.range_counts.
RangeCounts`, a few KiB a feature) and a second selects each order statistic
(:func:`~episodekit.metadata.stats.range_counts.exact_from_counts`): numpy's linear rule over
all the values, bit for bit, as the stats pass's exact mode gives. A feature holding NaN goes
through the stats pass (``compute_stats``), as before; one whose every dimension holds one value
(``task_index`` of a single task) needs no pass: each quantile is that value. (A dimension
holding one value inside a feature that varies elsewhere is still selected: its bracket holds
all its values, five times; memory grows with the frames then.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from episodekit.metadata.stats import QUANTILE_KEYS, compute_stats
from episodekit.metadata.stats.range_counts import RangeCounts, counted, exact_from_counts
from episodekit.metadata.stats.scan import file_batches

BATCH_ROWS = 16_384


def set_exact_quantiles(
    folder: Path, rels: list[str], stats: dict[str, dict[str, list]], feats: dict[str, int]
) -> None:
    """Put the exact dataset quantiles of ``feats`` (name -> dims) over the data files ``rels``
    into ``stats`` (stats.json's dict: their ``min``/``max`` give the range), in place."""
    feats = {
        n: d for n, d in feats.items() if any(k in (stats.get(n) or {}) for k in QUANTILE_KEYS)
    }
    if not feats:
        return
    quantiles: dict[str, np.ndarray] = {}
    counts = {}
    for n in feats:
        lo = np.asarray(stats[n]["min"], np.float64).reshape(-1)
        hi = np.asarray(stats[n]["max"], np.float64).reshape(-1)
        if np.array_equal(lo, hi):  # one value (a single task): every quantile is it, no pass
            quantiles[n] = np.tile(lo, (len(QUANTILE_KEYS), 1))
        else:
            counts[n] = RangeCounts.over(lo, hi)
    for rel in rels if counts else []:
        for _ in counted(file_batches(str(folder), rel, list(feats), BATCH_ROWS, True), counts):
            pass
    quantiles.update(exact_from_counts(str(folder), rels, counts, BATCH_ROWS))
    rest = [n for n in feats if n not in quantiles]  # NaN values: the stats pass decides
    if rest:
        res = compute_stats(str(folder), features=rest)
        quantiles.update({n: res.dataset[n].quantiles for n in rest})
    for n, q in quantiles.items():
        for i, key in enumerate(QUANTILE_KEYS):
            if key in stats[n]:
                stats[n][key] = q[i].tolist()
