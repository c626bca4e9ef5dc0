"""How far stored quantiles are from the data, in rank: what ``validate --deep`` and ``prepare``
report on stats they did not write.

A stored value ``v`` for quantile ``q`` of ``N`` values has rank error
``max(0, #{x < v} - 1 - h, h - #{x <= v}) / N`` with ``h = (N - 1) q`` (numpy's linear rule's
virtual index): 0 for the exact ``np.quantile`` value (it lies between the order statistics
``floor(h)`` and ``ceil(h)``), and for LeRobot's count-weighted mean of per-episode quantiles up to
0.15 (its ``q99`` is the data's ~85th percentile). One streaming pass of comparisons over the
feature columns, a data file at a time; NaN values are left out of ``N``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodekit.core.dataset import Dataset, read_parquet
from episodekit.metadata.stats.blocks import feature_values
from episodekit.metadata.stats.keys import QUANTILE_KEYS, QUANTILES


def rank_errors(
    below: np.ndarray, at_most: np.ndarray, n: np.ndarray, qs: np.ndarray
) -> np.ndarray:
    """Rank errors (fraction of ``n``) from the counts ``#{x < v}`` (``below``) and ``#{x <= v}``
    (``at_most``), shaped (quantiles, D); ``qs`` (quantiles,)."""
    h = (n[None, :] - 1) * qs[:, None]
    err = np.maximum(np.maximum(below - 1 - h, h - at_most), 0.0)
    return err / np.maximum(n[None, :], 1)


@dataclass
class Worst:
    """The stored quantile farthest from the data: feature, key, dimension, its rank error and
    the rank (fraction) the value really has."""

    feature: str
    key: str
    dim: int
    error: float
    rank: float


def stored_rank_errors(
    ds: Dataset, stats: dict[str, dict[str, np.ndarray]], features: dict[str, int]
) -> dict[str, dict[str, np.ndarray]]:
    """``{feature: {quantile key: per-dimension rank error}}`` of the quantile keys ``stats``
    holds (shaped ``[D]``) for ``features``, measured against the data of ``ds``."""
    want = {}
    for n, dims in features.items():
        keys = [
            (i, k)
            for i, k in enumerate(QUANTILE_KEYS)
            if k in (stats.get(n) or {}) and np.size(stats[n][k]) == dims
        ]
        if keys:
            vals = np.stack([np.asarray(stats[n][k], np.float64).reshape(dims) for _, k in keys])
            want[n] = (keys, vals)
    if not want:
        return {}
    below = {n: np.zeros(v.shape) for n, (_, v) in want.items()}
    at_most = {n: np.zeros(v.shape) for n, (_, v) in want.items()}
    count = {n: np.zeros(v.shape[1]) for n, (_, v) in want.items()}
    for i in range(len(ds.data_files)):
        t = read_parquet(ds.fs, ds.data_path(i), columns=list(want))
        for n, (_, vals) in want.items():
            x = feature_values(t[n], features[n], n).astype(np.float64)
            count[n] += (~np.isnan(x)).sum(0)
            for j, v in enumerate(vals):
                below[n][j] += (x < v).sum(0)
                at_most[n][j] += (x <= v).sum(0)
        del t
    out = {}
    for n, (keys, _) in want.items():
        qs = np.array([QUANTILES[i] for i, _ in keys])
        err = rank_errors(below[n], at_most[n], count[n], qs)
        out[n] = {k: err[j] for j, (_, k) in enumerate(keys)}
        out[n]["_rank"] = at_most[n] / np.maximum(count[n][None, :], 1)  # by key position
    return out


def worst(errors: dict[str, dict[str, np.ndarray]]) -> Worst | None:
    """The largest rank error of :func:`stored_rank_errors`' result (None when empty)."""
    best: Worst | None = None
    for n, per in errors.items():
        keys = [k for k in per if k != "_rank"]
        for j, k in enumerate(keys):
            d = int(np.argmax(per[k]))
            e = float(per[k][d])
            if best is None or e > best.error:
                best = Worst(n, k, d, e, float(per["_rank"][j][d]))
    return best


# Bookkeeping columns no policy normalizes: left out of :func:`worst_stored_quantile`.
BOOKKEEPING = ("index", "episode_index", "task_index", "frame_index", "timestamp")


def worst_stored_quantile(root: Dataset | str) -> Worst | None:
    """The stored quantile of stats.json farthest from the data over the features a policy
    normalizes (not :data:`BOOKKEEPING`); None without stats.json or such features."""
    from episodekit.core.dataset import as_dataset
    from episodekit.metadata.stats.fresh import load_lerobot_stats
    from episodekit.metadata.stats.keys import numeric_features

    ds = as_dataset(root)
    stats = load_lerobot_stats(ds)
    if not stats:
        return None
    feats = {n: d for n, d in numeric_features(ds.info).items() if n not in BOOKKEEPING}
    return worst(stored_rank_errors(ds, stats, feats))


KEPT_RANK_NOTE = 0.01  # kept stats whose quantiles are farther in rank get a note (prepare)


def kept_quantiles(root: Dataset | str) -> dict:
    """``{"quantiles": {feature, key, dimension, rank, rank_error}}`` of the worst stored quantile
    when it is more than :data:`KEPT_RANK_NOTE` away in rank, else ``{}`` (prepare's detail)."""
    w = worst_stored_quantile(root)
    if w is None or w.error <= KEPT_RANK_NOTE:
        return {}
    q = {"feature": w.feature, "key": w.key, "dimension": w.dim, "rank": round(w.rank, 4)}
    return {"quantiles": {**q, "rank_error": round(w.error, 4)}}


__all__ = [
    "Worst",
    "kept_quantiles",
    "rank_errors",
    "stored_rank_errors",
    "worst",
    "worst_stored_quantile",
]
