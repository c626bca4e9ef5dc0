"""The runtime side: deterministic sampling and fast frame reading of a prepared LeRobot root.

numpy + pyarrow only (torch is optional: ``episodekit.loaders.torch`` wraps these for torch).

- :class:`FrameDataset`: map-style frames with LeRobot's delta windows, row-group-aware reads;
- :class:`EpisodeAwareSampler`: (seed, epoch)-determined, resumable order, O(episodes) memory;
- :class:`ShardedLoader`: one (rank, worker) bin of a shard plan, equal counts on every rank;
- :func:`load_plan` / :class:`Plan`: the shard plan written by ``episodekit metadata plan``.
"""

from .frames import FrameDataset
from .plan import Plan, load_plan
from .sampler import EpisodeAwareSampler
from .sharded import ShardedLoader

__all__ = ["EpisodeAwareSampler", "FrameDataset", "Plan", "ShardedLoader", "load_plan"]
