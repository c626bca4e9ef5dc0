"""Sharded streaming over a shard plan: ``ShardedLoader``, one (rank, worker) bin per reader.

Each (rank, worker) reads only its bin's items (``plan.bin_items``). An epoch is LeRobot's
streaming design made exact: the bin's episodes are grouped by the row groups that hold them
(*segments*: row groups joined by an episode that spans them), the segments are visited in a
seeded order, consecutive segments are gathered into a *pool* of whole episodes whose row groups
fit the cache (``cache_mb``), and the frames of each pool are mixed by a keyed bijection
(Feistel) before the next pool is read. So each row group is decoded at most once per epoch per
worker, and delta windows are exact (whole episodes are resident, so a window at a pool's edge is
the one ``FrameDataset[i]`` gives). With a ``rowgroup``-locality plan a bin is a contiguous run of
row groups, so a worker decodes about its own share of the data.

The order is a pure function of (plan, seed, epoch, bin, pool size); nothing is read to compute
it. Every bin yields exactly ``plan.samples_per_worker`` samples per epoch (``trim``: the tail of
the order is dropped; ``wrap``: the last pool's order is repeated, which needs no new decode),
hence ``samples_per_rank`` per rank. ``state_dict()`` is a few integers naming the plan, seed,
rank, worker and pool size it belongs to; resuming recomputes the order (not the data) and
continues at the exact sample.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.core.footer import read_footer
from episodekit.core.paths import MIB
from episodekit.core.words import plural
from episodekit.core.world import fill_rank
from episodekit.loaders.batch_dicts import batch_row, concat_batches, slice_batch  # noqa: F401
from episodekit.loaders.frames import RootFrameDataset
from episodekit.loaders.kinds import is_mixture_plan, looks_like_mixture, mixture_part
from episodekit.loaders.options import DEFAULT_TOLERANCE_S, ReadOptions
from episodekit.loaders.reader import DEFAULT_CACHE_MB
from episodekit.loaders.sampler import FEISTEL_ROUNDS, feistel_permute

READ_CHUNK = 256
ORDER_CHUNK = 65_536  # positions mapped per step of the order (bounds its temporaries)
STATE_KEYS = ("plan", "seed", "epoch", "position", "rank", "worker", "pool_rows")


def torch_worker() -> tuple[int, int] | None:
    """(worker id, num workers) in a torch DataLoader worker, else None; never imports torch."""
    if "torch" not in sys.modules:
        return None
    try:
        from torch.utils.data import get_worker_info
    except Exception:  # pragma: no cover - broken torch install
        return None
    info = get_worker_info()
    return None if info is None else (int(info.id), int(info.num_workers))


class BinLayout:
    """One bin's items as global frame ranges, with the row groups that hold their episodes.

    ``segments``: items grouped so that no two groups share a row group (an item needs all row
    groups of its whole episode); ``seg_rgs[j]`` lists segment ``j``'s row groups.
    """

    def __init__(
        self,
        items: np.ndarray,
        episode_index: np.ndarray,
        length: np.ndarray,
        first_frame: np.ndarray,
        rg_start: np.ndarray,
        rg_rows: np.ndarray,
    ):
        items = np.asarray(items, dtype=np.int64).reshape(-1, 3)
        k = np.searchsorted(episode_index, items[:, 0])
        km = np.minimum(k, max(len(episode_index) - 1, 0))
        if len(items) and (len(episode_index) == 0 or (episode_index[km] != items[:, 0]).any()):
            raise ValueError("plan references episodes not in the dataset (stale plan?)")
        n = length[km]
        if ((items[:, 1] < 0) | (items[:, 2] > n) | (items[:, 1] > items[:, 2])).any():
            raise ValueError("plan item frame ranges fall outside their episodes (stale plan?)")
        keep = items[:, 2] > items[:, 1]
        items, km = items[keep], km[keep]
        ep_lo = first_frame[km]
        ep_hi = ep_lo + np.maximum(length[km], 1)
        base, size = ep_lo + items[:, 1], items[:, 2] - items[:, 1]
        rg_lo = np.searchsorted(rg_start, ep_lo, side="right") - 1
        rg_hi = np.searchsorted(rg_start, ep_hi - 1, side="right") - 1
        order = np.lexsort((base, rg_lo))  # file order
        self.base, self.size = base[order], size[order]
        rg_lo, rg_hi = rg_lo[order], rg_hi[order]
        ep_lo, ep_hi = ep_lo[order], ep_hi[order]
        reach = np.maximum.accumulate(rg_hi) if len(rg_hi) else rg_hi
        new = np.r_[True, rg_lo[1:] > reach[:-1]] if len(rg_lo) else np.zeros(0, bool)
        self.segment = np.cumsum(new) - 1  # per item
        starts = np.flatnonzero(new)
        ends = np.r_[starts[1:], len(rg_lo)]
        self.seg_items = np.stack([starts, ends], axis=1)  # item range of each segment
        first = rg_lo[starts] if len(starts) else np.zeros(0, np.int64)
        last = np.array([reach[e - 1] for e in ends.tolist()], dtype=np.int64)
        self.seg_rgs = [np.arange(a, b + 1) for a, b in zip(first.tolist(), last.tolist())]
        self.seg_rows = np.array(
            [int(rg_rows[r].sum()) for r in self.seg_rgs], dtype=np.int64
        ).reshape(-1)
        # the frames each segment's episodes cover, [hull_lo, hull_hi): a row group shared with
        # another bin is decoded only as far as this bin needs (see BinOrder.need_of_segments)
        none = np.zeros(0, np.int64)
        self.hull_lo = np.minimum.reduceat(ep_lo, starts) if len(starts) else none
        self.hull_hi = np.maximum.reduceat(ep_hi, starts) if len(starts) else none
        self.rg_start, self.rg_rows = rg_start, rg_rows
        self.total = int(self.size.sum())


class BinOrder:
    """The order of one bin for one epoch: natural position -> global frame, pool by pool.

    Segments are permuted with a generator seeded by (seed, epoch, bin); consecutive segments
    form a pool while their row groups hold at most ``pool_rows`` rows (a larger segment is a pool
    of its own); each pool's frames are permuted by a keyed Feistel bijection.
    """

    def __init__(self, layout: BinLayout, seed: int, epoch: int, bin_id: int, pool_rows: int):
        rng = np.random.default_rng([int(seed), int(epoch), int(bin_id), 0x5EED])
        perm = rng.permutation(len(layout.seg_rgs))
        pools: list[list[int]] = []
        rows = 0
        for s in perm.tolist():
            r = int(layout.seg_rows[s])
            if not pools or rows + r > pool_rows:
                pools.append([])
                rows = 0
            pools[-1].append(s)
            rows += r
        self.pool_rgs = [
            np.concatenate([layout.seg_rgs[s] for s in p]) if p else np.zeros(0, np.int64)
            for p in pools
        ]
        item_order = [np.arange(*layout.seg_items[s]) for p in pools for s in p]
        idx = np.concatenate(item_order) if item_order else np.zeros(0, np.int64)
        self.base, self.size = layout.base[idx], layout.size[idx]
        self.item_segment = layout.segment[idx]
        self.seg_rgs, self.layout = layout.seg_rgs, layout
        self.item_cum = np.concatenate([[0], np.cumsum(self.size)]).astype(np.int64)
        self.total = int(self.item_cum[-1])
        per_pool = [
            sum(int(layout.seg_items[s][1] - layout.seg_items[s][0]) for s in p) for p in pools
        ]
        self.pool_cum = self.item_cum[np.concatenate([[0], np.cumsum(per_pool)]).astype(np.int64)]
        self.keys = rng.integers(0, 2**63, size=(len(pools), FEISTEL_ROUNDS), dtype=np.uint64)

    @property
    def num_pools(self) -> int:
        return len(self.pool_rgs)

    def parts(self, start: int, stop: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(pool, global frames, segments they need) for natural positions [start, stop) of the
        epoch; positions from ``total`` on repeat the last pool's order (``wrap``)."""
        if self.total == 0:
            return
        last = self.num_pools - 1
        g_last, n_last = int(self.pool_cum[last]), self.total - int(self.pool_cum[last])
        while start < stop:
            if start >= self.total:  # wrap: cycle through the last pool (resident, no decode)
                j, g0 = last, g_last
                local0 = (start - self.total) % n_last
                end = min(stop, start + (n_last - local0))
            else:
                j = int(np.searchsorted(self.pool_cum, start, side="right") - 1)
                g0 = int(self.pool_cum[j])
                local0 = start - g0
                end = min(stop, int(self.pool_cum[j + 1]))
            end = min(end, start + ORDER_CHUNK)  # bounded temporaries
            n = int(self.pool_cum[j + 1]) - g0
            local = feistel_permute(np.arange(local0, local0 + end - start), n, self.keys[j])
            q = local + g0  # a frame position among the epoch's concatenated items
            slot = np.searchsorted(self.item_cum, q, side="right") - 1
            yield j, self.base[slot] + (q - self.item_cum[slot]), np.unique(self.item_segment[slot])
            start = end

    def need_of_segments(self, segments: np.ndarray) -> tuple[np.ndarray, tuple]:
        """The row groups of some segments and, per row group, the local rows [lo, hi) their
        episodes cover (what ``RowGroupReader.hold`` decodes)."""
        segs = np.asarray(segments, dtype=np.int64)
        parts = [self.seg_rgs[s] for s in segs.tolist()]
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, (empty, empty)
        rgs = np.concatenate(parts)
        seg = np.repeat(segs, [len(p) for p in parts])
        lay = self.layout
        start = lay.rg_start[rgs]
        lo = np.maximum(lay.hull_lo[seg] - start, 0)
        return rgs, (lo, np.minimum(lay.hull_hi[seg] - start, lay.rg_rows[rgs]))


