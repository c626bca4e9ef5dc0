"""Who am I in a training job: global rank and world size, and a barrier that is safe without torch.

Rank comes from an initialized ``torch.distributed`` (then collective calls are used), else the
``RANK``/``WORLD_SIZE`` environment variables, else a single process. torch is never imported unless
the caller already imported it, and nothing here requires it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    """The calling process's place in the job."""

    rank: int
    world_size: int
    source: str  # "torch", "env" or "single"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def uses_torch(self) -> bool:
        return self.source == "torch"


def _torch_dist():
    # A process group can only be initialized if torch was imported already: never import it
    # here (that costs seconds and is pointless in a batch job).
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist  # noqa: PLC0415 - optional dependency
    except Exception:  # torch broken: behave as if it were not there
        return None
    try:
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        return None
    return None


def rank_info() -> RankInfo:
    """Global rank and world size of this process (torch.distributed, else env, else single)."""
    dist = _torch_dist()
    if dist is not None:
        return RankInfo(dist.get_rank(), dist.get_world_size(), "torch")
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        try:
            rank = int(os.environ.get("RANK", "0"))
            world = int(os.environ.get("WORLD_SIZE", "1"))
        except ValueError as exc:
            raise ValueError(
                f"RANK/WORLD_SIZE must be integers, got RANK={os.environ.get('RANK')!r} "
                f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}"
            ) from exc
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"invalid RANK={rank} for WORLD_SIZE={world}")
        return RankInfo(rank, world, "env")
    return RankInfo(0, 1, "single")


def fill_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: the given values, each missing one from :func:`rank_info`."""
    if rank is None or world_size is None:
        info = rank_info()
        rank = info.rank if rank is None else rank
        world_size = info.world_size if world_size is None else world_size
    return rank, world_size


def barrier() -> None:
    """Wait for every rank when torch.distributed is initialized; a no-op otherwise."""
    dist = _torch_dist()
    if dist is not None:
        dist.barrier()
