"""Exact dataset quantiles from a histogram over a known range, then one selection pass.

When the range of a feature's values is known before its rows are read (``repair`` knows it
from the episodes' own min and max), one pass can count every dimension's values in
:data:`BINS` equal bins (numpy's histogram, whose counts are exact against its edges) with
those below the range, above it and NaN apart: a rank summary with no rank error, a few
KiB, whatever the frames. :func:`exact_from_counts` then brackets each wanted order statistic
by one bin and selects it exactly in a second pass over the data files
(:func:`~episodekit.metadata.stats.select.exact_quantiles`): numpy's quantiles of the whole
data, bit for bit, at flat memory and without sorting a single episode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from episodekit.metadata.stats.blocks import feature_values
from episodekit.metadata.stats.scan import file_batches
from episodekit.metadata.stats.select import (
    REFINE_CANDIDATES,
    brackets,
    exact_quantiles,
    select_candidates,
)
from episodekit.metadata.stats.sketch import FeatureStats, Sketch

BINS = 4096  # per dimension: a bracket holds about 1/4096 of the values of smooth data


@dataclass
class RangeCounts:
    """One feature's values counted per dimension: ``counts`` (D, BINS) in the bins of
    ``edges`` (D, BINS + 1; numpy's rule: each bin ``[e_b, e_b+1)``, the last one closed),
    and per dimension those below the first edge, above the last, NaN, and the least and
    greatest value seen."""

    ranges: list[tuple[float, float]]
    edges: np.ndarray
    counts: np.ndarray
    below: np.ndarray
    above: np.ndarray
    nan: np.ndarray
    least: np.ndarray
    greatest: np.ndarray

    @classmethod
    def over(cls, lo: np.ndarray, hi: np.ndarray, bins: int = BINS) -> RangeCounts:
        """Empty counts over ``[lo, hi]`` per dimension (finite; a point range is widened as
        numpy widens it)."""
        ranges = [(float(a), float(b)) for a, b in zip(lo, hi)]
        empty = np.zeros(0, np.float64)  # float64 edges, as add() counts float64 values
        edges = np.stack([np.histogram_bin_edges(empty, bins, r) for r in ranges])
        d = len(ranges)
        zeros = np.zeros(d, np.int64)
        return cls(
            ranges,
            edges,
            np.zeros((d, bins), np.int64),
            zeros.copy(),
            zeros.copy(),
            zeros.copy(),
            np.full(d, np.inf),
            np.full(d, -np.inf),
        )

    @property
    def total(self) -> int:
        """Values counted per dimension (the rows)."""
        if not len(self.edges):
            return 0
        return int(self.counts[0].sum() + self.below[0] + self.above[0] + self.nan[0])

    def add(self, x: np.ndarray) -> None:
        """Count the rows of ``x`` (rows, D), in any numeric dtype (compared as float64)."""
        if not len(x):
            return
        for j in range(x.shape[1]):
            col = x[:, j].astype(np.float64)
            e = self.edges[j]
            c, _ = np.histogram(col, bins=len(e) - 1, range=self.ranges[j])  # uniform: fast
            self.counts[j] += c
            kept = int(c.sum())
            if kept < len(col):
                nan = int(np.isnan(col).sum())
                below = int((col < e[0]).sum())
                self.nan[j] += nan
                self.below[j] += below
                self.above[j] += len(col) - kept - nan - below
            if kept + self.below[j] + self.above[j]:
                self.least[j] = min(self.least[j], np.nanmin(col))
                self.greatest[j] = max(self.greatest[j], np.nanmax(col))

    def merge(self, other: RangeCounts) -> None:
        """Add ``other``'s counts (the same edges: another file's)."""
        if not np.array_equal(self.edges, other.edges):
            raise ValueError("range counts over different edges")
        for k in ("counts", "below", "above", "nan"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.least = np.minimum(self.least, other.least)
        self.greatest = np.maximum(self.greatest, other.greatest)

    def sketches(self) -> list[Sketch]:
        """Per dimension, the counts as a rank summary with no rank error: each bin's count
        at the greatest float64 value it holds (the last bin is closed), those below the
        range at the one before its first edge, those above at +inf."""
        out = []
        for j in range(len(self.edges)):
            e = self.edges[j]
            values = np.concatenate(
                [[np.nextafter(e[0], -np.inf)], np.nextafter(e[1:-1], -np.inf), [e[-1], np.inf]]
            )
            weights = np.concatenate([[self.below[j]], self.counts[j], [self.above[j]]])
            keep = weights > 0
            out.append(Sketch(values[keep], weights[keep].astype(np.float64), 0.0))
        return out


THREADS = 2  # numpy's comparisons release the GIL: a second core selects too


def _groups(dims: dict[str, int], parts: int) -> list[list[str]]:
    """The features split into ``parts`` groups of about equal dimensions (largest first)."""
    groups: list[list[str]] = [[] for _ in range(parts)]
    load = [0] * parts
    for name in sorted(dims, key=lambda n: -dims[n]):
        i = load.index(min(load))
        groups[i].append(name)
        load[i] += dims[name]
    return [g for g in groups if g]


def threaded(
    batches: Iterable[pa.Table],
    dims: dict[str, int],
    work: Callable[[str, np.ndarray], None],
    threads: int = THREADS,
) -> Iterator[pa.Table]:
    """Yield ``batches`` as they come, and call ``work(feature, values)`` for each feature of
    ``dims`` (name -> dimensions) on each, in ``threads`` threads (the features split between
    them) while the caller reads the next batch; a feature's calls come in batch order."""
    groups = _groups(dims, threads)

    def run(names: list[str], batch: pa.Table) -> None:
        for name in names:
            work(name, feature_values(batch.column(name), dims[name], name))

    arrow_pool = pa.default_memory_pool()
    with ThreadPoolExecutor(max(len(groups), 1)) as pool:
        pending: list = []
        for batch in batches:
            yield batch
            for f in pending:
                f.result()
            pending = [pool.submit(run, g, batch) for g in groups]
            batch = None
            arrow_pool.release_unused()  # the batch before's decode buffers: RSS at one batch
        for f in pending:
            f.result()
    pa.default_memory_pool().release_unused()  # the decode buffers kept for the next batch


