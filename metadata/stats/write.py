"""Writing: the ``stats/{feature}/{key}`` episodes columns, ``meta/stats.json`` and the summary
file, atomically and rank-gated."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.atomic import atomic_path, atomic_write_bytes
from episodekit.core.dataset import Dataset, DatasetError, as_dataset
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.logs import log_once
from episodekit.core.memory import release_memory
from episodekit.core.parquet_read import open_data_file, read_schema, read_table
from episodekit.core.parquet_write import LEROBOT_ENCODING, RowGroupWriter, write_table
from episodekit.core.world import rank_info
from episodekit.metadata.stats.compute import (
    StatsResult,
)
from episodekit.metadata.stats.episode_sketch import write_sketches
from episodekit.metadata.stats.keys import (
    READ_ONLY_ERRNOS,
    STAT_KEYS,
    STATS_FILE,
    STATS_VERSION,
    STORED_SKETCH_POINTS,
    SUMMARY_FILE,
    SUMMARY_KEY,
)
from episodekit.metadata.stats.summary import read_summary_meta, summary_table

log = logging.getLogger(__name__)


def _list_column(values: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """``(rows, D)`` -> ``list<dtype>`` with D values per row (LeRobot's per-episode layout)."""
    rows, dims = values.shape
    offsets = pa.array(np.arange(rows + 1, dtype=np.int32) * dims)
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1), type=dtype))


def episode_columns(res: StatsResult, episode_index: np.ndarray) -> dict[str, pa.Array]:
    """The ``stats/{feature}/{key}`` columns for the given episodes (in that order)."""
    pos = np.searchsorted(res.episode_index, episode_index)
    pos = np.minimum(pos, len(res.episode_index) - 1)
    if not np.array_equal(res.episode_index[pos], episode_index):
        raise DatasetError("episodes file lists episodes the stats were not computed for")
    cols: dict[str, pa.Array] = {}
    rows = res.episode.rows(pos)
    for n in res.features:
        f = rows[n]
        for key in STAT_KEYS:
            if key == "count":
                cols[f"stats/{n}/count"] = _list_column(
                    res.episode_count[pos][:, None].astype(np.int64), pa.int64()
                )
            else:
                cols[f"stats/{n}/{key}"] = _list_column(f[key], pa.float64())
    if res.images is not None:
        img_pos = np.searchsorted(res.images.episode_index, episode_index)
        cols.update(res.images.episode_columns(img_pos))
    return cols


EPISODES_PER_ROW_GROUP = 2048  # rows of an episodes file built and written at a time


def _rewrite_episodes_file(path: str, res: StatsResult, replaced: set[str]) -> None:
    """One episodes file with its stats columns from ``res``, atomically, verified (rows and
    columns) before it replaces the original. The columns being replaced are not read (they
    are most of the file); the others keep their place, new ones go last. Written
    :data:`EPISODES_PER_ROW_GROUP` rows at a time: memory holds a slice's stats, not a file's."""
    names = read_schema(None, path).names
    table = read_table(None, path, columns=[c for c in names if c not in replaced])
    ep = table.column("episode_index").to_numpy().astype(np.int64)

    def rows(start: int) -> pa.Table:
        part = table.slice(start, EPISODES_PER_ROW_GROUP)
        return _with_stats(part, names, episode_columns(res, ep[start : start + len(part)]))

    with atomic_path(path) as tmp:
        first = rows(0)  # pyarrow's default encoding, as LeRobot writes the file
        with RowGroupWriter(tmp, first.schema, encoding=LEROBOT_ENCODING) as writer:
            writer.write_group(first)
            for start in range(EPISODES_PER_ROW_GROUP, table.num_rows, EPISODES_PER_ROW_GROUP):
                writer.write_group(rows(start))
            writer.finish()
        with open_data_file(str(tmp), shared_footer=False) as back:
            same = back.num_rows == table.num_rows and back.schema.names == first.column_names
        if not same:
            raise DatasetError("rewritten episodes file does not read back the same", path)


