"""The names users call: ``FrameDataset``, ``EpisodeAwareSampler``, ``ShardedLoader``.

Each picks the single-root class (``FrameDataset``, ``EpisodeAwareSampler``, ``ShardedLoader``
of :mod:`~episodekit.loaders.frames`, :mod:`~episodekit.loaders.sampler`,
:mod:`~episodekit.loaders.sharded`, here imported as ``Root*``) or its mixture
counterpart (:mod:`~episodekit.loaders.mixture`) from its arguments, so one training script reads
a prepared root and a mixture alike. The classes behind them know nothing of each other's kind;
this module is the only place that knows both. ``isinstance(x, FrameDataset)`` is true for
either kind.
"""

from __future__ import annotations

from typing import Any

from episodekit.core.dataset import Dataset
from episodekit.loaders.frames import FrameDataset as RootFrameDataset
from episodekit.loaders.mixture import (
    MixtureFrameDataset,
    MixtureLoader,
    MixtureSampler,
    looks_like_mixture,
)
from episodekit.loaders.sampler import EpisodeAwareSampler as RootSampler
from episodekit.loaders.sharded import ShardedLoader as RootLoader


class _Picks(type):
    """A factory that reads as a class: calling it builds one of ``kinds``, and an instance of
    any of them is an instance of it."""

    kinds: tuple[type, ...]

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls.kinds)


class FrameDataset(metaclass=_Picks):
    """Map-style frames of a prepared root, or of a mixture (a mixture plan, its folder, or a
    mixture spec): :class:`RootFrameDataset` or :class:`MixtureFrameDataset`, same arguments."""

    kinds = (RootFrameDataset, MixtureFrameDataset)

    def __new__(cls, root: Any = None, *args: Any, **kwargs: Any) -> Any:
        if root is not None and not isinstance(root, Dataset) and looks_like_mixture(root):
            return MixtureFrameDataset(root, *args, **kwargs)
        return RootFrameDataset(root, *args, **kwargs)


class EpisodeAwareSampler(metaclass=_Picks):
    """The (seed, epoch)-determined sampler: :class:`MixtureSampler` for a mixture plan or a
    mixture dataset, else :class:`RootSampler`; same arguments."""

    kinds = (RootSampler,)

    def __new__(cls, dataset: Any = None, *args: Any, **kwargs: Any) -> Any:
        plan = kwargs.get("plan", args[4] if len(args) > 4 else None)
        if getattr(plan, "item_source", None) is not None or isinstance(
            dataset, MixtureFrameDataset
        ):
            return MixtureSampler(dataset, *args, **kwargs)
        return RootSampler(dataset, *args, **kwargs)


class ShardedLoader(metaclass=_Picks):
    """One (rank, worker) bin of a shard plan, streamed: :class:`MixtureLoader` for a mixture plan
    (or ``root`` a mixture plan folder with no plan given), else :class:`RootLoader`."""

    kinds = (RootLoader,)

    def __new__(cls, root: Any = None, plan: Any = None, *args: Any, **kwargs: Any) -> Any:
        mixture = getattr(plan, "item_source", None) is not None or (
            plan is None and not isinstance(root, Dataset) and looks_like_mixture(root)
        )
        kind = MixtureLoader if mixture else RootLoader
        return kind(root, plan, *args, **kwargs)
