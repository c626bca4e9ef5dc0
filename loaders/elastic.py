"""Elastic resume: stop a run on W ranks, resume it on W', every sample of the epoch exactly once.

The epoch's order does not depend on the world size. It is built from a canonical plan
(:mod:`episodekit.metadata.plans.canonical`: ``C`` bins, ``S`` samples each after the plan's
policy):

- **Bin streams.** Bin ``c``'s stream is the locality-aware pool order of
  :class:`~episodekit.loaders.sharded.BinOrder`, a pure function of (seed, epoch, c, pool rows):
  whichever rank reads the bin, its ``j``-th sample is the same frame.
- **Global sequence** (:class:`GlobalOrder`). Round ``t`` takes ``m`` (``micro_batch``) samples
  of every bin, bin 0 first: global position ``g = t * C * m + c * m + i`` is sample
  ``t * m + i`` of bin ``c``. A round (``C * m`` samples) is the **step window**: one training
  step of the whole job (global batch ``C * m``). ``S`` is rounded to a multiple of ``m``
  (``trim`` down, ``wrap`` up).
- **A run's share** (:class:`RunLayout`). A run of ``W`` ranks cuts each step window into ``W``
  contiguous chunks; rank ``r`` yields chunk ``r`` of every window as one batch (one step). When
  ``W`` divides ``C``, rank ``r`` reads bins ``[r C / W, (r + 1) C / W)`` (file order, so the
  row-group locality of the plan is kept). Fallback when ``W`` does not divide ``C * m``: a
  step spans ``g = W / gcd(W, C m)`` rounds (the smallest whole number of rounds ``W`` divides),
  taken bin by bin (bin 0's samples of the g rounds, then bin 1's...) and cut into ``W``
  chunks, so a rank still reads ``C / W + 1`` bins at most; an epoch's last partial group is
  padded to equal counts. Every rank yields the same number of samples. DataLoader workers of
  a rank take its steps in turn (worker ``w`` yields steps ``w, w + K, ...``), which is the
  order ``DataLoader`` hands batches out in, so the worker count never changes a step.
- **Global position** (the state). What the whole job consumed is the set of global positions
  below ``frontier`` plus intervals ``ahead`` of it (ranks stopped at different points; one
  interval per step a rank is ahead, never one entry per sample). Each rank's
  :meth:`ElasticLoader.state_dict` says what it consumed of its own stream (ranges of its stream
  indices) and where its run started (``frontier``/``ahead``, the same on every rank);
  :func:`merge_states` turns the per-rank states into one global state.
- **Resume on any world size.** :meth:`ElasticLoader.load_state_dict` rebuilds the run from the
  global state: the rest of a partly consumed step window (the *head*) is cut into ``W'`` chunks
  as evenly as possible, then whole windows follow as above. A stop on a step boundary (what DDP
  gives: every rank consumed the same number of steps) leaves no head, so the union over the
  ranks of before and after is exactly the epoch, with equal samples per rank. A head that
  ``W'`` does not divide is padded to equal counts by repeating samples of the head (reported by
  :attr:`RunLayout.repeats`; at most ``W' - 1`` per resume): DDP needs equal counts more than it
  needs the last few samples unique.

Resuming is arithmetic on positions (O(window + ranks)); no data is read to find the place, and
bin orders are built only for the bins a rank reads.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.core.world import fill_rank
from episodekit.loaders.elastic_order import GlobalOrder, RunLayout, union
from episodekit.loaders.elastic_state import (
    STATE_FORMAT,
    STATE_VERSION,
    ElasticStateError,
    all_gather_states,
    merge_ranges,
    merge_states,
    resume_point,
    unit_done,
)
from episodekit.loaders.frames import RootFrameDataset
from episodekit.loaders.options import DEFAULT_TOLERANCE_S, ReadOptions
from episodekit.loaders.reader import DEFAULT_CACHE_MB
from episodekit.loaders.sampler import feistel_permute
from episodekit.loaders.sharded import BinLayout, BinOrder, row_bytes_estimate, torch_worker

__all__ = [
    "ElasticLoader",
    "ElasticStateError",
    "GlobalOrder",
    "RunLayout",
    "all_gather_states",
    "bin_frames",
    "merge_states",
    "union",
]

LOOKAHEAD = 1024  # samples of a bin's stream computed at once (see ElasticLoader.frames_of)
DEFAULT_POOL_ROWS = 262_144  # rows per pool of a canonical bin (a few prepared row groups)


def bin_frames(order: BinOrder, samples: np.ndarray) -> np.ndarray:
    """Global frames of samples ``samples`` of one bin's stream (pointwise :meth:`BinOrder.parts`:
    samples from ``order.total`` on repeat the last pool's order)."""
    j = np.asarray(samples, dtype=np.int64)
    last = order.num_pools - 1
    g_last = int(order.pool_cum[last])
    n_last = order.total - g_last
    q = np.where(j >= order.total, g_last + (j - order.total) % max(n_last, 1), j)
    pool = np.searchsorted(order.pool_cum, q, side="right") - 1
    pool = np.minimum(pool, last)
    out = np.empty(len(q), dtype=np.int64)
    for p in np.unique(pool).tolist():
        sel = pool == p
        g0 = int(order.pool_cum[p])
        n = int(order.pool_cum[p + 1]) - g0
        out[sel] = feistel_permute(q[sel] - g0, n, order.keys[p]) + g0
    slot = np.searchsorted(order.item_cum, out, side="right") - 1
    return order.base[slot] + (out - order.item_cum[slot])