def _with_stats(table: pa.Table, names: list[str], cols: dict[str, pa.Array]) -> pa.Table:
    """``table`` (the kept columns) with the stats columns ``cols`` in the file's column order
    ``names`` (new ones last); the schema's metadata kept."""
    fields, arrays = [], []
    for name in names:
        if name in cols:
            fields.append(pa.field(name, cols[name].type))
            arrays.append(cols[name])
        elif name in table.column_names:
            fields.append(table.schema.field(name))
            arrays.append(table.column(name))
    fields += [pa.field(n, a.type) for n, a in cols.items() if n not in names]
    arrays += [a for n, a in cols.items() if n not in names]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=table.schema.metadata))


def file_state(path: str) -> str:
    """Content digest of a small output file (episodes table): a copy stays recognisable."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _images_meta(res: StatsResult, ds: Dataset) -> dict | None:
    """The image/video stats record: new ones, else the previous record (those stats are kept)."""
    if res.images is not None:
        return res.images.meta()
    return (read_summary_meta(ds) or {}).get("images")


def write_stats(res: StatsResult, root: Dataset | str | os.PathLike) -> bool:
    """Write the per-episode columns, ``meta/stats.json`` and the summary file; return whether
    they were written. Only the global main process writes; a remote or read-only root keeps the
    result in memory (one warning). Other I/O errors propagate."""
    if not rank_info().is_main:
        return False
    ds = as_dataset(root)
    if not ds.is_local:
        log_once(
            log,
            ("stats", "readonly", ds.root),
            f"{ds.root}: remote root, stats kept in memory only",
        )
        return False
    base = Path(ds.path)
    try:
        outputs: dict[str, Any] = {"episodes": {}}
        numeric = {f"stats/{n}/{k}" for n in res.features for k in STAT_KEYS}
        for f in sorted(base.glob("meta/episodes/*/*.parquet")):
            _rewrite_episodes_file(str(f), res, numeric)
            outputs["episodes"][str(f.relative_to(base))] = file_state(str(f))
            release_memory()  # one episodes file's columns at a time, not the high-water mark
        stats_path = base / STATS_FILE
        old: dict = {}
        if stats_path.exists():
            try:
                old = json.loads(stats_path.read_text())
            except ValueError:
                old = {}
        stats = {k: v for k, v in (old if isinstance(old, dict) else {}).items()}
        stats.update(res.lerobot_stats())
        text = json.dumps(stats, indent=4)
        atomic_write_bytes(stats_path, text.encode())
        outputs["stats_sha256"] = hashlib.sha256(text.encode()).hexdigest()
        if res.sketches is not None:  # the episodes' sketches: what edit/split/merge merge
            write_sketches(
                base,
                res.sketches,
                res.info,
                {"fingerprint": res.fingerprint, "data_state": res.state},
            )
        meta = {
            "version": STATS_VERSION,
            "fingerprint": res.fingerprint,
            "data_state": res.state,
            "features": res.features,
            "quantiles": res.mode,
            "rank_error": res.rank_error,
            "rank_error_meaning": (
                "each dataset quantile lies between the exact order statistics at ranks "
                "(N-1)q -/+ rank_error*N (0: exact, np.quantile's linear rule)"
            ),
            "sketch_points": STORED_SKETCH_POINTS,
            "outputs": outputs,
            "images": _images_meta(res, ds),
        }
        table = summary_table(res).replace_schema_metadata({SUMMARY_KEY: json.dumps(meta)})
        with atomic_path(base / SUMMARY_FILE) as tmp:
            write_table(table, tmp)
    except (OSError, EnvironmentProblem) as exc:  # atomic writes raise EnvironmentProblem
        if getattr(exc, "errno", None) not in READ_ONLY_ERRNOS:
            raise
        reason = getattr(exc, "strerror", None) or "read-only"
        log_once(
            log,
            ("stats", "readonly", ds.root),
            f"{ds.root}: read-only root ({reason}), stats not written",
        )
        return False
    return True
