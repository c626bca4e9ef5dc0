"""Normalization stats computed the way LeRobot 0.4.4 computes them (``compute_stats.py``), so a
sample can carry what real datasets carry and ``validate --deep`` can check stats LeRobot wrote.

Per episode (``RunningQuantileStats`` fed the whole episode at once): min, max, mean and
``std = sqrt(max(0, E[x^2] - E[x]^2))`` in the values' dtype (float32 stays float32), count; each
quantile from a 5000-bin histogram per dimension with edges ``min - 1e-10 .. max + 1e-10``,
linearly interpolated inside the bin holding ``q * count`` (so it is known to one bin width and may
sit the padding outside [min, max]). An episode of one frame gets its mean as every quantile.
The dataset's stats (``aggregate_feature_stats``): min of mins, max of maxes, count-weighted mean,
the parallel-variance std, and each quantile the count-weighted mean of the episodes' (not a
quantile of the whole data; LeRobot >= 0.5 keeps an envelope instead: min for q <= 50, max above).
"""

from __future__ import annotations

import numpy as np

LEROBOT_QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
LEROBOT_QUANTILE_KEYS = ("q01", "q10", "q50", "q90", "q99")
NUM_BINS = 5000
PAD = 1e-10


def _histogram_quantiles(col: np.ndarray, lo, hi) -> np.ndarray:
    """LeRobot's ``_compute_single_quantile`` for every quantile of one dimension."""
    edges = np.linspace(lo - PAD, hi + PAD, NUM_BINS + 1)
    hist, _ = np.histogram(col, bins=edges)
    cumsum = np.cumsum(hist)
    out = np.empty(len(LEROBOT_QUANTILES))
    for i, q in enumerate(LEROBOT_QUANTILES):
        target = q * len(col)
        idx = int(np.searchsorted(cumsum, target))
        if idx == 0:
            out[i] = edges[0]
        elif idx >= len(cumsum):
            out[i] = edges[-1]
        else:
            before = cumsum[idx - 1]
            in_bin = cumsum[idx] - before
            if in_bin == 0:
                out[i] = edges[idx]
            else:
                out[i] = edges[idx] + (target - before) / in_bin * (edges[idx + 1] - edges[idx])
    return out


def _sorted_quantiles(ordered: np.ndarray, lo, hi) -> np.ndarray:
    """:func:`_histogram_quantiles` of one dimension's sorted finite values, without building
    the histogram: the bin holding ``q * n`` is the one holding the ``k``-th smallest value
    (``k = ceil(q * n)``: a count reaches ``q * n`` when it reaches ``k``), and the counts
    before and inside it are the values below its edges (``np.histogram``'s comparisons: left
    edges exclusive, the last edge inclusive). The same bits (tests compare the two)."""
    n = len(ordered)
    edges = np.linspace(lo - PAD, hi + PAD, NUM_BINS + 1)
    out = np.empty(len(LEROBOT_QUANTILES))
    for i, q in enumerate(LEROBOT_QUANTILES):
        target = q * n
        k = min(max(int(np.ceil(target)), 1), n)
        idx = min(int(edges.searchsorted(ordered[k - 1], "right")) - 1, NUM_BINS - 1)
        if idx == 0:
            out[i] = edges[0]
            continue
        before = int(ordered.searchsorted(edges[idx], "left"))
        if idx < NUM_BINS - 1:
            upto = int(ordered.searchsorted(edges[idx + 1], "left"))
        else:
            upto = int(ordered.searchsorted(edges[-1], "right"))
        before, in_bin = np.int64(before), np.int64(upto - before)
        if in_bin == 0:
            out[i] = edges[idx]
        else:
            out[i] = edges[idx] + (target - before) / in_bin * (edges[idx + 1] - edges[idx])
    return out


COLUMNS_AT_ONCE = 3  # from this many columns _sorted_quantiles_columns takes fewer calls


