"""Mixtures: several roots drawn with weights, exact per-source quotas per epoch.

- :mod:`.spec`: the mixture spec (``mixture.json``), weights, quotas, draws, source resolution;
- :mod:`.plan`: ``build_mixture_plan`` / ``ensure_mixture_plans`` (one plan over every source);
- :mod:`.plan_file`: the mixture plan file and ``MixturePlan`` (light: what the loader reads);
- :mod:`.stats`: normalization stats weighted as the mixture samples.

Public names below load lazily (importing the package pulls in none of these modules).
"""

from __future__ import annotations

from episodekit.core.lazy import lazy_getattr

_EXPORTS = {
    "MixtureError": "episodekit.metadata.mixture.spec",
    "MixtureSpec": "episodekit.metadata.mixture.spec",
    "parse_mixture": "episodekit.metadata.mixture.spec",
    "ensure_mixture_plans": "episodekit.metadata.mixture.plan",
    "MixturePlan": "episodekit.metadata.mixture.plan_file",
    "load_mixture_plan": "episodekit.metadata.mixture.plan_file",
    "ensure_mixture_stats": "episodekit.metadata.mixture.stats",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_getattr(__name__, _EXPORTS)
