"""``PlanOptions``: the parameters every plan writer takes (single root, canonical, mixture).

One object instead of the same seven keyword arguments on ``ensure_plans``,
``ensure_canonical_plan`` and ``ensure_mixture_plans`` (and their callers): build it once, pass
it on. The keyword arguments still work (``ensure_plans(root, [8], 4, cost="bytes")``) and
override the object's fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from episodekit.core.errors import Infeasible
from episodekit.core.options import with_overrides
from episodekit.metadata.plans.exclude import Exclusion


class PlanInfeasible(Infeasible):
    """A plan that cannot be made as asked: a partition left a bin without a frame (too few
    episodes or pieces for the bins). Callers that may cut episodes retry on this exception
    only; any other error (a bug included) is not mistaken for infeasibility."""


@dataclass(frozen=True)
class PlanOptions:
    """How plans are made: cost model, partition algorithm, episode cutting (``split_long``:
    True, False, or "auto": whole episodes where they can fill every bin, else cut; see
    :func:`split_tries`), label seed, equal counts policy, locality; ``force`` recomputes a
    plan that is fresh; ``exclusion``: frames the plans never draw
    (:mod:`episodekit.metadata.plans.exclude`)."""

    cost: str = "frames"
    algo: str = "auto"
    split_long: bool | Literal["auto"] = False
    seed: int = 0
    force: bool = False
    policy: str = "trim"
    locality: str = "none"
    exclusion: Exclusion | None = None

    @classmethod
    def of(cls, options: PlanOptions | None, overrides: dict[str, Any]) -> PlanOptions:
        """``options`` (default: the defaults) with ``overrides`` applied; an unknown name is a
        TypeError, as for any keyword argument."""
        return with_overrides(cls, options, overrides)


@dataclass(frozen=True)
class BuildParams:
    """What a partition into plan bins takes besides the episodes' costs, lengths and the
    shape (:func:`~episodekit.metadata.plans.build.build_plan`, the density split, a mixture's
    sources): the algorithm and its label seed, episode cutting, the equal-counts policy, the
    cost model and fingerprint the plan records, and per episode (in cost order) its index,
    file position and row-group unit (``locality="rowgroup"``). ``relabel=False`` keeps the
    partition's bin numbers; ``exclusion``: frames left out."""

    algo: str = "auto"
    split_long: bool = False
    seed: int = 0
    policy: str = "trim"
    cost_model: str = "frames"
    fingerprint: str = ""
    locality: str = "none"
    episode_index: np.ndarray | None = None
    position: np.ndarray | None = None
    unit: np.ndarray | None = None
    relabel: bool = True
    exclusion: Exclusion | None = None

    @classmethod
    def of(cls, params: BuildParams | None, overrides: dict[str, Any]) -> BuildParams:
        """``params`` (default: the defaults) with ``overrides`` (keyword arguments) applied."""
        return with_overrides(cls, params, overrides)


def split_tries(split_long: bool | str, episodes: int, bins: int) -> list[bool]:
    """The ``split_long`` values to try, in order, for a plan over ``bins`` bins of a dataset
    with ``episodes`` non-empty episodes: "auto" tries whole episodes first when there are
    enough of them to give every bin one (a partition that still leaves a bin empty, e.g. a
    ``rowgroup`` one, is retried with cut episodes), else cuts at once; True/False: only that."""
    if split_long != "auto":
        return [bool(split_long)]
    return [False, True] if episodes >= bins else [True]
