"""The summary file ``meta/episodekit_stats.parquet``: the dataset's compacted rank summaries, one
row per (feature, dimension), and the provenance in its key-value metadata."""

from __future__ import annotations

import json
import os
import posixpath

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset, DatasetError, resolve_root
from episodekit.core.parquet_read import read_schema, read_table
from episodekit.metadata.stats.compute import (
    StatsResult,
)
from episodekit.metadata.stats.keys import (
    STORED_SKETCH_POINTS,
    SUMMARY_FILE,
    SUMMARY_KEY,
)
from episodekit.metadata.stats.sketch import (
    Sketch,
)


def summary_table(res: StatsResult) -> pa.Table:
    rows: dict[str, list] = {
        "feature": [],
        "dim": [],
        "values": [],
        "weights": [],
        "rank_error": [],
    }
    for n in res.features:
        for d, s in enumerate(res.dataset[n].sketches):
            c = s.compact(STORED_SKETCH_POINTS)
            rows["feature"].append(n)
            rows["dim"].append(d)
            rows["values"].append(c.values.tolist())
            rows["weights"].append(c.weights.astype(np.float64).tolist())
            rows["rank_error"].append(float(c.rank_error))
    return pa.table(
        {
            "feature": pa.array(rows["feature"], pa.string()),
            "dim": pa.array(rows["dim"], pa.int32()),
            "values": pa.array(rows["values"], pa.list_(pa.float64())),
            "weights": pa.array(rows["weights"], pa.list_(pa.float64())),
            "rank_error": pa.array(rows["rank_error"], pa.float64()),
        }
    )


def read_summary_meta(root: Dataset | str | os.PathLike) -> dict | None:
    """The summary file's metadata (None when absent or unreadable)."""
    fs, path = (root.fs, root.path) if isinstance(root, Dataset) else resolve_root(str(root))
    full = posixpath.join(path, SUMMARY_FILE)
    try:
        schema = read_schema(fs, full)
        return json.loads((schema.metadata or {}).get(SUMMARY_KEY, b"null"))
    except (DatasetError, OSError, ValueError):
        return None


def read_sketches(root: Dataset | str | os.PathLike) -> dict[str, list[Sketch]]:
    """The stored rank summaries per feature (what :func:`merge_stats` merges for a mixture)."""
    fs, path = (root.fs, root.path) if isinstance(root, Dataset) else resolve_root(str(root))
    full = posixpath.join(path, SUMMARY_FILE)
    try:
        t = read_table(fs, full)
    except (DatasetError, OSError) as exc:
        raise DatasetError(f"no readable stats summary ({exc})", full) from exc
    out: dict[str, list[Sketch]] = {}
    for r in t.to_pylist():
        out.setdefault(r["feature"], []).append(
            Sketch(np.array(r["values"]), np.array(r["weights"]), r["rank_error"])
        )
    return out
