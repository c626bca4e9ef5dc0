"""``PlanOptions``: the parameters every plan writer takes (single root, canonical, mixture).

One object instead of the same seven keyword arguments on ``ensure_plans``,
``ensure_canonical_plan`` and ``ensure_mixture_plans`` (and their callers): build it once, pass
it on. The keyword arguments still work (``ensure_plans(root, [8], 4, cost="bytes")``) and
override the object's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from episodekit.metadata.plans.exclude import Exclusion


@dataclass(frozen=True)
class PlanOptions:
    """How plans are made: cost model, partition algorithm, episode cutting, label seed, equal
    counts policy, locality; ``force`` recomputes a plan that is fresh; ``exclusion``: frames
    the plans never draw (:mod:`episodekit.metadata.plans.exclude`)."""

    cost: str = "frames"
    algo: str = "auto"
    split_long: bool = False
    seed: int = 0
    force: bool = False
    policy: str = "trim"
    locality: str = "none"
    exclusion: Exclusion | None = None

    @classmethod
    def of(cls, options: PlanOptions | None, overrides: dict[str, Any]) -> PlanOptions:
        """``options`` (default: the defaults) with ``overrides`` applied; an unknown name is a
        TypeError, as for any keyword argument."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unexpected plan option(s): {', '.join(unknown)}")
        return replace(options or cls(), **overrides)
