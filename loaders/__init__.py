"""The runtime side: deterministic sampling and fast frame reading of a prepared LeRobot root.

numpy + pyarrow only (torch is optional: ``episodekit.loaders.torch`` wraps these for torch).

- :class:`FrameDataset`: map-style frames with LeRobot's delta windows, row-group-aware reads;
- :class:`EpisodeAwareSampler`: (seed, epoch)-determined, resumable order, O(episodes) memory;
- :class:`ShardedLoader`: one (rank, worker) bin of a shard plan, equal counts on every rank;
- :func:`load_plan` / :class:`Plan`: the shard plan written by ``episodekit metadata plan``;
- the errors a training script catches: :class:`PlanNotFoundError`, :class:`StalePlanError`
  (both :class:`PlanError`) and :class:`DatasetError`.
"""

from episodekit.core.errors import DatasetError
from episodekit.loaders.frames import FrameDataset
from episodekit.loaders.sampler import EpisodeAwareSampler
from episodekit.loaders.sharded import ShardedLoader
from episodekit.metadata.plan_file import (
    Plan,
    PlanError,
    PlanNotFoundError,
    StalePlanError,
    load_plan,
)

__all__ = [
    "DatasetError",
    "EpisodeAwareSampler",
    "FrameDataset",
    "Plan",
    "PlanError",
    "PlanNotFoundError",
    "ShardedLoader",
    "StalePlanError",
    "load_plan",
]
