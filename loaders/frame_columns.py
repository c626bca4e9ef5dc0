"""What a frame's columns are and the per-episode speed buckets: the small rules
``FrameDataset`` reads a root by (:mod:`episodekit.loaders.frames`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset

DEFAULT_SPEED = 50


def _row_shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    if feature.get("dtype") in ("image", "string") or python_valued(feature):
        return ()
    shape = tuple(int(x) for x in feature.get("shape") or ())
    return () if shape in ((), (1,)) else shape


def python_valued(feature: Mapping[str, Any]) -> bool:
    """A feature whose values are Python objects (LeRobot's ``language`` columns, other nested
    dtypes): per sample the row's value, per batch a list of them."""
    dtype = feature.get("dtype")
    if dtype in ("image", "string", "video"):
        return False
    try:
        np.dtype(dtype)
    except TypeError:
        return True
    return False


def _speed_buckets(ds: Dataset, speed: bool | str) -> np.ndarray:
    """Per-episode speed bucket (ds.episodes row order) from the artifact, computed when missing
    and then written (the loaders' only write, announced; ``speed="memory"`` or
    ``EPISODEKIT_SPEED_IN_MEMORY=1``: kept in memory); 50 each with ``speed=False``."""
    from episodekit.metadata.speed import SPEED_IN_MEMORY_ENV, episode_buckets, load_or_compute

    if isinstance(speed, str) and speed != "memory":
        raise ValueError(f"speed must be True, False or 'memory', got {speed!r}")
    if not speed:
        return np.full(ds.num_episodes, DEFAULT_SPEED, dtype=np.int64)
    write = speed != "memory" and os.environ.get(SPEED_IN_MEMORY_ENV, "") not in ("1", "true")
    return np.asarray(episode_buckets(ds, load_or_compute(ds, write=write)), dtype=np.int64)