def edge_rows(start: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """``np.linspace(start[j], stop[j], NUM_BINS + 1)`` for every ``j`` as the rows of one
    ``(D, NUM_BINS + 1)`` array, each row the bits of its own call: linspace's arithmetic (the
    step ``(stop - start) / NUM_BINS``, ``i * step + start``, the last edge ``stop``) laid out
    so that its loops run along the bins; a row whose step is 0 (linspace takes another path
    there) through linspace itself."""
    step = (stop - start) / NUM_BINS
    rows = np.arange(NUM_BINS + 1, dtype=step.dtype)[None, :] * step[:, None]
    rows += start[:, None]
    rows[:, -1] = stop
    for j in np.flatnonzero(step == 0):
        rows[j] = np.linspace(start[j], stop[j], NUM_BINS + 1)
    return rows


def _sorted_quantiles_columns(ordered: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """:func:`_sorted_quantiles` of every column of ``ordered`` ``(n, D)`` (each column sorted,
    finite) as ``(5, D)``, the same bits, with a few numpy calls per column instead of a few
    per column and quantile: the edges of every column at once (:func:`edge_rows`), one
    ``searchsorted`` per column for the bins and for the counts of each quantile, the
    arithmetic on ``(5, D)`` arrays."""
    n, d = ordered.shape
    edges = edge_rows(lo - PAD, hi + PAD)  # (D, bins + 1)
    target = np.array([q * n for q in LEROBOT_QUANTILES])[:, None]  # (5, 1)
    k = np.array([min(max(int(np.ceil(q * n)), 1), n) for q in LEROBOT_QUANTILES])
    kth = ordered[k - 1].T  # (D, 5)
    idx = np.stack([edges[j].searchsorted(kth[j], "right") for j in range(d)]) - 1
    idx = np.minimum(idx, NUM_BINS - 1)  # (D, 5)
    row = np.arange(d)[:, None]
    e0, e1 = edges[row, idx], edges[row, idx + 1]
    cols = ordered.T
    before = np.stack([cols[j].searchsorted(e0[j], "left") for j in range(d)])
    upto = np.stack(
        [cols[j].searchsorted(e1[j], "left") for j in range(d)]
    )  # idx < bins - 1: the values under the bin's right edge; else the last edge's inclusive
    last = idx == NUM_BINS - 1
    if last.any():
        inclusive = np.stack([cols[j].searchsorted(e1[j], "right") for j in range(d)])
        upto = np.where(last, inclusive, upto)
    before, upto = before.T.astype(np.int64), upto.T.astype(np.int64)  # (5, D)
    idx, e0, e1 = idx.T, e0.T, e1.T
    in_bin = upto - before
    on_edge = (idx == 0) | (in_bin == 0)
    fraction = (target - before) / np.where(on_edge, 1, in_bin)
    first = edges[:, 0][None, :]
    out = np.where(on_edge, np.where(idx == 0, first, e0), e0 + fraction * (e1 - e0))
    return out.astype(np.float64, copy=False)


def episode_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's stats of one episode's ``(frames, D)`` values: ``{key: (D,) array}``, count
    ``(1,)``."""
    x = values.reshape(len(values), -1)
    n = len(x)
    stats = {"min": np.min(x, axis=0), "max": np.max(x, axis=0), "mean": np.mean(x, axis=0)}
    if n < 2:
        stats["std"] = np.std(x, axis=0)
        for k in LEROBOT_QUANTILE_KEYS:
            stats[k] = stats["mean"].copy()
    else:
        var = np.mean(x**2, axis=0) - stats["mean"] ** 2
        stats["std"] = np.sqrt(np.maximum(0, var))
        lo, hi = stats["min"], stats["max"]
        if np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)):  # (else np.histogram's checks)
            ordered = np.sort(x, axis=0)
            if x.shape[1] >= COLUMNS_AT_ONCE:
                qs = _sorted_quantiles_columns(ordered, lo, hi)
            else:  # one or two columns: fewer calls one at a time
                qs = [_sorted_quantiles(ordered[:, j], lo[j], hi[j]) for j in range(x.shape[1])]
                qs = np.stack(qs, axis=1)
        else:
            qs = [_histogram_quantiles(x[:, j], lo[j], hi[j]) for j in range(x.shape[1])]
            qs = np.stack(qs, axis=1)
        for i, k in enumerate(LEROBOT_QUANTILE_KEYS):
            stats[k] = qs[i]
    stats["count"] = np.array([n])
    return {k: np.asarray(v, dtype=np.float64) if k != "count" else v for k, v in stats.items()}


def aggregate(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """LeRobot 0.4.4's ``aggregate_feature_stats`` over the episodes' stats of one feature."""
    keys = ("min", "max", "mean", "std", "count", *LEROBOT_QUANTILE_KEYS)
    present = [k for k in keys if all(k in s for s in per_episode)]  # v2.1: no quantiles
    return aggregate_stacked({k: np.stack([s[k] for s in per_episode]) for k in present})


def aggregate_stacked(stacked: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`aggregate` over stats already stacked per key (``(E, ...)`` arrays; count
    ``(E, 1)``): one numpy pass per key, for many episodes."""
    means = np.asarray(stacked["mean"], dtype=np.float64)
    variances = np.asarray(stacked["std"], dtype=np.float64) ** 2
    counts = np.asarray(stacked["count"]).astype(np.float64)  # (E, 1)
    count = counts.sum(axis=0)
    while counts.ndim < means.ndim:  # image stats (E, 3, 1, 1): LeRobot expands the counts
        counts = counts[..., None]
    total = counts.sum(axis=0)
    mean = (means * counts).sum(axis=0) / total
    var = ((variances + (means - mean) ** 2) * counts).sum(axis=0) / total
    out = {
        "min": np.min(stacked["min"], axis=0),
        "max": np.max(stacked["max"], axis=0),
        "mean": mean,
        "std": np.sqrt(var),
        "count": count.astype(np.int64),
    }
    for k in LEROBOT_QUANTILE_KEYS:  # v2.1 stats (converted datasets) have none
        if k in stacked:
            out[k] = (np.asarray(stacked[k], dtype=np.float64) * counts).sum(axis=0) / total
    return out


def envelope(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """LeRobot >= 0.5's dataset quantiles: min of the episodes' for q <= 50, max above."""
    out = {}
    for k in LEROBOT_QUANTILE_KEYS:
        v = np.stack([s[k] for s in per_episode])
        out[k] = v.min(axis=0) if int(k[1:]) <= 50 else v.max(axis=0)
    return out


__all__ = ["LEROBOT_QUANTILE_KEYS", "aggregate", "aggregate_stacked", "envelope", "episode_stats"]
