"""An epoch as numbered batches: what the worker processes of ``make_loader`` share out.

Each source is a small picklable description (root path, plan, arguments): a worker process
unpickles it and :meth:`~BatchSource.open` builds its own readers there (the 'spawn'-safe
pattern). An epoch starts from a *state* (what :meth:`~BatchSource.state` returns, the in-process
loaders' own resume state): :meth:`~BatchSource.begin` returns the number of batches left, and
:meth:`~BatchSource.batch` makes batch ``b`` of them in any process, so worker ``w`` of ``N``
makes batches ``w, w + N, ...`` and the consumer reads them back in order.

- :class:`RandomBatches`: ``FrameDataset.get_batch`` over an ``EpisodeAwareSampler``'s order
  (positions ``[p + b * batch_size, ...)``), a mixture included;
- :class:`StreamBatches`: a shard plan's bins of this rank, streamed (``ShardedLoader`` or
  ``MixtureLoader``, one per bin), taken round-robin: batch ``b`` is batch ``b // K`` of bin
  ``b % K`` (the order ``DataLoader(TorchShardedDataset(...), num_workers=K)`` gives); with as
  many workers as bins each worker reads one bin, so each row group is decoded once;
- :class:`ElasticBatches`: an ``ElasticLoader``'s steps (one batch per step).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import numpy as np

ACCESS = ("stream", "random", "elastic")


@dataclasses.dataclass(frozen=True)
class LoaderRun:
    """What ``make_loader`` was asked to read, parsed and checked once: the access kind, the
    batch size, this process's rank in ``world_size``, the worker count and the seed."""

    access: str = "stream"
    batch_size: int = 256
    rank: int = 0
    world_size: int = 1
    num_workers: int = 2
    seed: int = 0
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.access not in ACCESS:
            raise ValueError(f"access must be one of {', '.join(ACCESS)}, got {self.access!r}")
        if int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


class BatchSource(ABC):
    """The interface (see the module docstring)."""

    kind = ""
    _opened: tuple[str, ...] = ()
    # any process makes any batch at the same cost (no per-worker reader state): make_loader's
    # workers then take the next batch as each gets free, not every N-th one
    any_worker = False

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._opened}

    @abstractmethod
    def open(self) -> None:
        """Build the readers (once per process)."""

    @abstractmethod
    def max_rows(self) -> int:
        """The most rows a batch can have (sizes the ring's slots)."""

    @abstractmethod
    def epoch_state(self, epoch: int) -> dict[str, Any]:
        """The state at the start of ``epoch``."""

    @abstractmethod
    def begin(self, state: Mapping[str, Any]) -> int:
        """Start from ``state``; the number of batches left in its epoch."""

    @abstractmethod
    def batch(self, b: int) -> dict[str, Any]:
        """Batch ``b`` (0-based from the state :meth:`begin` started from)."""

    @abstractmethod
    def state(self, consumed: int) -> dict[str, Any]:
        """The state after ``consumed`` batches from the one :meth:`begin` started from."""

    def epoch_of(self, state: Mapping[str, Any]) -> int:
        return int(state["epoch"])


def batch_source(
    root: Any,
    plan: Any,
    run: LoaderRun,
    read: Mapping[str, Any],
    sampler_kwargs: Mapping[str, Any] | None = None,
) -> BatchSource:
    """The batch source of ``make_loader``'s arguments: ``read`` the reader's keyword arguments,
    ``sampler_kwargs`` the sampler's (random access); see ``make_loader``'s docstring."""
    from episodekit.metadata.plans.canonical import is_canonical, load_canonical_plan
    from episodekit.metadata.plans.load import load_plan

    workers = max(run.num_workers, 1)
    if run.access == "elastic" or (plan is not None and is_canonical(plan)):
        return ElasticBatches(root, load_canonical_plan(root) if plan is None else plan, run, read)
    if run.access == "random":
        from episodekit.loaders.kinds import looks_like_mixture

        if plan is None and looks_like_mixture(root):  # a mixture's sampler needs its plan
            plan = load_plan(root, run.world_size, workers)
        return RandomBatches(root, run, read, dict(sampler_kwargs or {}, plan=plan))
    if plan is None:
        plan = load_plan(root, run.world_size, workers)
    elif run.num_workers:
        warn_plan_workers(root, plan, run)
    return StreamBatches(root, plan, run, read)


