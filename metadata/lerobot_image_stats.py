"""LeRobot's per-episode image stats (``lerobot/datasets/compute_stats.py``, 0.4-0.6.1): which
frames are sampled, how they are downsampled, and the stats of the sampled pixels, in numpy
alone (the import's camera processes compute them without loading pyarrow).

See :mod:`episodekit.metadata.image_stats` for the conventions (sampling, strides, /255).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from episodekit.metadata import lerobot_stats

MIN_SAMPLES, MAX_SAMPLES, SAMPLE_POWER = 100, 10_000, 0.75
DOWNSAMPLE_TARGET, DOWNSAMPLE_THRESHOLD = 150, 300
STAT_KEYS = ("min", "max", "mean", "std", "count", *lerobot_stats.LEROBOT_QUANTILE_KEYS)


def estimate_num_samples(length: int) -> int:
    """LeRobot's ``estimate_num_samples`` (default arguments)."""
    low = min(MIN_SAMPLES, length)
    return max(low, min(int(length**SAMPLE_POWER), MAX_SAMPLES))


def sample_indices(length: int) -> np.ndarray:
    """LeRobot's ``sample_indices``: the frames (0-based, within the episode) that are sampled."""
    n = estimate_num_samples(int(length))
    return np.round(np.linspace(0, length - 1, n)).astype(np.int64)


def downsample_step(height: int, width: int) -> int:
    """LeRobot's ``auto_downsample_height_width`` stride (1: kept whole)."""
    if max(width, height) < DOWNSAMPLE_THRESHOLD:
        return 1
    return max(1, int((width if width > height else height) / DOWNSAMPLE_TARGET))


def _quantiles_as_recorded(
    lo: np.ndarray, hi: np.ndarray, n: int, histogram: Any
) -> dict[str, np.ndarray]:
    """LeRobot's ``RunningQuantileStats`` quantiles of ``n`` rows of ``C`` float32 values (per
    channel ``lo``/``hi`` its float32 min/max, ``histogram(j, edges)`` channel ``j``'s counts in
    its 5000 bins), in the dtype it gets them in: per quantile the channels' values as one
    array, float32 when every channel's value is a histogram edge (an edge is float32), else
    float64 (interpolated)."""
    per: dict[str, list] = {k: [] for k in lerobot_stats.LEROBOT_QUANTILE_KEYS}
    for j in range(len(lo)):
        pad = lerobot_stats.PAD
        edges = np.linspace(lo[j] - pad, hi[j] + pad, lerobot_stats.NUM_BINS + 1)
        cumsum = np.cumsum(np.asarray(histogram(j, edges)).astype(np.float64))
        for q, k in zip(lerobot_stats.LEROBOT_QUANTILES, lerobot_stats.LEROBOT_QUANTILE_KEYS):
            target = q * n
            idx = int(np.searchsorted(cumsum, target))
            if idx == 0:
                v = edges[0]
            elif idx >= len(cumsum):
                v = edges[-1]
            elif cumsum[idx] - cumsum[idx - 1] == 0:
                v = edges[idx]
            else:
                fraction = (target - cumsum[idx - 1]) / (cumsum[idx] - cumsum[idx - 1])
                v = edges[idx] + fraction * (edges[idx + 1] - edges[idx])
            per[k].append(v)
    return {k: np.array(v) for k, v in per.items()}


