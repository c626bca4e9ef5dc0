"""Batch dicts (name -> array, list, or a nested dict such as a video key's path and
timestamp): joined, sliced, one row taken, emptied; shared by the loaders."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def concat_batches(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate batch dicts along the batch axis (lists are joined, dicts recursed)."""
    out: dict[str, Any] = {}
    for key, v in batches[0].items():
        values = [b[key] for b in batches]
        if isinstance(v, Mapping):
            out[key] = concat_batches(values)
        elif isinstance(v, list):
            out[key] = [x for vs in values for x in vs]
        else:
            out[key] = np.concatenate(values)
    return out


def batch_row(batch: Mapping[str, Any], j: int) -> dict[str, Any]:
    """Sample ``j`` of a batch dict (nested video dicts included)."""
    return {k: (batch_row(v, j) if isinstance(v, Mapping) else v[j]) for k, v in batch.items()}


def slice_batch(batch: Mapping[str, Any], a: int, b: int) -> dict[str, Any]:
    """Rows ``[a, b)`` of a batch dict (nested dicts included)."""
    return {
        k: (slice_batch(v, a, b) if isinstance(v, Mapping) else v[a:b]) for k, v in batch.items()
    }


def _squeeze(batch: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in batch.items():
        out[key] = _squeeze(v) if isinstance(v, dict) else v[0]
    return out


def _no_rows(value: Any) -> Any:
    """``value`` (a batch entry: an array, a list, or a dict of those such as a video key's
    path and timestamp) with 0 rows."""
    if isinstance(value, dict):
        return {k: _no_rows(v) for k, v in value.items()}
    return value[:0]