def warn_plan_workers(root: Any, plan: Any, run: LoaderRun) -> None:
    """One line when ``plan``'s bins cannot each be read by one worker (its worker count is not
    a multiple of ``run.num_workers``): worker ``w`` makes batches ``w, w + N, ...`` and batch
    ``b`` is of bin ``b % K``, so a bin shared by workers has its row groups decoded by each of
    them (a plan for 1 worker with 2 workers ran at 0.27-0.36x in-process). Names the command
    that writes the plan for ``num_workers``."""
    k, n = int(plan.num_workers), int(run.num_workers)
    if k % n == 0:
        return
    from episodekit.loaders.kinds import is_mixture_plan
    from episodekit.metadata.mixture.plan_file import mixture_fix_hint
    from episodekit.metadata.plans.plan_file import fix_hint, plan_flags, plan_root

    world = int(plan.world_size)
    if is_mixture_plan(plan):
        hint = mixture_fix_hint(str(_path(root)), world, n)
    else:
        hint = fix_hint(plan_root(root)[3], world, n)
    warnings.warn(
        f"make_loader: the plan is for {k} worker{'s' * (k != 1)} and num_workers={n}, so "
        f"workers share bins and each decodes their row groups; "
        f"write a plan for {n} workers: {hint}{plan_flags(plan.doc)}",
        UserWarning,
        stacklevel=4,  # make_loader's caller
    )


def _path(root: Any) -> Any:
    """A root as workers can reopen it: an opened ``Dataset`` becomes its root path/URL."""
    from episodekit.core.dataset import Dataset

    return str(root.root) if isinstance(root, Dataset) else root


class RandomBatches(BatchSource):
    """Random access: ``dataset.get_batch(sampler.indices(epoch, positions))``."""

    kind = "random"
    _opened = ("ds", "sampler")
    any_worker = True  # batch b is get_batch of positions [b * size, ...): a pure function of b

    def __init__(
        self,
        root: Any,
        run: LoaderRun,
        dataset_kwargs: Mapping[str, Any],
        sampler_kwargs: Mapping[str, Any],
    ):
        self.root, self.batch_size, self.drop_last = _path(root), run.batch_size, run.drop_last
        self.dataset_kwargs = dict(dataset_kwargs)
        self.sampler_kwargs = dict(
            sampler_kwargs, seed=run.seed, rank=run.rank, world_size=run.world_size
        )

    def open(self) -> None:
        if getattr(self, "ds", None) is None:
            from episodekit.loaders.frames import FrameDataset
            from episodekit.loaders.sampler import EpisodeAwareSampler

            self.ds = FrameDataset(self.root, **self.dataset_kwargs)
            self.sampler = EpisodeAwareSampler(self.ds, **self.sampler_kwargs)

    def max_rows(self) -> int:
        return self.batch_size

    def epoch_state(self, epoch: int) -> dict[str, Any]:
        self.sampler.load_state_dict({"epoch": int(epoch), "position": 0})
        return self.sampler.state_dict()

    def begin(self, state: Mapping[str, Any]) -> int:
        self.sampler.load_state_dict(dict(state))
        self.epoch, self.start = self.sampler.epoch, self.sampler.position
        left = self.sampler.num_samples - self.start
        return left // self.batch_size if self.drop_last else math.ceil(left / self.batch_size)

    def batch(self, b: int) -> dict[str, Any]:
        lo = self.start + b * self.batch_size
        hi = min(lo + self.batch_size, self.sampler.num_samples)
        return self.ds.get_batch(self.sampler.indices(self.epoch, np.arange(lo, hi)))

    def state(self, consumed: int) -> dict[str, Any]:
        position = min(self.start + consumed * self.batch_size, self.sampler.num_samples)
        self.sampler.load_state_dict({"epoch": self.epoch, "position": position})
        return self.sampler.state_dict()


STREAM_IDENTITY = ("plan", "seed", "rank", "pool_rows", "batch_size")
SKIP_AHEAD = 64  # batches of a bin skipped (order only) before seeking to the next one instead


