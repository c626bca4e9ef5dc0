"""Deterministic, resumable, episode-aware sampling for map-style use: ``EpisodeAwareSampler``.

The order of an epoch is a pure function of ``(seed, epoch)``: every rank computes the same order
with no RNG synchronisation, and nothing of size O(frames) is ever materialised. An epoch is
built from *items* (an episode, or a contiguous frame range of one from a shard plan):

1. the items are permuted (numpy ``Generator`` seeded with ``(seed, epoch)``): O(items);
2. inside each item, offsets go through an affine bijection ``(a * x + b) mod n``, gcd(a, n) = 1;
3. positions ``0..N-1`` of the epoch go through a keyed Feistel bijection of ``[0, N)``
   (cycle-walking), so consecutive samples come from all over the dataset, not one episode.

Position ``p`` -> frame costs O(log items), so resuming at any position is instant and exact.
With a shard plan, rank ``r`` draws only from its bins' items and yields ``plan.samples_per_rank``
samples (``trim`` drops a deterministic surplus, ``wrap`` repeats frames to reach the count).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.core.hashing import splitmix64
from episodekit.core.world import fill_rank
from episodekit.loaders.frames import FrameDataset, RootFrameDataset
from episodekit.loaders.kinds import is_mixture_plan, mixture_part
from episodekit.metadata.plans.plan_file import items_digest

FEISTEL_ROUNDS = 4
CHUNK = 4096


def feistel_permute(x: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """A keyed bijection of ``[0, n)`` applied to ``x`` (balanced Feistel + cycle walking)."""
    x = np.asarray(x, dtype=np.uint64)
    if n <= 1:
        return x.astype(np.int64)
    half = max(1, (int(n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    sh = np.uint64(half)
    keys = np.asarray(keys, dtype=np.uint64)

    def encrypt(v: np.ndarray) -> np.ndarray:
        left, right = v >> sh, v & mask
        for k in keys:
            left, right = right, left ^ (splitmix64(right, k) & mask)
        return (left << sh) | right

    with np.errstate(over="ignore"):
        y = encrypt(x)
        out = y >= np.uint64(n)
        while out.any():  # cycle walking: the domain is < 4n, so few rounds on average
            y[out] = encrypt(y[out])
            out = y >= np.uint64(n)
    return y.astype(np.int64)


def coprime_multipliers(rng: np.random.Generator, sizes: np.ndarray) -> np.ndarray:
    """Per size ``n`` a random ``a`` in ``[1, n)`` with gcd(a, n) = 1 (1 for n <= 2)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    a = rng.integers(1, np.maximum(sizes, 2))
    bad = np.gcd(a, sizes) != 1
    while bad.any():
        a[bad] = rng.integers(1, np.maximum(sizes[bad], 2))
        bad = np.gcd(a, sizes) != 1
    return a


class EpochOrder:
    """The order of one epoch over items ``(base, size)``: position -> index, O(log items)."""

    def __init__(self, base: np.ndarray, size: np.ndarray, seed: int, epoch: int, shuffle: bool):
        self.total = int(size.sum())
        if shuffle:
            rng = np.random.default_rng([int(seed), int(epoch)])
            perm = rng.permutation(len(size))
            self.base, self.size = base[perm], size[perm]
            self.b = rng.integers(0, np.maximum(self.size, 1))
            self.a = coprime_multipliers(rng, self.size)
            self.keys = rng.integers(0, 2**63, size=FEISTEL_ROUNDS, dtype=np.uint64)
        else:
            self.base, self.size = base, size
            self.a = np.ones(len(size), np.int64)
            self.b = np.zeros(len(size), np.int64)
            self.keys = None
        self.cum = np.concatenate([[0], np.cumsum(self.size)]).astype(np.int64)

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        """Indices at natural positions (taken modulo the total: ``wrap`` repeats)."""
        q = np.asarray(positions, dtype=np.int64) % max(self.total, 1)
        if self.keys is not None:
            q = feistel_permute(q, self.total, self.keys)
        slot = np.searchsorted(self.cum, q, side="right") - 1
        local = q - self.cum[slot]
        return self.base[slot] + (self.a[slot] * local + self.b[slot]) % self.size[slot]


def _episode_view(dataset: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(episode_index, length, first dataset position) per episode of a FrameDataset or root."""
    if isinstance(dataset, (FrameDataset, RootFrameDataset)):
        return dataset.episode_index, dataset.episode_lengths, dataset.episode_starts
    ds: Dataset = as_dataset(dataset)
    length = ds.column("length")
    return ds.column("episode_index"), length, np.cumsum(length) - length


def plan_items(plan: Any, rank: int, workers: list[int] | None = None) -> np.ndarray:
    """The ``(episode_index, start, end)`` rows of a rank's bins (all its workers by default)."""
    workers = list(range(int(plan.num_workers))) if workers is None else workers
    parts = [np.asarray(plan.bin_items(rank, w), dtype=np.int64).reshape(-1, 3) for w in workers]
    return np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)


