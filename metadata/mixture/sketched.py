"""A mixture source's stats from what it already holds, without reading its data: the quantile
sketches of its selected episodes (``meta/episodekit_sketches.parquet``) and their per-episode
stats (``stats/{feature}/{count,mean,std,min,max}`` of ``meta/episodes``).

Used only when the sidecar is fresh (the episodes fingerprint *and* the data files' state it
records are the source's now), holds every feature asked with its width, covers every selected
episode whole, and the episodes table has complete per-episode stats of those features.
Otherwise :func:`sketched_source_stats` returns None and the caller reads the data.

- count, mean, std (Chan's merge of the episodes' moments), min, max: exact, as exact as the
  per-episode stats (``metadata stats`` writes them in float64 from the data);
- the rank summary is the episodes' sketch points with their weights: a union of whole episodes
  counts ``x <= v`` within ``sum(ceil(n / POINTS) - 1) < N / POINTS`` (``POINTS`` = 128; see
  :mod:`episodekit.metadata.stats.episode_sketch`), which :class:`FeatureStats` carries as its
  ``quantile_error``, so the mixture's merge and its recorded bound stay the same as for data.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import V3, Dataset, DatasetError, episodes_files, read_parquet
from episodekit.core.parquet_read import read_schema
from episodekit.metadata.stats import FeatureStats, data_state
from episodekit.metadata.stats.episode_merge import EpisodeMerge
from episodekit.metadata.stats.episode_sketch import read_episode_sketches, read_sketches_meta

MOMENT_KEYS = ("count", "mean", "std", "min", "max")


def _matrix(col: pa.ChunkedArray, rows: int) -> np.ndarray | None:
    """A list column (one list per episode, equal lengths) as ``(rows, D)`` float64; None when
    it has nulls or ragged rows."""
    arr = col.combine_chunks()
    if arr.null_count:
        return None
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        if pc.list_flatten(arr).null_count:
            return None
        arr = pc.list_flatten(arr)
    flat = arr.to_numpy(zero_copy_only=False).astype(np.float64)
    if rows == 0 or len(flat) % rows:
        return None
    return flat.reshape(rows, -1)


def episode_moments(
    ds: Dataset, features: dict[str, int]
) -> tuple[np.ndarray, dict[str, dict[str, np.ndarray]]] | None:
    """``(episode_index, {feature: {key: (E, D)}})`` of the per-episode stats columns of
    ``meta/episodes`` (every episode, sorted); None when a column is missing, has nulls or
    another width than ``features`` says."""
    cols = [f"stats/{n}/{k}" for n in features for k in MOMENT_KEYS]
    parts: list[pa.Table] = []
    try:
        for f in episodes_files(ds.fs, ds.path):
            if not set(cols) <= set(read_schema(ds.fs, f).names):
                return None
            parts.append(read_parquet(ds.fs, f, columns=["episode_index", *cols]))
    except (DatasetError, OSError):
        return None
    if not parts:
        return None
    t = pa.concat_tables(parts, promote_options="default").sort_by("episode_index")
    rows = t.num_rows
    out: dict[str, dict[str, np.ndarray]] = {}
    for n, dims in features.items():
        per = {}
        for k in MOMENT_KEYS:
            m = _matrix(t[f"stats/{n}/{k}"], rows)
            if m is None or m.shape[1] != (1 if k == "count" else dims):
                return None
            per[k] = m
        out[n] = per
    return t["episode_index"].to_numpy().astype(np.int64), out


def sketched_source_stats(
    ds: Dataset,
    features: dict[str, int],
    episodes: np.ndarray | None = None,
    state: str | None = None,
) -> dict[str, FeatureStats] | None:
    """Stats of ``features`` (``{name: dims}``, the source's names) over ``episodes`` (all when
    None) from the source's sketches and per-episode stats, reading no data column; None when
    they cannot serve (see the module docstring). ``state``: the source's :func:`data_state`
    when the caller has it."""
    if ds.version != V3:
        return None
    meta = read_sketches_meta(ds)
    if meta is None or meta.get("data_state") != (state or data_state(ds)):
        return None
    sk = read_episode_sketches(ds)
    if sk is None or any(
        n not in sk.points or sk.points[n].shape[0] != d for n, d in features.items()
    ):
        return None
    all_eps = ds.column("episode_index").astype(np.int64)  # sorted (the episodes table's order)
    want = all_eps if episodes is None else np.asarray(episodes, dtype=np.int64)
    own = np.minimum(np.searchsorted(all_eps, want), max(len(all_eps) - 1, 0))
    rows = np.minimum(np.searchsorted(sk.episode_index, want), max(len(sk.episode_index) - 1, 0))
    if not len(want) or not np.array_equal(sk.episode_index[rows], want):
        return None
    if not np.array_equal(sk.length[rows], ds.column("length").astype(np.int64)[own]):
        return None
    moments = episode_moments(ds, features)
    if moments is None:
        return None
    ep, per = moments
    at = np.minimum(np.searchsorted(ep, want), max(len(ep) - 1, 0))
    if not np.array_equal(ep[at], want):
        return None
    picked = sk.select(rows)
    out = {}
    for n in features:
        m = {k: v[at] for k, v in per[n].items()}
        count = m["count"][:, 0]
        if not np.array_equal(count, picked.length):
            return None  # the episodes' stats are not of these episodes' frames
        merge = EpisodeMerge()
        merge.add(m)
        if merge.mean is None:
            return None  # no frames to weigh
        moments = (merge.mean, merge.m2, merge.min, merge.max)
        total = merge.count
        out[n] = FeatureStats.from_sketches(int(total), total, moments, picked.sketches(n))
    return out


__all__ = ["episode_moments", "sketched_source_stats"]
