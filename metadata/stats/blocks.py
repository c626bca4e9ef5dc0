"""Pure computations on one decoded block: feature values as numpy, per-episode moments and
exact order statistics (a padded per-episode sort), and the block's rank summary."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import DatasetError
from episodekit.metadata.stats.episode_sketch import POINTS, sketch_ranks
from episodekit.metadata.stats.keys import (
    QUANTILES,
)
from episodekit.metadata.stats.sketch import (
    lerp_quantile,
    order_indices,
    part_summary,
)
from episodekit.metadata.stats.spill import Spill


def feature_values(col: pa.Array | pa.ChunkedArray, dims: int, name: str) -> np.ndarray:
    """A feature column as ``(rows, dims)`` numpy (its own numeric dtype; bool as uint8)."""
    if isinstance(col, pa.ChunkedArray):  # combine_chunks copies even a single chunk
        col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    t = col.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        if not pa.types.is_fixed_size_list(t):
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
            if len(lengths) and not np.all(lengths == dims):
                raise DatasetError(f"feature {name!r}: list lengths differ from its shape [{dims}]")
        elif t.list_size != dims:
            raise DatasetError(f"feature {name!r} has {t.list_size} values, info.json says {dims}")
        flat = pc.list_flatten(col)
    else:
        if dims != 1:
            raise DatasetError(f"feature {name!r} is a scalar column, info.json says [{dims}]")
        flat = col
    if pa.types.is_boolean(flat.type):
        flat = flat.cast(pa.uint8())
    return flat.to_numpy(zero_copy_only=False).reshape(-1, dims)


def _pad_value(dtype: np.dtype):
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def episode_segments(ep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]]) if len(ep) else np.zeros(0, np.int64)
    return starts, np.diff(np.r_[starts, len(ep)])


def _episode_quantiles(
    xt: np.ndarray, starts: np.ndarray, lens: np.ndarray, sk: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact per-episode quantiles ``(5, episodes, D)``, min and max ``(episodes, D)`` of the
    columns ``xt`` (D, rows): episodes of similar length (quarter octaves) share a padded matrix
    (all classes laid out in one buffer, filled by one scatter) sorted row-wise, so nothing loops
    per frame. The episodes' sketch points (:mod:`.episode_sketch`) are read from the same sorted
    matrix into ``sk`` (D, points)."""
    n, dims = len(starts), xt.shape[0]
    ranks, k = sketch_ranks(lens, POINTS)
    kstart = np.cumsum(k) - k
    out = np.empty((len(QUANTILES), n, dims))
    lo = np.empty((n, dims))
    hi = np.empty((n, dims))
    cls = np.ceil(np.log2(np.maximum(lens, 1)) * 4).astype(np.int64)
    classes, inverse, counts = np.unique(cls, return_inverse=True, return_counts=True)
    width = np.zeros(len(classes), np.int64)
    np.maximum.at(width, inverse, lens)
    base = np.concatenate([[0], np.cumsum(counts * width)])
    order = np.argsort(inverse, kind="stable")
    slot = np.empty(n, np.int64)  # position of each episode inside its class
    slot[order] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
    offset = base[inverse] + slot * width[inverse]
    dst = np.arange(int(lens.sum())) + np.repeat(offset - starts, lens)
    buf = np.full((dims, int(base[-1])), _pad_value(xt.dtype), dtype=xt.dtype)
    buf[:, dst] = xt
    qs = np.asarray(QUANTILES)[:, None]
    ends = np.cumsum(counts)
    for c in range(len(classes)):
        sel = order[ends[c] - counts[c] : ends[c]]
        length = lens[sel]
        mat = buf[:, base[c] : base[c + 1]].reshape(dims, len(sel), int(width[c]))
        mat.sort(axis=-1)
        rows = np.arange(len(sel))
        lo[sel] = mat[:, rows, 0].T
        hi[sel] = mat[:, rows, length - 1].T
        k0, k1, g = order_indices(length[None, :], qs)  # (5, episodes)
        a = mat[:, rows[None, :], k0].astype(np.float64)  # (D, 5, episodes)
        b = mat[:, rows[None, :], k1].astype(np.float64)
        out[:, sel] = lerp_quantile(a, b, g[None]).transpose(1, 2, 0)
        ks = k[sel]
        p = (
            np.repeat(kstart[sel], ks)
            + np.arange(int(ks.sum()))
            - np.repeat(np.cumsum(ks) - ks, ks)
        )
        sk[:, p] = mat[:, np.repeat(rows, ks), ranks[p]]
    return out, lo, hi