def items_to_ranges(
    items: np.ndarray,
    episode_index: np.ndarray,
    length: np.ndarray,
    start: np.ndarray,
    drop_first: int = 0,
    drop_last: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Item rows -> (first position, size) after dropping episode-edge frames; empty ones go."""
    items = np.asarray(items, dtype=np.int64).reshape(-1, 3)
    k = np.searchsorted(episode_index, items[:, 0])
    km = np.minimum(k, max(len(episode_index) - 1, 0))
    if len(items) and (len(episode_index) == 0 or (episode_index[km] != items[:, 0]).any()):
        bad = items[:, 0] if len(episode_index) == 0 else items[episode_index[km] != items[:, 0], 0]
        raise ValueError(f"plan references episodes not in the dataset: {bad[:10].tolist()}")
    n = length[km]
    if ((items[:, 1] < 0) | (items[:, 2] > n) | (items[:, 1] > items[:, 2])).any():
        raise ValueError("plan item frame ranges fall outside their episodes (stale plan?)")
    lo = np.maximum(items[:, 1], drop_first)
    hi = np.minimum(items[:, 2], n - drop_last)
    keep = hi > lo
    return (start[km] + lo)[keep], (hi - lo)[keep]


def check_sampler_args(
    seed: Any,
    drop_first: int,
    drop_last: int,
    rank: int | None,
    world_size: int | None,
    plan: Any = None,
) -> tuple[int, int]:
    """Raise ValueError on a bad seed, drop count, rank, or a plan for another world size;
    returns (rank, world_size) resolved as :func:`~episodekit.core.world.fill_rank` does."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if drop_first < 0 or drop_last < 0:
        raise ValueError("drop_n_first_frames/drop_n_last_frames must be >= 0")
    rank, world_size = fill_rank(rank, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if plan is not None and int(plan.world_size) != int(world_size):
        raise ValueError(f"plan is for world_size={plan.world_size}, this job has {world_size}")
    return int(rank), int(world_size)


class EpisodeAwareSampler:
    """Frame indices of a :class:`FrameDataset` (or a root) in a (seed, epoch)-determined order.

    ``drop_n_first_frames``/``drop_n_last_frames`` skip frames at each episode's edges (like
    LeRobot's sampler). With ``plan`` (from ``load_plan``), rank ``rank`` (resolved from
    torch.distributed / RANK when None) draws only from its bins and every rank yields
    ``plan.samples_per_rank`` indices. Without a plan and ``world_size > 1``, rank ``r`` takes
    positions ``r, r + W, ...`` of the shared order, ``N // W`` of them.

    ``state_dict()`` counts the indices handed out by the iterator; with a DataLoader (which
    prefetches), store ``{"epoch": e, "position": samples_consumed}`` yourself instead.

    One class for a root and a mixture (a mixture plan, or a mixture ``FrameDataset``): both
    share iteration, epochs and states (this class); ``draws`` says which frames an epoch draws
    and in what order (:class:`RootDraws`, or ``mixture.MixtureDraws``).
    """

    def __init__(
        self,
        dataset: FrameDataset | Dataset | str | os.PathLike,
        seed: int = 0,
        shuffle: bool = True,
        drop_n_first_frames: int = 0,
        drop_n_last_frames: int = 0,
        plan: Any | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        rank, world_size = check_sampler_args(
            seed, drop_n_first_frames, drop_n_last_frames, rank, world_size, plan
        )
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.rank, self.world_size = int(rank), int(world_size)
        self.plan = plan
        self.epoch = 0
        self.position = 0
        if is_mixture_plan(plan) or getattr(dataset, "is_mixture", False) is True:
            kind = mixture_part("draws")
        else:
            kind = RootDraws
        self.draws = kind(self, dataset, int(drop_n_first_frames), int(drop_n_last_frames))
        self.num_samples, self.natural = self.draws.num_samples, self.draws.natural
        self._identity = self.draws.identity

    def indices(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Indices at ``positions`` (0..len-1) of ``epoch``; vectorized, no state change."""
        return self.draws.indices(epoch, positions)

    def __len__(self) -> int:
        return self.num_samples

    def epoch_indices(self, epoch: int) -> np.ndarray:
        """All indices of an epoch (O(samples): for checks and tests)."""
        return self.indices(epoch, np.arange(self.num_samples))

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (a no-op when already in it, e.g. after resume)."""
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    def __iter__(self) -> Iterator[int]:
        if self.num_samples and self.position >= self.num_samples:
            self.epoch, self.position = self.epoch + 1, 0  # the previous epoch was finished
        epoch = self.epoch
        while self.position < self.num_samples and epoch == self.epoch:
            stop = min(self.position + CHUNK, self.num_samples)
            chunk = self.indices(epoch, np.arange(self.position, stop))
            for i in chunk.tolist():
                self.position += 1
                yield i

    def state_dict(self) -> dict[str, Any]:
        """Where the iterator is (a few integers) and what it is for (plan digest, rank...)."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_samples": self.num_samples,
            "identity": dict(self._identity),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume exactly where ``state`` was taken (mid-epoch or at an epoch's end). A state
        taken for another plan, rank, world size, seed or frame selection is refused."""
        if not isinstance(state, dict) or "epoch" not in state or "position" not in state:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a sampler state: needs 'epoch' and 'position', got {got}")
        n = int(state.get("num_samples", self.num_samples))
        if n != self.num_samples:
            raise ValueError(
                f"state is for {n} samples per epoch, this sampler has {self.num_samples} "
                "(different dataset, plan or drop settings)"
            )
        position = int(state["position"])
        if not 0 <= position <= self.num_samples:
            raise ValueError(f"position {position} outside [0, {self.num_samples}]")
        ident = state.get("identity")
        if ident is not None and not isinstance(ident, dict):
            raise ValueError(f"sampler state 'identity' must be a dict, got {ident!r}")
        if ident is not None and ident != self._identity:
            keys = set(self._identity) | set(ident)
            diff = sorted(k for k in keys if ident.get(k) != self._identity.get(k))
            theirs = {k: ident.get(k) for k in diff}
            mine = {k: self._identity.get(k) for k in diff}
            raise ValueError(f"sampler state is for another {', '.join(diff)} ({theirs} vs {mine})")
        if "seed" in state and int(state["seed"]) != self.seed:
            raise ValueError(
                f"sampler state is for seed {state['seed']}, this sampler has {self.seed}"
            )
        self.epoch, self.position = int(state["epoch"]), position


class Draws:
    """Which frames a sampler's epoch draws and in what order: made once from the sampler's
    arguments (``seed``, ``shuffle``, ``rank``, ``world_size``, ``plan``); sets ``num_samples``,
    ``natural`` (frames before the plan's policy) and ``identity`` (what a saved state must
    match). :class:`RootDraws` for one root, ``mixture.MixtureDraws`` for a mixture."""

    def __init__(self, sampler: EpisodeAwareSampler, dataset: Any, drop_first: int, drop_last: int):
        self.seed, self.shuffle = sampler.seed, sampler.shuffle
        self.rank, self.world_size, self.plan = sampler.rank, sampler.world_size, sampler.plan
        self._select(dataset, drop_first, drop_last)

    def _select(self, dataset: Any, drop_first: int, drop_last: int) -> None:
        raise NotImplementedError

    def indices(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Indices at ``positions`` (0..len-1) of ``epoch``; vectorized, no state change."""
        raise NotImplementedError


class RootDraws(Draws):
    """One root's draws: an epoch is an :class:`EpochOrder` of the episodes (or the rank's plan
    items), strided over the ranks when there is no plan."""

    def _select(self, dataset: Any, drop_first: int, drop_last: int) -> None:
        plan = self.plan
        episode_index, length, start = _episode_view(dataset)
        if plan is None:
            items = np.stack([episode_index, np.zeros_like(length), length], 1)
        else:
            items = plan_items(plan, self.rank)
        self._base, self._size = items_to_ranges(
            items, episode_index, length, start, drop_first, drop_last
        )
        self.natural = int(self._size.sum())
        if plan is not None:
            self.num_samples = int(plan.samples_per_rank)
            self._stride = 1
        else:
            self.num_samples = self.natural // self.world_size
            self._stride = self.world_size
        if self.num_samples and not self.natural:
            raise ValueError("no frames left to sample (all dropped?)")
        self._order: EpochOrder | None = None
        # What a saved state must match to be resumed here (trust: refuse another plan/rank).
        plan_digest = None
        if plan is not None:
            pi = np.asarray(plan.items, dtype=np.int64)
            plan_digest = items_digest([pi[:, 0], pi[:, 1], pi[:, 2]])
        self.identity = {
            "plan": plan_digest,
            "rank": self.rank,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
            "frames": self.natural,
        }

    def _order_for(self, epoch: int) -> EpochOrder:
        if self._order is None or self._order_epoch != epoch:
            self._order = EpochOrder(self._base, self._size, self.seed, epoch, self.shuffle)
            self._order_epoch = epoch
        return self._order

    def indices(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Indices at ``positions`` (0..len-1) of ``epoch``; vectorized, no state change."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.num_samples):
            raise IndexError(f"positions must be in [0, {self.num_samples})")
        natural = p * self._stride + (self.rank if self.plan is None else 0)
        return self._order_for(epoch)(natural)


# The root kind's former class name: the same class.
RootSampler = EpisodeAwareSampler
