"""The arithmetic of an elastic epoch (see :mod:`episodekit.loaders.elastic`): the global
sequence over canonical bins (:class:`GlobalOrder`) and how a run of ``W`` ranks shares the rest
of it (:class:`RunLayout`). Pure functions of integers: no data, no state files."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class GlobalOrder:
    """The epoch's global sequence over ``num_bins`` canonical bins: pure arithmetic."""

    def __init__(
        self, num_bins: int, samples_per_bin: int, micro_batch: int = 1, policy: str = "trim"
    ):
        c, m, s = int(num_bins), int(micro_batch), int(samples_per_bin)
        if c < 1 or m < 1:
            raise ValueError(f"need >= 1 bin and micro_batch >= 1, got {c} and {m}")
        s = (s // m) * m if policy == "trim" else -(-s // m) * m
        if s < m:
            raise ValueError(
                f"micro_batch {m} is larger than the {samples_per_bin} samples per bin"
            )
        self.num_bins, self.micro_batch, self.samples_per_bin = c, m, s
        self.window = c * m  # one step window (a round)
        self.rounds = s // m
        self.total = c * s

    def locate(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bin, sample of that bin's stream) of global positions ``g``."""
        g = np.asarray(g, dtype=np.int64)
        t, r = np.divmod(g, self.window)
        return r // self.micro_batch, t * self.micro_batch + r % self.micro_batch


def union(intervals: Any) -> np.ndarray:
    """Disjoint, sorted, non-adjacent [lo, hi) intervals covering the same positions; (k, 2)."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    iv = iv[iv[:, 1] > iv[:, 0]]
    if not len(iv):
        return np.zeros((0, 2), np.int64)
    iv = iv[np.lexsort((iv[:, 1], iv[:, 0]))]
    reach = np.maximum.accumulate(iv[:, 1])
    new = np.r_[True, iv[1:, 0] > reach[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(iv) - 1]
    return np.stack([iv[first, 0], reach[last]], axis=1)


class RunLayout:
    """How a run of ``world_size`` ranks, started at (``frontier``, ``ahead``: intervals of
    positions consumed beyond it), shares the rest of the epoch: every rank's stream as units
    (one batch per step). ``per_rank`` samples per rank, ``repeats`` padding samples over all
    ranks. Everything is O(intervals), never O(samples)."""

    def __init__(
        self,
        order: GlobalOrder,
        world_size: int,
        frontier: int = 0,
        ahead: Any = None,
    ):
        w = int(world_size)
        if w < 1:
            raise ValueError(f"world size must be >= 1, got {world_size}")
        n = order.total
        ahead = union(np.zeros((0, 2)) if ahead is None else ahead)
        self.order, self.world_size = order, w
        self.frontier, self.ahead = int(frontier), ahead
        self.group = w // math.gcd(w, order.window)  # rounds per step
        self.span = self.group * order.window  # samples per step, all ranks
        self.share = self.span // w  # samples per step and rank
        top = max(self.frontier, int(ahead[-1, 1]) if len(ahead) else 0)
        self.h = min(-(-top // self.span) * self.span, n)  # first whole step of this run
        # the head: what is left of [frontier, h), as intervals
        lo = np.r_[self.frontier, ahead[:, 1]].astype(np.int64)
        hi = np.r_[ahead[:, 0], self.h].astype(np.int64)
        keep = hi > lo
        self.head_lo, self.head_len = lo[keep], (hi - lo)[keep]
        self.head_cum = np.concatenate([[0], np.cumsum(self.head_len)]).astype(np.int64)
        self.head_n = int(self.head_cum[-1])
        self.head_size = -(-self.head_n // w)
        self.full = (n - self.h) // self.span
        self.tail_lo = self.h + self.full * self.span
        self.tail = n - self.tail_lo
        self.tail_size = -(-self.tail // w)
        self.body_end = self.head_size + self.full * self.share
        # the head in steps of at most ``share`` (a far-ahead rank leaves a long head)
        sizes = [self.share] * (self.head_size // self.share)
        sizes += [self.head_size % self.share] if self.head_size % self.share else []
        sizes += [self.share] * self.full + ([self.tail_size] if self.tail_size else [])
        self.unit_sizes = np.asarray(sizes, dtype=np.int64)
        self.unit_start = np.concatenate([[0], np.cumsum(self.unit_sizes)]).astype(np.int64)
        self.per_rank = int(self.unit_start[-1])
        self.repeats = w * (self.head_size + self.tail_size) - self.head_n - self.tail

    @property
    def num_units(self) -> int:
        return len(self.unit_sizes)

    def _chunk(self, n: int, rank: int) -> tuple[int, int]:
        lo = rank * n // self.world_size
        return lo, (rank + 1) * n // self.world_size - lo

    def _head_at(self, idx: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.head_cum, idx, side="right") - 1
        return self.head_lo[k] + (idx - self.head_cum[k])

    def positions(self, rank: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Global positions of ``rank``'s stream indices [start, stop) (padding repeats a sample
        of the same chunk, else of the head or tail)."""
        stop = self.per_rank if stop is None else min(int(stop), self.per_rank)
        k = np.arange(int(start), stop, dtype=np.int64)
        out = np.empty(len(k), dtype=np.int64)
        hs, tb = self.head_size, self.body_end
        sel = k < hs
        if sel.any():
            lo, cnt = self._chunk(self.head_n, rank)
            idx = lo + np.minimum(k[sel], max(cnt - 1, 0))
            out[sel] = self._head_at(np.minimum(idx, self.head_n - 1))
        sel = (k >= hs) & (k < tb)
        if sel.any():
            step, off = np.divmod(k[sel] - hs, self.share)
            out[sel] = self.h + step * self.span + self._in_step(rank * self.share + off)
        sel = k >= tb
        if sel.any():
            lo, cnt = self._chunk(self.tail, rank)
            idx = lo + np.minimum(k[sel] - tb, max(cnt - 1, 0))
            out[sel] = self.tail_lo + np.minimum(idx, self.tail - 1)
        return out

    def _in_step(self, offset: np.ndarray) -> np.ndarray:
        """Offset inside a step (its ``group`` rounds taken bin by bin: bin 0's samples of every
        round, then bin 1's...) -> offset from the step's first position. With one round per
        step this is the identity; with several, a rank's chunk still covers C / W (+ 1) bins."""
        if self.group == 1:
            return offset
        m = self.order.micro_batch
        c, q = np.divmod(offset, self.group * m)
        t, i = np.divmod(q, m)
        return t * self.order.window + c * m + i

    def unit_positions(self, rank: int, unit: int) -> np.ndarray:
        """Global positions of one unit (step) of ``rank``."""
        return self.positions(rank, int(self.unit_start[unit]), int(self.unit_start[unit + 1]))

    def intervals(self, rank: int, start: int, stop: int) -> np.ndarray:
        """The global positions of ``rank``'s stream indices [start, stop) as (k, 2) intervals
        (padding left out: it repeats positions of the same range); O(steps), not O(samples)."""
        out = [np.zeros((0, 2), np.int64)]
        hs, tb = self.head_size, self.body_end
        a, b = max(start, 0), min(stop, hs)
        if a < b:
            lo, cnt = self._chunk(self.head_n, rank)
            i0, i1 = lo + a, lo + min(b, cnt)
            if i0 < i1:
                k0 = np.searchsorted(self.head_cum, i0, side="right") - 1
                k1 = np.searchsorted(self.head_cum, i1 - 1, side="right") - 1
                ks = np.arange(k0, k1 + 1)
                base = self.head_lo[ks] - self.head_cum[ks]
                lo_k = np.maximum(self.head_cum[ks], i0) + base
                hi_k = np.minimum(self.head_cum[ks + 1], i1) + base
                out.append(np.stack([lo_k, hi_k], axis=1))
        a, b = max(start, hs), min(stop, tb)
        if a < b and self.group > 1:  # bin-major steps: runs of consecutive positions
            p = np.sort(self.positions(rank, a, b))
            cut = np.flatnonzero(np.diff(p) != 1) + 1
            out.append(np.stack([p[np.r_[0, cut]], p[np.r_[cut - 1, len(p) - 1]] + 1], axis=1))
        elif a < b:
            steps = np.arange((a - hs) // self.share, (b - 1 - hs) // self.share + 1)
            first = hs + steps * self.share  # stream index where each step starts
            base = self.h + steps * self.span + rank * self.share
            lo_s = base + np.maximum(a - first, 0)
            hi_s = base + np.minimum(b - first, self.share)
            out.append(np.stack([lo_s, hi_s], axis=1))
        a, b = max(start, tb), min(stop, self.per_rank)
        if a < b:
            lo, cnt = self._chunk(self.tail, rank)
            i0, i1 = lo + (a - tb), lo + min(b - tb, cnt)
            if i0 < i1:
                out.append(np.array([[self.tail_lo + i0, self.tail_lo + i1]], np.int64))
        return np.concatenate(out)
