"""Exact dataset quantiles: brackets from the merged rank summary, then a selection over the
spilled runs (:func:`exact_from_runs`) or a second pass over the data (:func:`exact_quantiles`)."""

from __future__ import annotations

import numpy as np

from episodekit.core.executor import imap_files
from episodekit.metadata.stats.keys import (
    QUANTILES,
)
from episodekit.metadata.stats.scan import count_file, refine_file
from episodekit.metadata.stats.sketch import (
    FeatureStats,
    lerp_quantile,
    order_indices,
)
from episodekit.metadata.stats.spill import Run, RunReader


def brackets(fs: FeatureStats) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """Per quantile and dimension, values ``lo < x_(k0) <= x_(k1) <= hi`` from the summary, the
    order statistics k0, k1 and an upper bound on the candidates inside the brackets."""
    dims = len(fs.sketches)
    lo = np.empty((len(QUANTILES), dims))
    hi = np.empty((len(QUANTILES), dims))
    k0s, k1s, _ = order_indices(fs.count, np.asarray(QUANTILES))
    bound = 0.0
    for d, s in enumerate(fs.sketches):
        # est(v) counts every point <= v: a run of equal values gets its last cumsum
        cum = np.cumsum(s.weights)[np.searchsorted(s.values, s.values, side="right") - 1]
        e = s.rank_error
        for i, (k0, k1) in enumerate(zip(k0s.tolist(), k1s.tolist())):
            j_lo = int(np.searchsorted(cum, k0 - e, side="right")) - 1
            j_hi = min(int(np.searchsorted(cum, k1 + 1, side="left")), len(cum) - 1)
            lo[i, d] = s.values[j_lo] if j_lo >= 0 else -np.inf
            hi[i, d] = s.values[j_hi]
            bound += (cum[j_hi - 1] if j_hi > 0 else 0) + e - (cum[j_lo] if j_lo >= 0 else 0)
    return lo, hi, np.array(k0s), np.array(k1s), bound


def select_candidates(
    fs: FeatureStats, brackets: tuple, below: np.ndarray, inside: tuple[np.ndarray, ...]
) -> None:
    """Exact quantiles from the bracket counts and the sorted candidates (in place).
    ``inside``: (quantile, dimension, value) or, run-length encoded, (..., value, count)."""
    lo, hi, k0s, k1s, _ = brackets
    d = len(fs.sketches)
    qi, dim, val = inside[:3]
    cnt = inside[3] if len(inside) > 3 else np.ones(len(val), np.int64)
    order = np.lexsort((val, dim, qi))
    key = qi[order].astype(np.int64) * d + dim[order]
    val, cnt = val[order], cnt[order]
    for i, q in enumerate(QUANTILES):
        _, _, g = order_indices(fs.count, q)
        for j in range(d):
            a, b = np.searchsorted(key, [i * d + j, i * d + j + 1])
            ranks = np.cumsum(cnt[a:b])  # values up to and including each candidate
            picks = []
            for k in (int(k0s[i]), int(k1s[i])):
                r = k - int(below[i, j])
                if r < 0:
                    raise AssertionError("exact quantile bracket missed (bad summary)")
                at = int(np.searchsorted(ranks, r, side="right"))
                picks.append(float(val[a + at]) if at < b - a else float(hi[i, j]))
            fs.quantiles[i, j] = lerp_quantile(
                np.float64(picks[0]), np.float64(picks[1]), np.float64(g)
            )
    fs.quantile_error = 0.0


def exact_from_runs(runs: list[Run], fs: FeatureStats) -> None:
    """Exact quantiles by selection over the spilled sorted runs: per run and bracket, two
    searches (one window read each) and the values inside the bracket."""
    br = brackets(fs)
    lo, hi = br[0], br[1]
    below = np.zeros(lo.shape, np.int64)
    found = []
    reader = RunReader()
    try:
        for run in runs:
            j = run.dim
            kind = np.dtype(run.dtype).kind
            keys_lo = lo[:, j].astype(run.dtype) if kind == "f" else lo[:, j]
            keys_hi = hi[:, j].astype(run.dtype) if kind == "f" else hi[:, j]
            if run.counts_offset >= 0:  # run-length encoded: distinct values and their counts
                values = reader.read(run, 0, run.length)
                counts = reader.read(run, 0, run.length, counts=True)
                a = np.searchsorted(values, keys_lo, side="right")
                b = np.searchsorted(values, keys_hi, side="left")
                below[:, j] += np.concatenate([[0], np.cumsum(counts)])[a]
                for i in np.flatnonzero(b > a):
                    v = np.repeat(values[a[i] : b[i]].astype(np.float64), counts[a[i] : b[i]])
                    found.append((np.full(len(v), i, np.int8), np.full(len(v), j, np.int32), v))
                continue
            a = reader.count(run, keys_lo, "right")
            b = reader.count(run, keys_hi, "left")
            below[:, j] += a
            for i in np.flatnonzero(b > a):
                v = reader.read(run, int(a[i]), int(b[i])).astype(np.float64)
                found.append((np.full(len(v), i, np.int8), np.full(len(v), j, np.int32), v))
    finally:
        reader.close()
    inside = tuple(
        np.concatenate([f[k] for f in found]) if found else np.zeros(0, t)
        for k, t in enumerate((np.int8, np.int32, np.float64))
    )
    select_candidates(fs, br, below, inside)


