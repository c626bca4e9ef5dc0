"""Pure computations: numpy's ``linear`` quantile rule, the mergeable rank summary (:class:`Sketch`)
and one feature's stats (:class:`FeatureStats`) with their merge (:func:`merge_stats`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from episodekit.metadata.episode_stats import QUANTILE_KEYS
from episodekit.metadata.stats.keys import (
    QUANTILES,
)

# --------------------------------------------------------------------------------------------
# Quantiles: numpy's "linear" rule, and the mergeable rank summary


def lerp_quantile(a: np.ndarray, b: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    """numpy's ``_lerp``: the same arithmetic as ``np.quantile(method="linear")``, bit for bit."""
    diff = b - a
    out = a + diff * gamma
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), out)


def order_indices(n: np.ndarray | int, q: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For ``n`` values and quantile ``q``: the two 0-based order statistics numpy interpolates
    between and the weight (``virtual index = (n - 1) * q``)."""
    n = np.asarray(n, dtype=np.int64)
    h = (n - 1) * q
    k0 = np.floor(h).astype(np.int64)
    k1 = np.minimum(k0 + 1, np.maximum(n - 1, 0))
    return k0, k1, h - k0


@dataclass
class Sketch:
    """A mergeable rank summary of one dimension: sorted ``values`` with ``weights`` (how many
    data ranks each stands for). Estimated count(x <= v) = sum of weights of values <= v; the true
    count is in ``[estimate, estimate + rank_error]``. A summary with all weights 1 is the data."""

    values: np.ndarray
    weights: np.ndarray
    rank_error: float

    @property
    def total(self) -> float:
        return float(self.weights.sum())

    def compact(self, points: int) -> Sketch:
        """At most ``points`` values; the rank error grows by the largest new weight - 1."""
        if len(self.values) <= points:
            return self
        cum = np.cumsum(self.weights)
        targets = cum[-1] * np.arange(1, points + 1) / points
        idx = np.unique(np.minimum(np.searchsorted(cum, targets - 1e-9), len(cum) - 1))
        new_cum = cum[idx]
        weights = np.diff(new_cum, prepend=0.0)
        return Sketch(self.values[idx], weights, self.rank_error + float(weights.max()) - 1)

    def order_statistic(self, k: np.ndarray) -> np.ndarray:
        """Estimated value of the 0-based order statistics ``k``: its true rank is within
        ``rank_error`` of ``k`` (centred: within half of it where the summary allows)."""
        cum = np.cumsum(self.weights)
        target = np.asarray(k, dtype=np.float64) + 1 - self.rank_error / 2
        idx = np.minimum(np.searchsorted(cum, target - 1e-9), len(cum) - 1)
        return self.values[idx]


def merge_sketches(sketches: list[Sketch], scales: list[float] | None = None) -> Sketch:
    """One summary of the union (weights multiplied by ``scales`` for a weighted mixture)."""
    scales = scales or [1.0] * len(sketches)
    values = np.concatenate([s.values for s in sketches])
    weights = np.concatenate([s.weights * c for s, c in zip(sketches, scales)])
    order = np.argsort(values, kind="stable")
    error = sum(s.rank_error * c for s, c in zip(sketches, scales))
    return Sketch(values[order], weights[order], error)


def part_summary(sorted_cols: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank summary of one batch: ``(values (m, D), weights (m,))`` from its sorted columns
    ``(D, n)``; ranks ``ceil(j n / m)``, so every weight is at most ``ceil(n / m)``."""
    n = sorted_cols.shape[1]
    if n <= points:
        ranks = np.arange(1, n + 1, dtype=np.int64)
    else:
        j = np.arange(1, points + 1, dtype=np.int64)
        ranks = np.unique((j * n + points - 1) // points)
    return sorted_cols[:, ranks - 1].T.astype(np.float64), np.diff(ranks, prepend=0)


# --------------------------------------------------------------------------------------------
# Stats of one feature, and merging them


@dataclass
class FeatureStats:
    """Stats of one feature over a set of frames, with the summary its quantiles merge through.

    ``count`` frames (a mixture's merge keeps the true frame count), per-dimension ``mean``,
    ``m2`` (sum of squared deviations, in units of ``mass``: frames, or mixture weight),
    ``min``, ``max``, ``quantiles`` (5 x D, exact when ``quantile_error`` is 0) and per-dimension
    ``sketches``."""

    count: int
    mass: float
    mean: np.ndarray
    m2: np.ndarray
    min: np.ndarray
    max: np.ndarray
    quantiles: np.ndarray
    sketches: list[Sketch]
    quantile_error: float = 0.0  # rank-error bound of ``quantiles`` (in units of mass)

    @classmethod
    def from_sketches(
        cls, count: int, mass: float, moments: tuple[np.ndarray, ...], sketches: list[Sketch]
    ) -> FeatureStats:
        """The stats of ``moments`` (mean, m2, min, max) with quantiles read from ``sketches``
        and their largest rank-error bound."""
        mean, m2, lo, hi = moments
        fs = cls(
            count=count,
            mass=mass,
            mean=mean,
            m2=m2,
            min=lo,
            max=hi,
            quantiles=np.zeros((len(QUANTILES), len(sketches))),
            sketches=sketches,
            quantile_error=max(s.rank_error for s in sketches),
        )
        fs.quantiles = fs.sketch_quantiles()
        return fs

    @property
    def std(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.m2 / self.mass, 0.0))

    def sketch_quantiles(self) -> np.ndarray:
        """Quantiles (5 x D) read from the summaries."""
        out = np.empty((len(QUANTILES), len(self.sketches)))
        for d, s in enumerate(self.sketches):
            n = int(round(s.total))
            for i, q in enumerate(QUANTILES):
                k0, k1, g = order_indices(n, q)
                a, b = s.order_statistic(np.array([k0, k1]))
                out[i, d] = lerp_quantile(a, b, g)
        return out

    def to_lerobot(self) -> dict[str, list]:
        """The LeRobot stats dict of this feature (JSON-ready lists; count ``[N]``)."""
        out: dict[str, list] = {
            "min": self.min.tolist(),
            "max": self.max.tolist(),
            "mean": self.mean.tolist(),
            "std": self.std.tolist(),
            "count": [int(self.count)],
        }
        for i, key in enumerate(QUANTILE_KEYS):
            out[key] = self.quantiles[i].tolist()
        return out


def merge_stats(
    parts: list[dict[str, FeatureStats]], weights: list[float] | None = None
) -> dict[str, FeatureStats]:
    """Merge the stats of several datasets (or halves of one) feature by feature.

    Without ``weights`` every frame counts once: mean and std by the counts-weighted parallel
    merge (Chan et al.), min/max of the parts, quantiles from the merged summaries (exact when
    every part's summary is its full data, else within the summed rank-error bound). With
    ``weights`` (a mixture, weights as sampled) part ``i`` contributes probability mass
    ``weights[i] / sum(weights)``: mean, std and quantiles are those of the mixture distribution;
    ``count`` stays the total number of frames. Only features present in every part are merged.
    """
    if not parts:
        raise ValueError("merge_stats needs at least one part")
    if weights is not None:
        if len(weights) != len(parts) or any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights must be {len(parts)} non-negative numbers, not all 0")
    names = [n for n in parts[0] if all(n in p for p in parts[1:])]
    out: dict[str, FeatureStats] = {}
    for name in names:
        fs = [p[name] for p in parts]
        frames = float(sum(f.count for f in fs))
        if weights is None:
            mass = np.array([f.mass for f in fs], dtype=np.float64)
        else:  # mixture mass in frame units: quantile ranks stay comparable with a dataset's
            total_w = float(sum(weights))
            mass = np.array([frames * w / total_w for w in weights], dtype=np.float64)
        scale = mass / np.array([f.mass for f in fs], dtype=np.float64)  # per-part mass factor
        total = mass.sum()
        means = np.stack([f.mean for f in fs])
        mean = (means * mass[:, None]).sum(0) / total
        m2 = sum(f.m2 * c for f, c in zip(fs, scale)) + ((means - mean) ** 2 * mass[:, None]).sum(0)
        dims = len(fs[0].sketches)
        sketches = [
            merge_sketches(
                [f.sketches[d] for f in fs],
                [c * f.mass / f.sketches[d].total for f, c in zip(fs, scale)],
            )
            for d in range(dims)
        ]
        lo, hi = np.min(np.stack([f.min for f in fs]), 0), np.max(np.stack([f.max for f in fs]), 0)
        count = int(sum(f.count for f in fs))
        out[name] = FeatureStats.from_sketches(count, float(total), (mean, m2, lo, hi), sketches)
    return out