def lerobot_image_stats(frames: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's stats of one episode's sampled ``(N, H, W, C)`` uint8 frames: per channel over
    every pixel in float32, divided by 255 in the dtype each stat has there (min/max/mean/std
    float32; quantiles: :func:`_quantiles_as_recorded`), as ``(C, 1, 1)``; ``count`` is N.

    The same bits as :func:`lerobot_stats.episode_stats` on the float32 pixels, from cheaper
    passes (uint8 frames of 2 pixels or more): min/max and the quantiles from each channel's
    256 value counts (:func:`_count_quantiles`), and the float32 sums of ``x`` and ``x**2`` as
    numpy's ``mean(axis=0)`` of ``(pixels, C)`` adds them, one after another
    (:func:`_float32_sums`). Tests compare the two."""
    n, c = len(frames), frames.shape[-1]
    if frames.dtype != np.uint8 or frames.size < 2 * c:
        return _image_stats(frames.reshape(-1, c).astype(np.float32), n, c)
    planes = np.ascontiguousarray(frames.reshape(-1, c).T)  # (C, pixels) uint8
    rows = planes.shape[1]
    counts = np.stack([np.bincount(ch, minlength=256) for ch in planes])
    levels = np.arange(256, dtype=np.float32)
    lo = levels[np.argmax(counts > 0, axis=1)]
    hi = levels[255 - np.argmax(counts[:, ::-1] > 0, axis=1)]
    # np.mean: the float32 sum divided by an intp count, written back as float32
    value = np.arange(256, dtype=np.int64)
    sums = _float32_sums(planes, counts @ value, square=False)
    mean = np.true_divide(sums, np.intp(rows), casting="unsafe").astype(np.float32)
    sums = _float32_sums(planes, counts @ (value * value), square=True)
    mean_sq = np.true_divide(sums, np.intp(rows), casting="unsafe").astype(np.float32)
    std = np.sqrt(np.maximum(0, mean_sq - mean**2))
    x = {k: np.asarray(v, dtype=np.float64) for k, v in zip(_MOMENTS, (lo, hi, mean, std))}
    x.update(_count_quantiles(counts, lo, hi, rows))
    return _scaled(x, n, c, rows)


EXACT_SUM = 2**24  # float32 holds every integer up to here: partial sums below it are exact


def _float32_sums(planes: np.ndarray, exact: np.ndarray, square: bool) -> np.ndarray:
    """Per channel the float32 sum of the pixels ``x`` (or ``x**2``) added one after another
    (numpy's ``cumsum``, as its ``mean(axis=0)`` of ``(pixels, C)``): the exact integer sum
    ``exact`` where it is at most :data:`EXACT_SUM` (every partial sum is then an integer
    float32 holds, so nothing rounds), else the float32 ``cumsum`` itself."""
    out = np.empty(len(planes), np.float32)
    for j, total in enumerate(exact.tolist()):
        if total <= EXACT_SUM:
            out[j] = np.float32(total)
        else:
            x = planes[j].astype(np.float32)
            if square:
                x *= x
            out[j] = np.cumsum(x)[-1]
    return out


def _count_quantiles(
    counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, rows: int
) -> dict[str, np.ndarray]:
    """:func:`_quantiles_as_recorded` of uint8 pixels from their per-channel value ``counts``
    ``(C, 256)``, every channel and quantile at once, without the 5000-bin histograms: its
    cumulative count first reaches ``q * rows`` in the bin holding the ``k``-th smallest value
    (``k = ceil(q * rows)``), and the counts before and inside that bin are the counts of the
    values below its edges (``np.histogram``'s comparisons: left edges exclusive, the last edge
    inclusive). The same bits and dtypes (tests compare the two)."""
    bins = lerobot_stats.NUM_BINS
    pad = lerobot_stats.PAD
    c = len(counts)
    edges = lerobot_stats.edge_rows(lo - pad, hi + pad)  # (C, bins + 1), float32 as lo, hi
    levels = np.arange(256, dtype=np.float32)
    below = np.zeros((c, 257), np.int64)  # below[j, m]: channel j's pixels under level m
    np.cumsum(counts, axis=1, out=below[:, 1:])
    target = np.array([q * rows for q in lerobot_stats.LEROBOT_QUANTILES])  # (5,)
    k = np.clip(np.ceil(target), 1, rows).astype(np.int64)
    kth = levels[(below[:, None, 1:] < k[None, :, None]).sum(axis=2)]  # (C, 5)
    idx = np.minimum((edges[:, None, :] <= kth[:, :, None]).sum(axis=2) - 1, bins - 1)
    ch = np.arange(c)[:, None]
    e0, e1 = edges[ch, idx], edges[ch, idx + 1]
    before = below[ch, np.searchsorted(levels, e0, "left")].astype(np.float64)
    upto = np.where(
        idx < bins - 1,
        below[ch, np.searchsorted(levels, e1, "left")],
        below[ch, np.searchsorted(levels, e1, "right")],
    ).astype(np.float64)
    in_bin = upto - before
    on_edge = (idx == 0) | (in_bin == 0)
    edge = np.where(idx == 0, edges[:, :1], e0)  # float32
    fraction = (target - before) / np.where(on_edge, 1.0, in_bin)
    value = np.where(on_edge, edge, e0 + fraction * (e1 - e0))  # float64
    out = {}
    for i, key in enumerate(lerobot_stats.LEROBOT_QUANTILE_KEYS):
        # per quantile the channels' values as one array: float32 when each is an edge
        out[key] = edge[:, i].copy() if on_edge[:, i].all() else value[:, i].copy()
    return out


_MOMENTS = ("min", "max", "mean", "std")


def _image_stats(pixels: np.ndarray, n: int, c: int) -> dict[str, np.ndarray]:
    """:func:`lerobot_image_stats` straight from the ``(rows, C)`` float32 pixels."""
    x = {k: np.asarray(v) for k, v in lerobot_stats.episode_stats(pixels).items()}
    if len(pixels) >= 2:

        def histogram(j: int, edges: np.ndarray) -> np.ndarray:
            return np.histogram(pixels[:, j], bins=edges)[0]

        lo, hi = pixels.min(axis=0), pixels.max(axis=0)
        x.update(_quantiles_as_recorded(lo, hi, len(pixels), histogram))
    return _scaled(x, n, c, len(pixels))


def _scaled(x: dict[str, np.ndarray], n: int, c: int, rows: int) -> dict[str, np.ndarray]:
    """The stats divided by 255 as LeRobot stores them, ``(C, 1, 1)``; count ``[n]``."""
    out: dict[str, np.ndarray] = {}
    for k in STAT_KEYS:
        if k == "count":
            out[k] = np.array([n], dtype=np.int64)
        elif k in _MOMENTS or rows < 2:
            out[k] = (x[k].astype(np.float32) / np.float32(255.0)).reshape(c, 1, 1)
        else:
            out[k] = (x[k] / 255.0).reshape(c, 1, 1)
    return out
