"""Which kind (a root or a mixture) a loader's arguments name.

``FrameDataset``, ``EpisodeAwareSampler`` and ``ShardedLoader`` are each one class for both
kinds: a root is one source, a mixture one source per root. Each asks these tests in its
``__init__`` and keeps what differs in a part it holds (``FrameDataset.datasets``, the
sampler's ``draws``, the loader's ``stream``; the mixture parts in
:mod:`episodekit.loaders.mixture`).
"""

from __future__ import annotations

import os
from typing import Any

from episodekit.core.dataset import Dataset
from episodekit.metadata.mixture.plan_file import MixturePlan
from episodekit.metadata.mixture.spec import MixtureSpec
from episodekit.metadata.plans.plan_file import is_mixture_dir


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


# The mixture's parts (``mixture.py`` registers them when imported; the package imports it):
# ``open_sources`` (a FrameDataset's sources), ``assemble`` (its batches from the sources'
# parts), ``draws`` (a sampler's), ``stream`` (a loader's).
# The classes name the part they need; they never import the mixture module (no import cycle).
_MIXTURE_PARTS: dict[str, Any] = {}


def register_mixture(**parts: Any) -> None:
    """Register the mixture's parts (called once by :mod:`episodekit.loaders.mixture`)."""
    _MIXTURE_PARTS.update(parts)


def mixture_part(name: str) -> Any:
    """The mixture's part ``name`` (importing any loaders module has registered them)."""
    return _MIXTURE_PARTS[name]
