"""Sharded iteration over a shard plan: ``ShardedLoader``, one (rank, worker) bin per reader.

Each (rank, worker) reads only its bin's items (``plan.bin_items``), so a rank opens only its own
data files. An epoch's order is a pure function of ``(seed, epoch, bin)``: the bin's items are
permuted, cut into consecutive *pools* of ``pool_episodes`` items, and the frames of each pool are
mixed by a keyed bijection (Feistel) before moving on: only one pool's row groups need to be
resident at a time, and neighbouring samples come from different episodes.

Every bin yields exactly ``plan.samples_per_worker`` samples per epoch (``trim``: the tail of the
epoch's order is dropped; ``wrap``: the order starts over), hence ``samples_per_rank`` per rank.
``state_dict()`` is a few integers; resuming recomputes the order (not the data) and continues at
the exact sample.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.core.world import rank_info
from episodekit.loaders.frames import DEFAULT_TOLERANCE_S, FrameDataset
from episodekit.loaders.reader import DEFAULT_CACHE_MB
from episodekit.loaders.sampler import FEISTEL_ROUNDS, feistel_permute, items_to_ranges

READ_CHUNK = 256


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


class BinOrder:
    """The order of one bin for one epoch: natural position -> global frame, by pools."""

    def __init__(
        self, base: np.ndarray, size: np.ndarray, seed: int, epoch: int, bin_id: int, pool: int
    ):
        rng = np.random.default_rng([int(seed), int(epoch), int(bin_id), 0x5EED])
        perm = rng.permutation(len(size))
        self.base, self.size = base[perm], size[perm]
        self.item_cum = np.concatenate([[0], np.cumsum(self.size)]).astype(np.int64)
        self.total = int(self.item_cum[-1])
        starts = np.arange(0, len(size), max(1, pool))
        self.group_item = np.append(starts, len(size))  # item bounds of each pool
        self.group_cum = self.item_cum[self.group_item]  # frame bounds of each pool
        self.keys = rng.integers(0, 2**63, size=(len(starts), FEISTEL_ROUNDS), dtype=np.uint64)

    def segments(self, start: int, stop: int) -> Iterator[np.ndarray]:
        """Global frames for natural positions [start, stop) (< total), one array per pool part."""
        while start < stop:
            j = int(np.searchsorted(self.group_cum, start, side="right") - 1)
            g0, g1 = int(self.group_cum[j]), int(self.group_cum[j + 1])
            end = min(stop, g1)
            local = feistel_permute(np.arange(start - g0, end - g0), g1 - g0, self.keys[j])
            q = local + g0  # a frame position among the bin's concatenated items
            slot = np.searchsorted(self.item_cum, q, side="right") - 1
            yield self.base[slot] + (q - self.item_cum[slot])
            start = end


class ShardedLoader:
    """Iterate one rank's (and worker's) share of a root by its shard plan.

    ``plan`` is a :class:`~episodekit.metadata.plan_file.Plan` (or None: ``load_plan(root,
    world_size,
    num_workers)``). ``rank``/``world_size`` default to torch.distributed, else RANK/WORLD_SIZE;
    ``worker`` defaults to the torch DataLoader worker id, else all of the rank's bins in turn.
    Yields samples (dicts like ``FrameDataset[i]``) or, with ``batch_size``, batches (like
    ``get_batch``; the epoch's last batch may be shorter).
    """

    def __init__(
        self,
        root: str | os.PathLike | Dataset,
        plan: Any | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        worker: int | None = None,
        num_workers: int | None = None,
        batch_size: int | None = None,
        pool_episodes: int = 8,
        seed: int = 0,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        speed: bool = True,
        video_backend: Any = None,
    ):
        ds = as_dataset(root)
        if rank is None or world_size is None:
            info = rank_info()
            rank = info.rank if rank is None else rank
            world_size = info.world_size if world_size is None else world_size
        if plan is None:
            from episodekit.metadata.plan_file import load_plan

            plan = load_plan(ds, world_size, num_workers or 1)
        if int(plan.world_size) != int(world_size):
            raise ValueError(f"plan is for world_size={plan.world_size}, this job has {world_size}")
        if num_workers is not None and int(num_workers) != int(plan.num_workers):
            raise ValueError(
                f"plan is for {plan.num_workers} workers, got num_workers={num_workers}"
            )
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        if worker is not None and not 0 <= worker < plan.num_workers:
            raise ValueError(f"worker {worker} is not in [0, {plan.num_workers})")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if pool_episodes < 1:
            raise ValueError(f"pool_episodes must be >= 1, got {pool_episodes}")
        self.plan, self.rank, self.world_size = plan, int(rank), int(world_size)
        self.num_workers = int(plan.num_workers)
        self.worker = worker
        self.batch_size, self.pool_episodes, self.seed = batch_size, int(pool_episodes), int(seed)
        self.samples_per_worker = int(plan.samples_per_worker)
        episode_index, length = ds.column("episode_index"), ds.column("length")
        frm = ds.column("dataset_from_index")
        self._bins = []
        for w in range(self.num_workers):
            items = np.asarray(plan.bin_items(self.rank, w), dtype=np.int64).reshape(-1, 3)
            self._bins.append(items_to_ranges(items, episode_index, length, frm))
            if self.samples_per_worker and not self._bins[-1][1].sum():
                raise ValueError(f"bin (rank {self.rank}, worker {w}) of the plan has no frames")
        rank_items = np.concatenate([plan.bin_items(self.rank, w) for w in range(self.num_workers)])
        self.frames = FrameDataset(
            ds,
            delta_timestamps=delta_timestamps,
            episodes=np.unique(np.asarray(rank_items, dtype=np.int64)[:, 0]),
            tolerance_s=tolerance_s,
            cache_mb=cache_mb,
            speed=speed,
            video_backend=video_backend,  # video hook: a chunk's frames decode in pts order
        )
        self.epoch = 0
        self.position = 0

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
                f"DataLoader has num_workers={n} but the plan is for {self.num_workers} workers; "
                "use the plan for this worker count"
            )
        return [wid]

    def __len__(self) -> int:
        """Samples per epoch for this process (samples_per_worker x workers it reads)."""
        return self.samples_per_worker * len(self.workers())

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (a no-op when already in it, e.g. after resume)."""
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    # -- the order ------------------------------------------------------------------------------

    def frame_order(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        """Global frame indices of ``epoch`` from sample ``start`` on, as arrays (no data read)."""
        spw = self.samples_per_worker
        for j, w in enumerate(self.workers()):
            lo, hi = j * spw, (j + 1) * spw
            if start >= hi:
                continue
            base, size = self._bins[w]
            order = BinOrder(
                base, size, self.seed, epoch, self.rank * self.num_workers + w, self.pool_episodes
            )
            p = max(start, lo) - lo
            while p < spw:  # trim: stop early; wrap: start the order over
                q = p % order.total
                stop = min(order.total, q + (spw - p))
                yield from order.segments(q, stop)
                p += stop - q

    def epoch_frames(self, epoch: int) -> np.ndarray:
        """All global frames of an epoch for this process, in order (for checks and tests)."""
        parts = list(self.frame_order(epoch))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def _chunks(self, epoch: int, start: int, size: int) -> Iterator[np.ndarray]:
        pending: list[np.ndarray] = []
        have = 0
        for seg in self.frame_order(epoch, start):
            pending.append(seg)
            have += len(seg)
            while have >= size:
                flat = np.concatenate(pending)
                yield flat[:size]
                pending, have = [flat[size:]], have - size
        if have:
            yield np.concatenate(pending)

    # -- iteration ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        total = len(self)
        if total and self.position >= total:
            self.epoch, self.position = self.epoch + 1, 0  # the previous epoch was finished
        epoch = self.epoch
        size = self.batch_size or READ_CHUNK
        for frames in self._chunks(epoch, self.position, size):
            batch = self.frames.get_frames(frames)
            if self.batch_size:
                self.position += len(frames)
                yield batch
                continue
            for j in range(len(frames)):
                self.position += 1
                yield _row(batch, j)
            if epoch != self.epoch:  # set_epoch/load_state_dict while iterating
                return

    def state_dict(self) -> dict[str, int]:
        """Where this process is in the epoch: a few integers."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "rank": self.rank,
            "samples_per_worker": self.samples_per_worker,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume exactly at ``state`` (recomputes the order; skipped samples are not read)."""
        spw = int(state.get("samples_per_worker", self.samples_per_worker))
        if spw != self.samples_per_worker or int(state.get("rank", self.rank)) != self.rank:
            raise ValueError("state was taken with another plan or rank")
        position = int(state["position"])
        if not 0 <= position <= len(self):
            raise ValueError(f"position {position} outside [0, {len(self)}]")
        self.seed = int(state.get("seed", self.seed))
        self.epoch, self.position = int(state["epoch"]), position


def _row(batch: Mapping[str, Any], j: int) -> dict[str, Any]:
    """Sample ``j`` of a batch dict (nested video dicts included)."""
    return {k: (_row(v, j) if isinstance(v, Mapping) else v[j]) for k, v in batch.items()}