def exact_quantiles(
    root: str,
    rels: list[str],
    feats: dict[str, int],
    dataset: dict[str, FeatureStats],
    executor: str,
    jobs: int | None,
    batch_rows: int,
    windows: dict | None = None,
) -> None:
    """Second pass over the data files (no spilled runs, e.g. on ray): exact quantiles
    (``windows``: relative path -> salvage and template, files read a window of row groups at
    a time: :func:`~episodekit.metadata.stats.scan.file_batches`).

    The candidates inside the summary's brackets travel to this process; their number grows
    with the frames (a summary's rank error does), so while it is over
    :data:`REFINE_CANDIDATES` the brackets are first narrowed by counting rounds (each task
    returns a histogram of its values inside each bracket, :data:`REFINE_BINS` bins: a few KiB)
    until it fits or stops shrinking (ties), and the candidates travel run-length encoded.
    Still exact: only where the wanted order statistics lie is narrowed down."""
    brs = {n: brackets(dataset[n]) for n in feats}
    for _ in range(REFINE_ROUNDS):
        bound = sum(b[4] for b in brs.values())
        if bound <= REFINE_CANDIDATES:
            break
        brs = _narrow(root, rels, feats, dataset, brs, executor, jobs, batch_rows, windows)
        if sum(b[4] for b in brs.values()) > bound / 2:
            break  # what is left are ties: they travel run-length encoded
    todo = [
        {
            "root": root,
            "rel": rel,
            "features": feats,
            "batch_rows": batch_rows,
            "lo": {n: b[0] for n, b in brs.items()},
            "hi": {n: b[1] for n, b in brs.items()},
            "windows": (windows or {}).get(rel),
        }
        for rel in rels
    ]
    below = {n: 0 for n in feats}
    inside: dict[str, list[tuple[np.ndarray, ...]]] = {n: [] for n in feats}
    for _, r in imap_files(refine_file, todo, executor=executor, workers=jobs):
        for n in feats:  # copied: a result is let go as soon as it is read (see imap_files)
            below[n] = below[n] + r["below"][n]
            inside[n].append(tuple(np.array(a) for a in r["inside"][n]))
        del r
    for n in feats:
        found = tuple(np.concatenate([f[k] for f in inside[n]]) for k in range(4))
        inside[n] = []
        select_candidates(dataset[n], brs[n], below[n], found)


REFINE_CANDIDATES = 2_000_000  # candidate values gathered at most (~26 MB), else narrow first
REFINE_BINS = 256  # histogram bins of a narrowing round
REFINE_ROUNDS = 4  # narrowing rounds at most (each one pass over the feature columns)


def _narrow(root, rels, feats, dataset, brackets, executor, jobs, batch_rows, windows=None):
    """One counting round: per feature, quantile and dimension, a histogram of the values
    inside ``(lo, hi]`` over :data:`REFINE_BINS` equal bins; the new bracket is the bins that
    hold the order statistics ``k0`` and ``k1``. Returns the new brackets (same shape as
    :func:`brackets`' with the bound now an exact count)."""
    edges = {}
    for n, (lo, hi, _k0, _k1, _) in brackets.items():
        base = np.where(np.isfinite(lo), lo, np.nextafter(dataset[n].min[None, :], -np.inf))
        edges[n] = base[..., None] + (hi - base)[..., None] * np.linspace(0, 1, REFINE_BINS + 1)
        edges[n][..., 0], edges[n][..., -1] = lo, hi  # exactly the old bracket's ends
    todo = [
        {
            "root": root,
            "rel": rel,
            "features": feats,
            "batch_rows": batch_rows,
            "edges": edges,
            "windows": (windows or {}).get(rel),
        }
        for rel in rels
    ]
    cums = {n: 0 for n in brackets}
    for _, r in imap_files(count_file, todo, executor=executor, workers=jobs):
        for n in brackets:  # summed as they come
            cums[n] = cums[n] + r["cum"][n]
        del r
    out = {}
    for n, (lo, hi, k0s, k1s, _) in brackets.items():
        e = edges[n]
        cum = cums[n]  # cum[i, d, b] = values <= e[i, d, b]
        new_lo, new_hi = lo.copy(), hi.copy()
        bound = 0.0
        for i in range(lo.shape[0]):
            for d in range(lo.shape[1]):
                c = cum[i, d]
                b0 = int(np.searchsorted(c, k0s[i], side="right")) - 1  # last edge <= k0 values
                b1 = int(np.searchsorted(c, k1s[i] + 1, side="left"))  # first edge >= k1+1
                b0, b1 = max(b0, 0), min(b1, len(c) - 1)
                new_lo[i, d], new_hi[i, d] = e[i, d, b0], e[i, d, b1]
                bound += float(c[b1] - c[b0])
        out[n] = (new_lo, new_hi, k0s, k1s, bound)
    return out
