"""The artifacts under ``meta/``: speed percentiles, episode costs, shard plans (and their file
format), normalization stats. Each ``ensure_*`` computes what is missing or stale and writes it
atomically.

Public face below, loaded lazily: importing this package (as the loader does for the plan file
format) pulls in none of the heavier modules.
"""

from __future__ import annotations

from episodekit.core.lazy import lazy_getattr

_EXPORTS = {
    "ensure_speed_file": "episodekit.metadata.speed",
    "load_or_compute": "episodekit.metadata.speed",
    "read_speed_file": "episodekit.metadata.speed",
    "SpeedFileError": "episodekit.metadata.speed",
    "ensure_costs": "episodekit.metadata.costs",
    "read_costs": "episodekit.metadata.costs",
    "compute_costs": "episodekit.metadata.costs",
    "ensure_plans": "episodekit.metadata.plans.build",
    "build_plan": "episodekit.metadata.plans.build",
    "verify_plan": "episodekit.metadata.plans.build",
    "Plan": "episodekit.metadata.plans.plan_file",
    "load_plan": "episodekit.metadata.plans.load",
    "PlanError": "episodekit.metadata.plans.plan_file",
    "PlanNotFoundError": "episodekit.metadata.plans.plan_file",
    "StalePlanError": "episodekit.metadata.plans.plan_file",
    "ensure_stats": "episodekit.metadata.stats",
    "compute_stats": "episodekit.metadata.stats",
    "merge_stats": "episodekit.metadata.stats",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("episodekit.metadata", _EXPORTS)