class StreamBatches(BatchSource):
    """Streaming: the rank's plan bins round-robin (batch ``b``: bin ``b % K``, its batch
    ``b // K``); each process opens only the bins it reads."""

    kind = "stream"
    _opened = ("bins", "_next", "_iters")

    def __init__(self, root: Any, plan: Any, run: LoaderRun, loader_kwargs: Mapping[str, Any]):
        self.root, self.plan, self.batch_size = _path(root), plan, run.batch_size
        self.loader_kwargs = dict(loader_kwargs, rank=run.rank, world_size=run.world_size)
        self.loader_kwargs["seed"] = run.seed
        self.num_bins = int(plan.num_workers)
        self.per_bin = math.ceil(int(plan.samples_per_worker) / self.batch_size)

    def open(self) -> None:
        if getattr(self, "bins", None) is None:
            self.bins: dict[int, Any] = {}
            self._next: dict[int, int] = {}
            self._iters: dict[int, Any] = {}
            self.epoch, self.done = 0, 0

    def _bin(self, w: int) -> Any:
        loader = self.bins.get(w)
        if loader is None:
            from episodekit.loaders.sharded import ShardedLoader

            loader = self.bins[w] = ShardedLoader(
                self.root,
                self.plan,
                worker=w,
                num_workers=self.num_bins,
                batch_size=self.batch_size,
                **self.loader_kwargs,
            )
        return loader

    def max_rows(self) -> int:
        return self.batch_size

    def identity(self) -> dict[str, int]:
        """What a state must match (computed once, where the loader is made: workers get it
        with the source and never open a bin just for it)."""
        if getattr(self, "_identity", None) is None:
            s = self._bin(0).state_dict()
            self._identity = {k: int(s[k]) for k in STREAM_IDENTITY[:4]}
            self._identity["batch_size"] = self.batch_size
        return self._identity

    def epoch_state(self, epoch: int) -> dict[str, Any]:
        return {"form": self.kind, "epoch": int(epoch), "batches": 0, **self.identity()}

    def begin(self, state: Mapping[str, Any]) -> int:
        check_stream_state(state, self.identity())
        self.epoch, self.done = int(state["epoch"]), int(state["batches"])
        self._iters.clear()
        return self.num_bins * self.per_bin - self.done

    def batch(self, b: int) -> dict[str, Any]:
        g = self.done + b
        w, j = g % self.num_bins, g // self.num_bins
        it, at = self._iters.get(w), self._next.get(w, -1)
        if it is None or j < at or j - at > SKIP_AHEAD:
            it = self._iters[w] = self._bin(w).batch_refs(self.epoch, j * self.batch_size)
            at = j
        for _ in range(j - at):  # batches other workers make (a plan for fewer workers than
            next(it)  # these processes): skipped without reading, in the same pool order
        self._next[w] = j + 1
        return next(it).read()

    def state(self, consumed: int) -> dict[str, Any]:
        return {
            "form": self.kind,
            "epoch": self.epoch,
            "batches": self.done + int(consumed),
            **self.identity(),
        }


def check_stream_state(state: Mapping[str, Any], identity: Mapping[str, int]) -> None:
    """Raise ValueError unless ``state`` is a stream state of this loader (same plan, seed, rank,
    pool size, batch size: its batch count would mean other batches otherwise)."""
    if not isinstance(state, Mapping) or state.get("form") != "stream":
        raise ValueError("not a make_loader stream state (pass what state_dict() returned)")
    for key in STREAM_IDENTITY:
        if int(state.get(key, -1)) != identity[key]:
            raise ValueError(
                f"state was taken with another {key}: {state.get(key)} here {identity[key]}; "
                "resuming would yield other batches"
            )


class ElasticBatches(BatchSource):
    """An ``ElasticLoader``'s steps of this rank (one batch per step), its resume semantics."""

    kind = "elastic"
    _opened = ("loader", "todo")

    def __init__(self, root: Any, plan: Any, run: LoaderRun, loader_kwargs: Mapping[str, Any]):
        self.root, self.plan = _path(root), plan
        self.loader_kwargs = dict(
            loader_kwargs, rank=run.rank, world_size=run.world_size, seed=run.seed
        )

    def open(self) -> None:
        if getattr(self, "loader", None) is None:
            from episodekit.loaders.elastic import ElasticLoader

            self.loader = ElasticLoader(self.root, self.plan, **self.loader_kwargs)

    def max_rows(self) -> int:
        return self.loader.max_unit_rows()

    def epoch_state(self, epoch: int) -> dict[str, Any]:
        self.loader.start_epoch(int(epoch))
        return self.loader.state_dict()

    def begin(self, state: Mapping[str, Any] | list) -> int:
        self.loader.load_state_dict(state)
        self.todo = self.loader.pending_units()
        return len(self.todo)

    def batch(self, b: int) -> dict[str, Any]:
        return self.loader.unit_batch(self.todo[b])

    def state(self, consumed: int) -> dict[str, Any]:
        return self.loader.state_at(int(consumed))