def counted(batches: Iterable[pa.Table], counts: dict[str, RangeCounts]) -> Iterator[pa.Table]:
    """Yield ``batches`` as they come, each counted into ``counts`` (feature -> counts of its
    column) by :func:`threaded` while the caller reads the next batch."""
    dims = {n: len(rc.edges) for n, rc in counts.items()}
    return threaded(batches, dims, lambda name, x: counts[name].add(x))


def _open_bounds(lo: np.ndarray, hi: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, ...]:
    """``lo < x < hi`` (float64 bounds) as ``a <= x <= b`` in float32, where ``x`` is float32:
    compared without widening a copy of the column."""
    a = lo.astype(np.float32)
    a = np.where(a.astype(np.float64) <= lo, np.nextafter(a, np.float32(np.inf)), a)
    b = hi.astype(np.float32)
    b = np.where(b.astype(np.float64) >= hi, np.nextafter(b, np.float32(-np.inf)), b)
    return a.astype(dtype), b.astype(dtype)


COMPACT = 1 << 16  # candidates held raw before they are run-length encoded together


class _Inside:
    """One feature's candidates: the values strictly inside each quantile's bracket, held
    run-length encoded (distinct quantile, dimension, value and a count) once more than
    :data:`COMPACT` (then twice as many as the last encoding left) are held: a dimension of
    few values (``frame_index``, ``task_index``: ties) fills its brackets with every frame,
    ~2.4 million values at a million frames (~60 MB with their copies) that are a few
    entries encoded."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray):
        self.lo, self.hi = lo, hi
        self.bounds: tuple[np.ndarray, np.ndarray] | None = None
        self.found: list[tuple[np.ndarray, ...]] = []
        self.held = 0
        self.limit = COMPACT

    def add(self, x: np.ndarray) -> None:
        d = x.shape[1]
        if x.dtype == np.float32:
            if self.bounds is None:
                self.bounds = _open_bounds(self.lo, self.hi, x.dtype)
            a, b = self.bounds
            masks = ((x >= a[i]) & (x <= b[i]) for i in range(len(a)))
        else:
            x = x.astype(np.float64)
            masks = ((x > self.lo[i]) & (x < self.hi[i]) for i in range(len(self.lo)))
        for i, mask in enumerate(masks):
            flat = np.flatnonzero(mask)
            if len(flat):
                qi = np.full(len(flat), i, dtype=np.int8)
                dim = (flat % d).astype(np.int32)
                val = x.reshape(-1)[flat].astype(np.float64)
                self.found.append((qi, dim, val, np.ones(len(flat), np.int64)))
                self.held += len(flat)
        if self.held > self.limit:
            self._compact()
            self.limit = max(COMPACT, 2 * self.held)

    def _compact(self) -> None:
        """Every candidate held as distinct (quantile, dimension, value) with its count."""
        qi, dim, val, cnt = (np.concatenate([f[k] for f in self.found]) for k in range(4))
        self.found = []
        order = np.lexsort((val, dim, qi))
        qi, dim, val, cnt = qi[order], dim[order], val[order], cnt[order]
        new = np.concatenate(
            [[True], (qi[1:] != qi[:-1]) | (dim[1:] != dim[:-1]) | (val[1:] != val[:-1])]
        )
        starts = np.flatnonzero(new)
        self.found = [(qi[starts], dim[starts], val[starts], np.add.reduceat(cnt, starts))]
        self.held = len(starts)

    def candidates(self) -> tuple[np.ndarray, ...]:
        """(quantile, dimension, value, count) of every distinct candidate."""
        if not self.found:
            return (np.zeros(0, np.int8), np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int64))
        self._compact()
        return self.found[0]


def exact_from_counts(
    root: str,
    rels: list[str],
    counts: dict[str, RangeCounts],
    batch_rows: int = 65_536,
    windows: dict | None = None,
) -> dict[str, np.ndarray]:
    """Exact quantiles (5 x D, numpy's linear rule) of each feature of ``counts`` over the
    data files ``rels`` of ``root``, the files ``counts`` counted, by one selection pass over
    them in this process: the counts bracket each order statistic by a bin (and say how many
    values lie below it), the pass gathers the values inside. A feature with NaN values is
    left out (the caller decides); one whose brackets hold too many values (a few distinct
    values: ties) is selected by :func:`~episodekit.metadata.stats.select.exact_quantiles`,
    which narrows first. ``windows``: relative path -> salvage and template of the files
    read a window of row groups at a time
    (:func:`~episodekit.metadata.stats.scan.file_batches`)."""
    dataset: dict[str, FeatureStats] = {}
    for name, rc in counts.items():
        if rc.nan.any() or not rc.total:
            continue
        d = len(rc.edges)
        zeros = np.zeros(d)
        dataset[name] = FeatureStats(rc.total, float(rc.total), zeros, zeros, rc.least,
                                     rc.greatest, np.zeros((5, d)), rc.sketches())  # fmt: skip
    brs = {n: brackets(fs) for n, fs in dataset.items()}
    crowded = {n: len(fs.sketches) for n, fs in dataset.items() if brs[n][4] > REFINE_CANDIDATES}
    if crowded:
        exact_quantiles(root, rels, crowded, {n: dataset[n] for n in crowded}, "local", 1,
                        batch_rows, windows)  # fmt: skip
    inside = {n: _Inside(b[0], b[1]) for n, b in brs.items() if n not in crowded}
    dims = {n: len(dataset[n].sketches) for n in inside}
    for rel in rels if dims else []:
        parts = file_batches(root, rel, list(dims), batch_rows, True, (windows or {}).get(rel))
        for _ in threaded(parts, dims, lambda name, x: inside[name].add(x)):
            pass
    for name, found in inside.items():
        fs, br = dataset[name], brs[name]
        below = np.zeros(br[0].shape, np.int64)
        for j, s in enumerate(fs.sketches):  # values <= lo: the counts say (no rank error)
            cum = np.concatenate([[0], np.cumsum(s.weights)])
            below[:, j] = cum[np.searchsorted(s.values, br[0][:, j], side="right")]
        select_candidates(fs, br, below, found.candidates())
    return {n: fs.quantiles for n, fs in dataset.items()}
