"""How each loader class builds the kind its arguments name, without knowing the kinds.

``FrameDataset``, ``EpisodeAwareSampler`` and ``ShardedLoader`` are base classes; each kind (the
root kind beside its base, the mixture kind in :mod:`episodekit.loaders.mixture`) is a subclass
that says which arguments are its own (``claims``). ``Base(...)`` builds the subclass that claims
them, else the root kind: the base never imports a kind, so a new kind is one subclass.
"""

from __future__ import annotations

import os
from typing import Any

from episodekit.core.dataset import Dataset
from episodekit.metadata.mixture.plan_file import MixturePlan
from episodekit.metadata.mixture.spec import MixtureSpec
from episodekit.metadata.plans.plan_file import is_mixture_dir


def pick_kind(base: type, default: type, first: Any, plan: Any = None) -> type:
    """The subclass of ``base`` whose ``claims(first, plan)`` is true, else ``default``."""
    for kind in base.__subclasses__():
        if kind is not default and kind.claims(first, plan):
            return kind
    return default


def looks_like_mixture(obj: Any) -> bool:
    """A mixture plan, spec, spec dict, inline JSON, ``*.json`` file, mixture plan folder, or a
    mixture's frames (an object whose ``is_mixture`` is True)."""
    if getattr(obj, "is_mixture", False) is True:
        return True
    if isinstance(obj, (MixturePlan, MixtureSpec)):
        return True
    if isinstance(obj, dict):
        return "sources" in obj
    if isinstance(obj, (str, os.PathLike)) and not isinstance(obj, Dataset):
        text = os.fspath(obj)
        if text.lstrip().startswith("{") or text.endswith(".json"):
            return True
        if "://" not in text and os.path.isdir(text):
            import fsspec

            return is_mixture_dir(fsspec.filesystem("file"), os.path.abspath(text))
    return False


def is_mixture_plan(plan: Any) -> bool:
    """A plan that draws from several sources (a mixture plan)."""
    return getattr(plan, "item_source", None) is not None
