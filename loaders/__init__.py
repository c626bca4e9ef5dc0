"""The runtime side: deterministic sampling and fast frame reading of a prepared LeRobot root.

numpy + pyarrow only (torch is optional: ``episodekit.loaders.torch`` wraps these for torch).

- :class:`FrameDataset`: map-style frames (of a root, or of a mixture: one class, a root being
  one source) with LeRobot's delta windows, row-group-aware reads;
- :class:`EpisodeAwareSampler`: (seed, epoch)-determined, resumable order, O(episodes) memory;
- :class:`ShardedLoader`: one (rank, worker) bin of a shard plan, equal counts on every rank;
- :class:`ElasticLoader` / :func:`merge_states` / :func:`load_canonical_plan`: a canonical plan's
  epoch, resumable on another world size (:mod:`episodekit.loaders.elastic`);
- :func:`load_plan` / :class:`Plan`: the shard plan written by ``episodekit metadata plan``;
- :class:`MixtureFrameDataset`, :class:`MixtureSampler`, :class:`MixtureLoader`: the former
  names of the mixture kinds, now the same three classes (``is_mixture`` tells the kind), and
  :class:`ReadOptions` (the reader options passed down);
- the errors a training script catches: :class:`PlanNotFoundError`, :class:`StalePlanError`
  (both :class:`PlanError`) and :class:`DatasetError`.
"""

from episodekit.core.errors import DatasetError
from episodekit.loaders.elastic import ElasticLoader, ElasticStateError, merge_states
from episodekit.loaders.frames import FrameDataset
from episodekit.loaders.mixture import MixtureFrameDataset, MixtureLoader, MixtureSampler
from episodekit.loaders.options import ReadOptions
from episodekit.loaders.sampler import EpisodeAwareSampler
from episodekit.loaders.sharded import ShardedLoader
from episodekit.metadata.plans.canonical import load_canonical_plan
from episodekit.metadata.plans.load import load_plan
from episodekit.metadata.plans.plan_file import (
    Plan,
    PlanError,
    PlanNotFoundError,
    StalePlanError,
)

__all__ = [
    "DatasetError",
    "ElasticLoader",
    "ElasticStateError",
    "EpisodeAwareSampler",
    "FrameDataset",
    "MixtureFrameDataset",
    "MixtureLoader",
    "MixtureSampler",
    "Plan",
    "PlanError",
    "PlanNotFoundError",
    "ReadOptions",
    "ShardedLoader",
    "StalePlanError",
    "load_canonical_plan",
    "load_plan",
    "merge_states",
]
