"""``load_plan``: the one entry point to a shard plan, single root or mixture.

A dataset root holds its plans under ``meta/shard_plans/`` (:func:`plan_file.load_root_plan`);
a folder written by ``metadata plan --mixture --out DIR`` holds a mixture's
(:func:`mixture_file.load_mixture_plan`). This module picks one; neither knows the other.
"""

from __future__ import annotations

from typing import Any

from episodekit.metadata.mixture.plan_file import load_mixture_plan
from episodekit.metadata.plans.plan_file import Plan, is_mixture_dir, load_root_plan, plan_root


def load_plan(root: str | Any, world_size: int, num_workers: int, check_fresh: bool = True) -> Plan:
    """The plan for ``world_size`` ranks x ``num_workers`` workers: of a dataset root (a path,
    URL or opened ``Dataset``) or of a mixture plan folder (a :class:`MixturePlan`).

    Raises :class:`PlanNotFoundError` when no plan exists for that shape and
    :class:`StalePlanError` when it was computed for other episodes (checked when
    ``check_fresh``: this reads the episodes metadata of the root or of every source).
    """
    ds, fs, base, _ = plan_root(root)
    if ds is None and is_mixture_dir(fs, base):
        return load_mixture_plan(root, world_size, num_workers, check_fresh)
    return load_root_plan(root, world_size, num_workers, check_fresh)
