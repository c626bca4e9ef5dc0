"""Exact arithmetic of a mixture: effective weights, per-epoch quotas, per-bin draws and the
epoch a plan realizes (fractions and integers; sums exact by construction)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from episodekit.core.words import plural
from episodekit.metadata.mixture.errors import MixtureError


def largest_remainder(total: int, shares: list[Fraction]) -> list[int]:
    """Integers proportional to ``shares`` summing to ``total`` exactly (Hamilton's method):
    floors first, then one more to the largest remainders (ties: the earlier one)."""
    s = sum(shares, Fraction(0))
    if s <= 0:
        raise ValueError("shares must sum to more than 0")
    exact = [total * x / s for x in shares]
    out = [math.floor(x) for x in exact]
    left = total - sum(out)
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:left]:
        out[i] += 1
    return out


def effective_weights(
    weights: list[Fraction], frames: list[int], episodes: list[int], balance: str
) -> list[Fraction]:
    """Weights after ``balance``, normalized to sum to 1 (exact fractions)."""
    size = {"none": [1] * len(weights), "frames": frames, "episodes": episodes}[balance]
    eff = [Fraction(w) * n for w, n in zip(weights, size)]
    total = sum(eff, Fraction(0))
    if total <= 0:
        raise MixtureError("the mixture selects no frames: every source is empty")
    return [e / total for e in eff]


def quotas(
    total: int, weights: list[Fraction], frames: list[int], overflow: str = "repeat"
) -> list[int]:
    """Frames per source for an epoch of ``total`` frames (sums to ``total`` exactly).

    ``repeat``: largest remainder of ``total`` by weight. ``cap``: a source never gets more
    than its frames; the surplus goes to the others by weight (water-filling)."""
    if overflow == "repeat":
        return largest_remainder(total, list(weights))
    if total > sum(frames):
        raise MixtureError(
            f"epoch_frames {total:,} is more than the sources hold ({sum(frames):,} frames) "
            "with overflow 'cap': lower epoch_frames or use overflow 'repeat'"
        )
    capped: dict[int, int] = {}
    while True:
        free = [i for i in range(len(weights)) if i not in capped]
        left = total - sum(capped.values())
        if not free:
            break
        share = largest_remainder(left, [weights[i] for i in free])
        over = [i for i, q in zip(free, share) if q > frames[i]]
        if not over:
            out = [0] * len(weights)
            for i, q in zip(free, share):
                out[i] = q
            for i, q in capped.items():
                out[i] = q
            return out
        for i in over:
            capped[i] = frames[i]
    return [capped[i] for i in range(len(weights))]


def bin_draws(source_quotas: list[int] | np.ndarray, num_bins: int) -> np.ndarray:
    """(bins, sources) draws per bin: the epoch's ``sum(quotas)`` slots laid out source after
    source and dealt to the bins round-robin (slot ``j`` to bin ``j mod bins``). Every bin gets
    exactly ``sum / bins`` slots (the sum must be a multiple of ``bins``), every source exactly
    its quota, and each (bin, source) ``floor`` or ``ceil`` of ``quota / bins``."""
    q = np.asarray(source_quotas, dtype=np.int64)
    total = int(q.sum())
    if total % num_bins:
        raise ValueError(f"{total} slots cannot be dealt equally to {num_bins} bins")
    hi = np.cumsum(q)
    lo = hi - q
    b = np.arange(num_bins, dtype=np.int64)[:, None]
    # slots j in [lo, hi) with j % B == b: ceil((hi - b) / B) - ceil((lo - b) / B)
    return (-((b - hi[None, :]) // num_bins)) - (-((b - lo[None, :]) // num_bins))


def epoch_size(requested: int, num_bins: int, policy: str) -> int:
    """The epoch a plan of ``num_bins`` bins realizes: ``requested`` rounded to a multiple of
    the bins (``trim``: down, ``wrap``: up), so every bin yields the same count."""
    per = requested // num_bins if policy == "trim" else -(-requested // num_bins)
    if per < 1:
        raise MixtureError(
            f"epoch_frames {requested:,} is fewer than the plan's {plural(num_bins, 'bin')} "
            "(every bin needs a sample): raise epoch_frames or use --policy wrap"
        )
    return per * num_bins
