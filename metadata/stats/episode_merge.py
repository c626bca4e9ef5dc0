"""The counts-weighted merge of per-episode stats (min, max, mean, std, count), folded one chunk
of episodes at a time (an episodes file): ``validate``'s ``stats.consistent`` holds a few vectors
per feature instead of every episode's stats, and a mixture's sketched source
(:mod:`episodekit.metadata.mixture.sketched`) takes its moments from its episodes' stats.

Each chunk becomes ``(n, mean, M2)`` exactly as the merge of all episodes would compute it
restricted to the chunk (``n = sum(count)``, ``mean = sum(count * mean) / n``,
``M2 = sum(count * (std**2 + (mean_i - mean)**2))``); chunks are joined with Chan et al.'s
pairwise update, which never subtracts two large sums (no ``sum(w*mean**2) - n*mean**2``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MERGED_KEYS = ("min", "max", "mean", "std", "count")


@dataclass
class EpisodeMerge:
    """Running merge of per-episode stats; :meth:`add` a chunk, :meth:`merged` the result."""

    count: float = 0.0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    min: np.ndarray | None = None
    max: np.ndarray | None = None

    def add(self, got: dict[str, np.ndarray]) -> None:
        """Fold one chunk: ``got[k]`` is ``(episodes, D)`` for every key of ``MERGED_KEYS``
        (``count`` ``(episodes, 1)``). Episodes whose counts sum to 0 add only to min/max."""
        if len(got["count"]) == 0:
            return
        part = EpisodeMerge(min=got["min"].min(0), max=got["max"].max(0))
        w = got["count"][:, 0].astype(np.float64)
        n = float(w.sum())
        if n != 0:
            part.count = n
            part.mean = (got["mean"] * w[:, None]).sum(0) / n
            part.m2 = ((got["std"] ** 2 + (got["mean"] - part.mean) ** 2) * w[:, None]).sum(0)
        self.join(part)

    def join(self, other: EpisodeMerge | None) -> None:
        """Fold another merge into this one (Chan et al.'s update of count, mean and M2)."""
        if other is None or other.min is None:
            return
        self.min = other.min if self.min is None else np.minimum(self.min, other.min)
        self.max = other.max if self.max is None else np.maximum(self.max, other.max)
        if other.mean is None:
            return
        if self.mean is None:
            self.count, self.mean, self.m2 = other.count, other.mean, other.m2
            return
        total = self.count + other.count
        if total == 0:  # negative counts (stats.count reports them): nothing to weigh by
            self.count, self.m2 = 0.0, self.m2 + other.m2
            return
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.count / total)
        self.m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / total)
        self.count = total

    def merged(self) -> dict[str, np.ndarray] | None:
        """``{min, max, mean, std, count}`` of everything added, or None when the counts sum to
        nothing (no frames to weigh)."""
        if self.mean is None or self.count <= 0:
            return None
        return {
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "std": np.sqrt(self.m2 / self.count),
            "count": np.array([self.count]),
        }


__all__ = ["MERGED_KEYS", "EpisodeMerge"]
