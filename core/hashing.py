"""One portable integer hash (splitmix64's finalizer) for seeded, machine-independent orders."""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray, key: int | np.uint64 = 0) -> np.ndarray:
    """splitmix64 finalizer of ``x ^ key`` over uint64 (wrapping arithmetic, same everywhere)."""
    z = np.asarray(x).astype(np.uint64) ^ np.uint64(key)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))
