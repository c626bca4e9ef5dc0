"""Shard plans: which (rank, worker) bin reads which episodes (or frame ranges), balanced by cost.

- :mod:`.build`: ``build_plan`` / ``ensure_plans`` (per world size), balance figures;
- :mod:`.partition`: the partitioners (LPT, Karmarkar-Karp, contiguous runs for ``rowgroup``);
- :mod:`.density_split`: equal frames and equal cost per bin when cost per frame varies;
- :mod:`.canonical`: canonical-bin plans for elastic resume (any world size);
- :mod:`.plan_file`: the plan file format and ``Plan`` (light: what the loader reads);
- :mod:`.load`: ``load_plan``, a root's plan or a mixture's (:mod:`..mixture.plan_file`).

Public names below load lazily, so the loader's light import of the file format stays light.
"""

from __future__ import annotations

from episodekit.core.lazy import lazy_getattr

_EXPORTS = {
    "BuildParams": "episodekit.metadata.plans.options",
    "PlanHeader": "episodekit.metadata.plans.plan_file",
    "PlanInfeasible": "episodekit.metadata.plans.options",
    "PlanOptions": "episodekit.metadata.plans.options",
    "build_plan": "episodekit.metadata.plans.build",
    "ensure_plans": "episodekit.metadata.plans.build",
    "verify_plan": "episodekit.metadata.plans.build",
    "ensure_canonical_plan": "episodekit.metadata.plans.canonical",
    "load_canonical_plan": "episodekit.metadata.plans.canonical",
    "Plan": "episodekit.metadata.plans.plan_file",
    "PlanError": "episodekit.metadata.plans.plan_file",
    "load_plan": "episodekit.metadata.plans.load",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