def _episode_order_stats(
    xt: np.ndarray, starts: np.ndarray, lens: np.ndarray, ep_sorted: np.ndarray, sk: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-episode quantiles ``(5, episodes, D)``, min and max ``(episodes, D)`` of ``xt``
    (D, rows). Dimensions already ascending inside every episode (``ep_sorted``: index,
    frame_index, timestamp, constant columns) are read in place; the others are sorted per
    episode (:func:`_episode_quantiles`)."""
    n, dims = len(starts), xt.shape[0]
    if not ep_sorted.any():
        return _episode_quantiles(xt, starts, lens, sk)
    out = np.empty((len(QUANTILES), n, dims))
    lo = np.empty((n, dims))
    hi = np.empty((n, dims))
    done = np.flatnonzero(ep_sorted)
    k0, k1, g = order_indices(lens[None, :], np.asarray(QUANTILES)[:, None])  # (5, episodes)
    sub = xt[done]
    lo[:, done] = sub[:, starts].T
    hi[:, done] = sub[:, starts + lens - 1].T
    a = sub[:, starts + k0].astype(np.float64)  # (d, 5, episodes)
    b = sub[:, starts + k1].astype(np.float64)
    out[:, :, done] = lerp_quantile(a, b, g[None]).transpose(1, 2, 0)
    ranks, k = sketch_ranks(lens, POINTS)
    sk[done] = sub[:, np.repeat(starts, k) + ranks]
    rest = np.flatnonzero(~ep_sorted)
    if len(rest):
        part = np.empty((len(rest), sk.shape[1]), sk.dtype)
        q, lo[:, rest], hi[:, rest] = _episode_quantiles(xt[rest], starts, lens, part)
        out[:, :, rest] = q
        sk[rest] = part
    return out, lo, hi


def block_stats(
    pieces: list[np.ndarray],
    starts: np.ndarray,
    lens: np.ndarray,
    points: int,
    spill: Spill | None,
) -> dict:
    """Per-episode stats of complete episodes (rows of ``pieces`` concatenated) plus the block's
    rank summary and the episodes' sketch ``points``; with ``spill`` the block's sorted columns
    are appended there (``runs``)."""
    rows = sum(len(p) for p in pieces)
    xt = np.empty((pieces[0].shape[1], rows), pieces[0].dtype)  # (D, rows), C order
    np.concatenate([p.T for p in pieces], axis=1, out=xt)
    mean = np.empty((xt.shape[0], len(starts)))
    m2 = np.empty_like(mean)
    for j, row in enumerate(xt):  # one dimension at a time: float64 temporaries stay small
        xf = row.astype(np.float64)
        mean[j] = np.add.reduceat(xf, starts) / lens
        xf -= np.repeat(mean[j], lens)
        xf *= xf
        m2[j] = np.add.reduceat(xf, starts)
    # one comparison pass tells which dimensions need sorting (NaN counts as out of order)
    ascending = xt[:, 1:] >= xt[:, :-1]
    block_sorted = ascending.all(axis=1)
    ascending[:, starts[1:] - 1] = True  # pairs across an episode boundary do not matter
    ep_sorted = ascending.all(axis=1)
    del ascending
    sk = np.empty((xt.shape[0], int(np.minimum(lens, POINTS).sum())), xt.dtype)
    q, lo, hi = _episode_order_stats(xt, starts, lens, ep_sorted, sk)
    for j in np.flatnonzero(~block_sorted):
        xt[j].sort()
    values, weights = part_summary(xt, points)
    runs = spill.add(xt) if spill is not None else []
    return {
        "min": lo,
        "max": hi,
        "mean": mean.T,
        "m2": m2.T,
        "q": q,
        "sketch": (values, weights),
        "points": sk,
        "runs": runs,
    }


def episode_points(episodes: list[np.ndarray]) -> np.ndarray:
    """The sketch points (:mod:`.episode_sketch`) of whole episodes, each a ``(rows, D)`` array
    of one feature: ``(D, points)``, episode after episode, the bits :func:`block_stats` gives
    each episode alone (its ``points``), from one sort per episode length instead of a block's
    stats per episode. As there, a dimension ascending inside an episode keeps its values in
    place, the others are sorted."""
    lens = np.array([len(x) for x in episodes], dtype=np.int64)
    dims = episodes[0].shape[1]
    ranks, k = sketch_ranks(lens, POINTS)
    out = np.empty((dims, int(k.sum())), episodes[0].dtype)
    at = np.cumsum(k) - k
    for n in np.unique(lens).tolist():
        sel = np.flatnonzero(lens == n)
        if n == 0:
            continue
        xt = np.stack([episodes[i] for i in sel.tolist()]).transpose(2, 0, 1)  # (D, E, n)
        ascending = (xt[..., 1:] >= xt[..., :-1]).all(axis=-1)  # (D, E); NaN: not ascending
        r = ranks[at[sel[0]] : at[sel[0]] + k[sel[0]]]  # every episode of n keeps these ranks
        pts = np.sort(xt, axis=-1)[..., r]
        pts = np.where(ascending[..., None], xt[..., r], pts)  # (D, E, k)
        cols = (at[sel][:, None] + np.arange(len(r))[None, :]).reshape(-1)
        out[:, cols] = pts.reshape(dims, -1)
    return out
