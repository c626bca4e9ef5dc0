"""LeRobot's per-episode quantiles from the sorted values (``lerobot_stats._sorted_quantiles``)
are bit for bit those of its 5000-bin histogram (``_histogram_quantiles``, np.histogram)."""

from __future__ import annotations

import numpy as np
import pytest

from episodekit.metadata.lerobot_stats import _histogram_quantiles, _sorted_quantiles


def _columns() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    out = []
    for n in (2, 3, 5, 20, 101, 777):
        out += [
            rng.normal(size=n),  # float64: the edges in float64
            rng.normal(size=n).astype(np.float32),  # float32: lo - 1e-10 == lo, edges float32
            (rng.normal(size=n) * 1e6).astype(np.float32),
            rng.integers(0, 3, n).astype(np.float32),  # ties: values on the edges
            rng.integers(0, 5, n).astype(np.float64),
            np.full(n, 0.25, np.float32),  # one value: a zero-width range
            np.full(n, -3.0),
            np.r_[np.full(n - 1, -1e-12), [5.0]],
        ]
    return out


@pytest.mark.parametrize("col", _columns(), ids=lambda c: f"{c.dtype}x{len(c)}")
def test_sorted_values_give_the_histograms_bits(col: np.ndarray) -> None:
    lo, hi = col.min(), col.max()
    want = _histogram_quantiles(col, lo, hi)
    got = _sorted_quantiles(np.sort(col), lo, hi)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (got, want)


def _matrices() -> list[np.ndarray]:
    rng = np.random.default_rng(12)
    out = []
    for n in (2, 3, 20, 101):
        for dtype in (np.float32, np.float64):
            cols = [c.astype(dtype) for c in _columns() if len(c) == n]
            out.append(np.stack(cols, axis=1))  # every kind of column side by side
            out.append(np.stack(cols[:2] + cols[3:5], axis=1))  # no zero-width column
            out.append(rng.integers(-3, 4, (n, 7)).astype(dtype))
    return out


@pytest.mark.parametrize("x", _matrices(), ids=lambda x: f"{x.dtype}x{x.shape}")
def test_columns_at_once_give_each_columns_bits(x: np.ndarray) -> None:
    from episodekit.metadata.lerobot_stats import _sorted_quantiles_columns

    lo, hi = x.min(axis=0), x.max(axis=0)
    want = np.stack(
        [_histogram_quantiles(x[:, j], lo[j], hi[j]) for j in range(x.shape[1])], axis=1
    )
    got = _sorted_quantiles_columns(np.sort(x, axis=0), lo, hi)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_edge_rows_are_each_rows_linspace(dtype: type) -> None:
    from episodekit.metadata.lerobot_stats import NUM_BINS, PAD, edge_rows

    rng = np.random.default_rng(13)
    lo = np.r_[rng.normal(size=20) * 10.0 ** rng.integers(-12, 12, 20), 0.25, -3.0, 1e9, 0.0]
    hi = lo + np.r_[np.abs(rng.normal(size=20)) * 10.0 ** rng.integers(-12, 4, 20), 0, 0, 0, 0]
    lo, hi = lo.astype(dtype), np.maximum(hi.astype(dtype), lo.astype(dtype))
    start, stop = lo - PAD, hi + PAD
    got = edge_rows(start, stop)
    want = np.stack([np.linspace(a, b, NUM_BINS + 1) for a, b in zip(start, stop)])
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