def row_bytes_estimate(ds: Dataset, columns: Mapping[str, tuple[int, ...]]) -> float:
    """Decoded bytes per row of ``columns``: exact for numeric features, from the first data
    file's footer (uncompressed bytes per row) for images and strings."""
    total, other = 0.0, []
    for name, shape in columns.items():
        dtype = (ds.features.get(name) or {}).get("dtype", "float64")
        try:
            total += np.dtype(dtype).itemsize * int(np.prod(shape or (1,)))
        except TypeError:
            other.append(name)
    if other and len(ds.data_files):
        md = read_footer(ds.data_path(0), ds.fs)
        rows = max(md.num_rows, 1)
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            for j in range(rg.num_columns):
                col = rg.column(j)
                if col.path_in_schema.split(".")[0] in other:
                    total += col.total_uncompressed_size / rows
        total += 8 * len(other)
    return max(total, 1.0)


def check_run(
    plan: Any,
    rank: int,
    world_size: int,
    worker: int | None,
    num_workers: int | None,
    batch_size: int | None,
    cache_mb: float,
) -> None:
    """Raise ValueError when a stream's arguments do not fit ``plan`` (world size, workers, rank,
    worker) or are out of range (batch size, cache)."""
    if int(plan.world_size) != int(world_size):
        raise ValueError(f"plan is for world_size={plan.world_size}, this job has {world_size}")
    if num_workers is not None and int(num_workers) != int(plan.num_workers):
        raise ValueError(
            f"plan is for {plural(plan.num_workers, 'worker')}, got num_workers={num_workers}"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if worker is not None and not 0 <= worker < plan.num_workers:
        raise ValueError(f"worker {worker} is not in [0, {plan.num_workers})")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if cache_mb <= 0:
        raise ValueError(f"cache_mb must be > 0, got {cache_mb}")


class ShardedLoader:
    """Stream one rank's (and worker's) share of a root, or of a mixture, by its shard plan.

    ``plan`` is a :class:`~episodekit.metadata.plans.plan_file.Plan` (or None: ``load_plan(root,
    world_size, num_workers)``). ``rank``/``world_size`` default to torch.distributed, else
    RANK/WORLD_SIZE; ``worker`` defaults to the torch DataLoader worker id, else all of the rank's
    bins in turn. Yields samples (dicts like ``FrameDataset[i]``) or, with ``batch_size``, batches
    (like ``get_batch``; the epoch's last batch may be shorter). ``cache_mb`` bounds the decoded
    row groups held at once, hence the pool: more mixing for more memory.

    One class for a root and a mixture (a mixture plan, or ``root`` a mixture plan folder with
    no plan given): it holds what both share (the run's checks, bins, epochs, iteration,
    states); its ``stream`` (:class:`RootStream`, or ``mixture.MixtureStream``) opens the
    readers and reads an epoch's blocks of samples, and answers for what only its kind has
    (``frames``, ``bin_order``, ``epoch_frames`` of a root; ``sources``, ``epoch_draws`` of a
    mixture).
    """

    def __init__(
        self,
        root: str | os.PathLike | Dataset | None,
        plan: Any | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        worker: int | None = None,
        num_workers: int | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        speed: bool | str = True,
        video_backend: Any = "auto",
    ):
        rank, world_size = fill_rank(rank, world_size)
        if is_mixture_plan(plan) or (plan is None and looks_like_mixture(root)):
            kind = mixture_part("stream")
        else:
            kind = RootStream
        source = kind.source(root)
        if plan is None:
            from episodekit.metadata.plans.load import load_plan

            plan = load_plan(source, world_size, num_workers or 1)
        check_run(plan, rank, world_size, worker, num_workers, batch_size, cache_mb)
        self.plan, self.rank, self.world_size = plan, int(rank), int(world_size)
        self.num_workers = int(plan.num_workers)
        self.worker = worker
        self.batch_size, self.seed = batch_size, int(seed)
        self.samples_per_worker = int(plan.samples_per_worker)
        self.plan_id = int(plan.digest[:15], 16)
        self.epoch = 0
        self.position = 0
        options = ReadOptions(
            delta_timestamps, tolerance_s, cache_mb, speed, video_backend=video_backend,
            warn_cache=False,  # a stream decodes each row group once per epoch
        )  # fmt: skip
        self.stream = kind(self, source, options)

    def __getattr__(self, name: str) -> Any:
        # what only the kind has (frames, bin_order, sources, epoch_draws, ...): its stream's
        stream = self.__dict__.get("stream")
        if stream is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(stream, name)

    @property
    def pool_rows(self) -> int:
        """The pool size in rows (from ``cache_mb``; part of the order)."""
        return self.stream.pool_rows

    def _blocks(self, epoch: int, start: int, size: int) -> Iterator[tuple[int, Callable]]:
        """``(n, read)`` from sample ``start`` of ``epoch`` on: ``read()`` returns the block's
        ``n`` samples as one batch; ``n`` is a multiple of ``size`` except at the end (the
        loader cuts blocks into batches, and reads a block only when one of them is asked)."""
        return self.stream.blocks(epoch, start, size)

    # -- which bins this process reads ---------------------------------------------------------

    def workers(self) -> list[int]:
        """The bins (worker ids) this process reads: the given worker, the torch DataLoader
        worker, or all of the rank's bins in turn."""
        if self.worker is not None:
            return [self.worker]
        tw = torch_worker()
        if tw is None:
            return list(range(self.num_workers))
        wid, n = tw
        if n != self.num_workers:
            raise ValueError(
                f"DataLoader has num_workers={n} but the plan is for "
                f"{plural(self.num_workers, 'worker')}; "
                "use the plan for this worker count"
            )
        return [wid]

    def bind_worker(self, worker: int | None) -> None:
        """Read bin ``worker`` of this rank from now on (None: the default choice)."""
        if worker is not None and not 0 <= int(worker) < self.num_workers:
            raise ValueError(f"worker {worker} is not in [0, {self.num_workers})")
        self.worker = None if worker is None else int(worker)

    def __len__(self) -> int:
        """Samples per epoch for this process (samples_per_worker x workers it reads)."""
        return self.samples_per_worker * len(self.workers())

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (a no-op when already in it, e.g. after resume)."""
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def seek(self, epoch: int, position: int) -> None:
        """Continue at sample ``position`` of ``epoch`` (this loader's own plan, seed, bins)."""
        position = int(position)
        if not 0 <= position <= len(self):
            raise ValueError(f"position {position} outside [0, {len(self)}]")
        self.epoch, self.position = int(epoch), position

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        total = len(self)
        if total and self.position >= total:
            self.epoch, self.position = self.epoch + 1, 0  # the previous epoch was finished
        epoch = self.epoch
        for ref in self.batch_refs(epoch, self.position):
            batch = ref.read()
            if self.batch_size:
                self.position += ref.rows
                yield batch
            else:
                for j in range(ref.rows):
                    self.position += 1
                    yield batch_row(batch, j)
            if epoch != self.epoch:  # set_epoch/load_state_dict while iterating
                return

    def batch_refs(self, epoch: int, start: int = 0) -> Iterator[BatchRef]:
        """The batches of ``epoch`` from sample ``start`` (``batch_size`` samples, else
        ``READ_CHUNK``), each read only when asked: skipping one reads nothing (a
        ``make_loader`` worker takes every N-th batch of a bin and skips the others). No state
        of the loader changes."""
        size = self.batch_size or READ_CHUNK
        for n, read in self._blocks(epoch, start, size):
            block = _Block(read)
            for a in range(0, n, size):
                yield BatchRef(block, a, min(n, a + size) - a, n <= size)

    def state_dict(self) -> dict[str, int]:
        """Where this process is in the epoch, and which order that position belongs to: the plan
        (``plan``: its digest as an integer), seed, rank, worker (-1: all the rank's bins in
        turn) and pool size in rows (from ``cache_mb``). A few integers."""
        workers = self.workers()
        return {
            "plan": self.plan_id,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "rank": self.rank,
            "worker": workers[0] if len(workers) == 1 else -1,
            "pool_rows": self.pool_rows,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume exactly at ``state`` (recomputes the order; skipped samples are not read).

        Raises ValueError when ``state`` is not a ShardedLoader state or was taken with another
        plan, seed, rank, worker or pool size (its position would mean other samples here).
        """
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ValueError(
                f"not a ShardedLoader state: missing {', '.join(missing)} (pass what "
                "state_dict() returned)"
            )
        mine = self.state_dict()
        for key, what in (
            ("plan", "another shard plan"),
            ("seed", "another seed"),
            ("rank", "another rank"),
            ("worker", "another worker"),
            ("pool_rows", "another pool size (cache_mb or columns differ)"),
        ):
            if int(state[key]) != mine[key]:
                raise ValueError(
                    f"state was taken with {what}: {key}={state[key]}, this loader has "
                    f"{key}={mine[key]}; resuming would yield other samples"
                )
        self.seek(int(state["epoch"]), int(state["position"]))


class Stream:
    """How a :class:`ShardedLoader` reads its kind: opens the readers of the loader's bins
    (sets ``pool_rows``, part of the order) and reads an epoch's blocks (``blocks``). The run's
    figures (plan, rank, bins, seed) are the loader's."""

    def __init__(self, loader: ShardedLoader, source: Any, options: ReadOptions):
        self.loader = loader
        self._open(source, options)

    @staticmethod
    def source(root: Any) -> Any:
        """What a default plan is loaded from (``load_plan``'s first argument)."""
        raise NotImplementedError

    def _open(self, source: Any, options: ReadOptions) -> None:
        raise NotImplementedError

    def blocks(self, epoch: int, start: int, size: int) -> Iterator[tuple[int, Callable]]:
        """See :meth:`ShardedLoader._blocks`."""
        raise NotImplementedError

    plan = property(lambda self: self.loader.plan)
    rank = property(lambda self: self.loader.rank)
    num_workers = property(lambda self: self.loader.num_workers)
    samples_per_worker = property(lambda self: self.loader.samples_per_worker)
    seed = property(lambda self: self.loader.seed)

    def workers(self) -> list[int]:
        return self.loader.workers()


class RootStream(Stream):
    """One root's stream: each bin's episodes streamed pool by pool (see the module
    docstring)."""

    @staticmethod
    def source(root: Any) -> Dataset:
        return as_dataset(root)

    def _open(self, ds: Dataset, options: ReadOptions) -> None:
        plan = self.plan
        rank_items = np.concatenate([plan.bin_items(self.rank, w) for w in range(self.num_workers)])
        from episodekit.loaders.video import resolve_backend, stream_backend

        backend = resolve_backend(options.video_backend, ds)
        if isinstance(backend, str):  # by name: the stream's episode cache
            backend = stream_backend(backend, options.tolerance_s)
        options = options.replace(video_backend=backend)
        # video hook: a chunk's frames decode in pts order
        self.frames = RootFrameDataset.open(
            ds, options, np.unique(np.asarray(rank_items, dtype=np.int64)[:, 0])
        )
        reader = self.frames.reader
        store = self.frames.store
        # a frame store holding every column serves the stream: no pool to decode
        self._pool_needed = store is None or not set(reader.columns) <= set(store.columns)
        episode_index, length = ds.column("episode_index"), ds.column("length")
        frm = ds.column("dataset_from_index")
        self._bins = []
        for w in range(self.num_workers):
            items = np.asarray(plan.bin_items(self.rank, w), dtype=np.int64).reshape(-1, 3)
            layout = BinLayout(items, episode_index, length, frm, reader.rg_start, reader.rg_rows)
            if self.samples_per_worker and not layout.total:
                raise ValueError(f"bin (rank {self.rank}, worker {w}) of the plan has no frames")
            self._bins.append(layout)
        row_bytes = row_bytes_estimate(ds, reader.columns)
        self.pool_rows = max(int(options.cache_mb * MIB // row_bytes), 1)
        backend = self.frames.video_backend
        if backend is not None:  # a pool's decoded video must fit the backend's episode cache
            self.pool_rows = min(self.pool_rows, backend.pool_rows(ds, self.frames.video_keys))

    # -- the order ------------------------------------------------------------------------------

    def bin_order(self, epoch: int, worker: int) -> BinOrder:
        """The order of bin ``worker`` of this rank in ``epoch`` (no data read)."""
        bin_id = self.rank * self.num_workers + worker
        return BinOrder(self._bins[worker], self.seed, epoch, bin_id, self.pool_rows)

    def _parts(self, epoch: int, start: int) -> Iterator[tuple[tuple, np.ndarray]]:
        """((pool's row groups, row groups needed now, their row ranges), global frames) from
        sample ``start`` of ``epoch`` on."""
        spw = self.samples_per_worker
        for j, w in enumerate(self.workers()):
            lo, hi = j * spw, (j + 1) * spw
            if start >= hi:
                continue
            order = self.bin_order(epoch, w)
            for pool, frames, segs in order.parts(max(start, lo) - lo, spw):
                yield (order.pool_rgs[pool], *order.need_of_segments(segs)), frames

    def frame_order(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """Global frame indices of ``epoch`` from sample ``start`` on, as arrays (no data read)."""
        for _, frames in self._parts(epoch, start):
            yield frames

    def epoch_frames(self, epoch: int) -> np.ndarray:
        """All global frames of an epoch for this process, in order (for checks and tests)."""
        parts = list(self.frame_order(epoch))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _chunks(self, epoch: int, start: int, size: int) -> Iterator[list[tuple]]:
        """Batches of ``size`` samples as lists of (pool row groups, frames) parts."""
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        have = 0
        for rgs, frames in self._parts(epoch, start):
            while len(frames):
                take = min(size - have, len(frames))
                pending.append((rgs, frames[:take]))
                have += take
                frames = frames[take:]
                if have == size:
                    yield pending
                    pending, have = [], 0
        if have:
            yield pending

    def _read(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        """One batch: each part's row groups are made resident first (room is reserved for the
        whole pool, so each row group is decoded once while the pool lasts)."""
        reader, out = self.frames.reader, []
        for (rgs, need, rows), frames in parts:
            if self._pool_needed:
                reader.hold(rgs, need, rows)
            out.append(self.frames.get_frames(frames))
        return out[0] if len(out) == 1 else concat_batches(out)

    def blocks(self, epoch: int, start: int, size: int) -> Iterator[tuple[int, Callable]]:
        for parts in self._chunks(epoch, start, size):
            yield sum(len(f) for _, f in parts), partial(self._read, parts)


class _Block:
    """A block of samples read on first use."""

    __slots__ = ("_read", "_value")

    def __init__(self, read: Callable[[], dict[str, Any]]):
        self._read, self._value = read, None

    def get(self) -> dict[str, Any]:
        if self._read is not None:
            self._value, self._read = self._read(), None
        return self._value


class BatchRef:
    """One batch of a stream (``rows`` samples), read when :meth:`read` is called."""

    __slots__ = ("_block", "_lo", "rows", "_whole")

    def __init__(self, block: _Block, lo: int, rows: int, whole: bool):
        self._block, self._lo, self.rows, self._whole = block, lo, rows, whole

    def read(self) -> dict[str, Any]:
        batch = self._block.get()
        return batch if self._whole else slice_batch(batch, self._lo, self._lo + self.rows)


# The root kind's former class name: the same class.
RootLoader = ShardedLoader