# ---------------------------------------------------------------------------------------------
# The loader


class ElasticLoader:
    """Stream one rank's share of the epoch of a canonical plan; resumable on any world size.

    ``plan``: a canonical plan (None: ``load_canonical_plan(root)``). ``rank``/``world_size``
    default to torch.distributed, else RANK/WORLD_SIZE. Each iteration yields one batch (a dict
    like ``FrameDataset.get_batch``) per step: the rank's chunk of the step window, ``C * m /
    world_size`` samples (``micro_batch`` = ``m``). In a torch DataLoader worker (or with
    ``worker``/``num_workers``) only steps ``worker, worker + num_workers, ...`` are yielded.
    ``pool_rows`` sets each canonical bin's pool (it is part of the order: keep it across
    resumes). Reads go through the frame store when one is fresh (recommended: a rank reads
    ``m`` samples of each of its bins per step).
    """

    def __init__(
        self,
        root: str | os.PathLike | Dataset,
        plan: Any | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        micro_batch: int = 1,
        seed: int = 0,
        worker: int | None = None,
        num_workers: int | None = None,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        pool_rows: int = DEFAULT_POOL_ROWS,
        speed: bool | str = True,
        video_backend: Any = "auto",
        store: Any = "auto",
    ):
        from episodekit.metadata.plans.canonical import is_canonical, load_canonical_plan

        ds = as_dataset(root)
        rank, world_size = fill_rank(rank, world_size)
        if plan is None:
            plan = load_canonical_plan(ds)
        if not is_canonical(plan):
            raise ValueError(
                f"ElasticLoader needs a canonical plan (episodekit metadata plan {ds.root} "
                "--canonical-bins auto; load it with load_canonical_plan)"
            )
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        if int(pool_rows) < 1:
            raise ValueError(f"pool_rows must be >= 1, got {pool_rows}")
        if num_workers is not None and int(num_workers) < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if worker is not None and not 0 <= int(worker) < int(num_workers or 1):
            raise ValueError(f"worker {worker} is not in [0, num_workers={num_workers or 1})")
        self.plan, self.rank, self.world_size = plan, int(rank), int(world_size)
        self.seed, self.pool_rows = int(seed), int(pool_rows)
        self.worker, self.num_workers = worker, num_workers
        self.order = GlobalOrder(plan.num_bins, plan.samples_per_worker, micro_batch, plan.policy)
        options = ReadOptions(
            delta_timestamps, tolerance_s, cache_mb, speed, video_backend=video_backend,
            store=store,
        )  # fmt: skip
        self.frames = RootFrameDataset.open(ds, options)
        self._ds = ds
        if self.frames.store is None:
            self._warn_cache(plan, cache_mb)
        self._layouts: dict[int, BinLayout] = {}
        self._orders: dict[tuple[int, int], BinOrder] = {}
        self._tables: dict[tuple[int, int], list] = {}  # (epoch, block) -> [rows, table]
        self.epoch = 0
        self._start(0, 0, None)

    def _warn_cache(self, plan: Any, cache_mb: float) -> None:
        """Without a frame store every step reads all of this rank's bins: their row groups
        must stay resident, or each step decodes them again. Warn once when they cannot."""
        c, w, r = plan.num_bins, self.world_size, self.rank
        lo, hi = r * c // w, min(c, -(-(r + 1) * c // w) + 1)
        rows = int(plan.bin_frames()[lo:hi].sum())
        need = rows * row_bytes_estimate(self._ds, self.frames.reader.columns) / 2**20
        if need > cache_mb:
            warnings.warn(
                f"ElasticLoader rank {r}: a step reads all of its ~{need:,.0f} MiB of decoded "
                f"rows and cache_mb={cache_mb:g} is smaller, so steps would decode row groups "
                f"again; build the frame store (episodekit prep frames {self._ds.root}) or "
                f"pass cache_mb >= {need * 1.25:,.0f}",
                stacklevel=3,
            )

    # -- identity and position ----------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What a state must match to be resumed here."""
        return {
            "plan": self.plan.digest,
            "seed": self.seed,
            "canonical_bins": self.order.num_bins,
            "samples_per_bin": self.order.samples_per_bin,
            "micro_batch": self.order.micro_batch,
            "pool_rows": self.pool_rows,
        }

    def _start(self, epoch: int, frontier: int, ahead: Any) -> None:
        self.epoch = int(epoch)
        self.run = RunLayout(self.order, self.world_size, frontier, ahead)
        self.consumed: list[tuple[int, int]] = []
        self.steps_done: list[int] | None = None  # [first, stride, count] of units yielded
        self._restored: tuple[list, list[int] | None] = ([], None)  # the record at load time

    def __len__(self) -> int:
        """Samples this rank yields in the current run of the epoch (equal on every rank)."""
        return self.run.per_rank

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (a no-op when already in it, e.g. after resume)."""
        if int(epoch) != self.epoch:
            self._start(epoch, 0, None)

    def start_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning, even when already in it (a fresh run)."""
        self._start(epoch, 0, None)

    def units(self) -> list[int]:
        """The steps (units of this rank's stream) this process yields, in order."""
        n = self.run.num_units
        if self.worker is not None:
            return list(range(int(self.worker), n, int(self.num_workers or 1)))
        tw = torch_worker()
        if tw is not None:
            return list(range(tw[0], n, tw[1]))
        return list(range(n))

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: the plan identity, the epoch, where this run started (the whole
        job's position then: ``frontier`` and ``ahead``, global positions), the run's world size
        and this rank, ``consumed``: ranges of this rank's stream yielded so far, and ``steps``:
        [first, stride, count], the units (steps) this process yielded in order (a DataLoader
        worker's are strided: O(1) however long the epoch). Merge
        the states of all ranks with :func:`merge_states` (or pass them all to
        :meth:`load_state_dict`)."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            **self.identity(),
            "epoch": self.epoch,
            "frontier": self.run.frontier,
            "ahead": self.run.ahead.tolist(),
            "world_size": self.world_size,
            "rank": self.rank,
            "consumed": [list(r) for r in self.consumed],
            "steps": list(self.steps_done) if self.steps_done else [],
        }

    def state_at(self, steps: int) -> dict[str, Any]:
        """This rank's state after ``steps`` batches were consumed since the loader started or
        was last loaded (what a training loop counts; prefetching DataLoaders read ahead of
        it): the next ``steps`` steps not done at that point, in order."""
        consumed, done = self._restored
        state = self.state_dict()
        todo = [u for u in range(self.run.num_units) if not unit_done(self.run, u, consumed, done)]
        take = np.asarray(todo[: max(int(steps), 0)], dtype=np.int64)
        units = np.stack([self.run.unit_start[take], self.run.unit_start[take + 1]], axis=1)
        state["consumed"] = [
            list(r) for r in merge_ranges(np.concatenate([np.reshape(consumed, (-1, 2)), units]))
        ]
        state["steps"] = list(done) if done else []
        return state

    def load_state_dict(self, state: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """Resume from a global state (:func:`merge_states`), a list of every rank's states, or
        this rank's own state of a run of the same world size (that run continues as it was).
        Raises :class:`ElasticStateError` for a state of another plan, seed, pool size or
        micro-batch, and for one rank's state of a run of another size."""
        epoch, frontier, ahead, consumed, steps = resume_point(
            state, self.identity(), self.order, self.world_size, self.rank
        )
        if frontier >= self.order.total:  # the epoch was finished: the next one starts
            epoch, frontier, ahead, consumed, steps = epoch + 1, 0, None, [], None
        self._start(epoch, frontier, ahead)
        self.consumed, self.steps_done = consumed, steps
        self._restored = (list(consumed), list(steps) if steps else None)

    # -- the order ----------------------------------------------------------------------------

    def _bin_order(self, epoch: int, c: int) -> BinOrder:
        key = (epoch, c)
        order = self._orders.get(key)
        if order is None:
            if len(self._orders) > 4 * self.order.num_bins:
                self._orders.clear()
            layout = self._layouts.get(c)
            if layout is None:
                ds, reader = self._ds, self.frames.reader
                layout = BinLayout(
                    self.plan.bin_items(c, 0),
                    ds.column("episode_index"),
                    ds.column("length"),
                    ds.column("dataset_from_index"),
                    reader.rg_start,
                    reader.rg_rows,
                )
                self._layouts[c] = layout
            order = self._orders[key] = BinOrder(layout, self.seed, epoch, c, self.pool_rows)
        return order

    def frames_of(self, positions: np.ndarray, epoch: int | None = None) -> np.ndarray:
        """Global frame indices of global positions of ``epoch`` (default: the current one).

        A step takes ``m`` consecutive samples of each of its bins, so bin streams are computed
        ``LOOKAHEAD`` samples at a time into a table (a row per bin read, 8 bytes a sample) and
        a step is one vectorized gather from it."""
        epoch = self.epoch if epoch is None else int(epoch)
        c, j = self.order.locate(positions)
        block = j // LOOKAHEAD
        blocks = np.unique(block)
        if len(blocks) > 2:  # a wide request (a head): evaluate bin by bin, no table
            out = np.empty(len(c), dtype=np.int64)
            by_bin = np.argsort(c, kind="stable")
            bins, starts = np.unique(c[by_bin], return_index=True)
            for b, idx in zip(bins.tolist(), np.split(by_bin, starts[1:])):
                out[idx] = bin_frames(self._bin_order(epoch, b), j[idx])
            return out
        out = np.empty(len(c), dtype=np.int64)
        for blk in blocks.tolist():
            sel = block == blk
            rows, table = self._table(epoch, blk, np.unique(c[sel]))
            out[sel] = table[rows[c[sel]], j[sel] - blk * LOOKAHEAD]
        return out

    def _table(self, epoch: int, block: int, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each bin, table) of samples [block * LOOKAHEAD, ...) of ``bins``' streams;
        the two most recent blocks are kept."""
        key = (epoch, block)
        entry = self._tables.get(key)
        if entry is None:
            if len(self._tables) >= 2:
                self._tables.pop(next(iter(self._tables)))
            rows = np.full(self.order.num_bins, -1, dtype=np.int64)
            entry = self._tables[key] = [rows, np.zeros((0, LOOKAHEAD), np.int64)]
        rows, table = entry
        missing = bins[rows[bins] < 0]
        if len(missing):
            lo = block * LOOKAHEAD
            js = np.arange(lo, min(lo + LOOKAHEAD, self.order.samples_per_bin))
            new = np.zeros((len(missing), LOOKAHEAD), np.int64)
            for k, b in enumerate(missing.tolist()):
                new[k, : len(js)] = bin_frames(self._bin_order(epoch, b), js)
            rows[missing] = len(table) + np.arange(len(missing))
            table = entry[1] = np.concatenate([table, new])
        return rows, table

    def epoch_positions(self) -> np.ndarray:
        """Every global position this process yields in the current run, in order (tests)."""
        parts = [self.run.unit_positions(self.rank, u) for u in self.units()]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        run = self.run
        if all(self._done(u) for u in range(run.num_units)):  # the run was finished
            self._start(self.epoch + 1, 0, None)
            run = self.run
        epoch = self.epoch
        units = self.units()
        stride = units[1] - units[0] if len(units) > 1 else 1
        for u in units:
            if self._done(u):
                continue
            lo, hi = int(run.unit_start[u]), int(run.unit_start[u + 1])
            batch = self.unit_batch(u, epoch)
            sd = self.steps_done
            if sd is None:
                self.steps_done = [u, stride, 1]
            elif u == sd[0] + sd[1] * sd[2]:
                sd[2] += 1
            else:
                self.consumed = merge_ranges([*self.consumed, (lo, hi)])
            yield batch
            if self.run is not run:  # load_state_dict/set_epoch while iterating
                return

    def unit_batch(self, unit: int, epoch: int | None = None) -> dict[str, Any]:
        """The batch of ``unit`` (a step) of this rank's current run; no record changes."""
        run = self.run
        lo, hi = int(run.unit_start[unit]), int(run.unit_start[unit + 1])
        return self.frames.get_frames(self.frames_of(run.positions(self.rank, lo, hi), epoch))

    def pending_units(self) -> list[int]:
        """The units (steps) of the current run not consumed yet by this process's record."""
        return [u for u in range(self.run.num_units) if not self._done(u)]

    def max_unit_rows(self) -> int:
        """The most samples a unit (batch) of the current run has."""
        return int(np.diff(self.run.unit_start).max(initial=1))

    def _done(self, unit: int) -> bool:
        """Whether ``unit`` of the current run was consumed (by this process's record)."""
        return unit_done(self.run, unit, self.consumed, self.steps_done)
