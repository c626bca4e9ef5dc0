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
