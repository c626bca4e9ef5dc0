"""The output's metadata: tasks, episodes table (every column LeRobot writes), info.json
and stats.json, built from the sources' metadata and what the data and video stages wrote
(written by :mod:`episodekit.writers.sink_meta`, every writer's metadata side).

Per-episode stats of the kept episodes are reused as they are; those of the renumbered columns
(``index``, ``episode_index``, ``task_index``) are recomputed from the new values (LeRobot's
editor keeps the stale ones). Dataset stats are LeRobot 0.4.4's aggregation of the episodes'
stats (``metadata/lerobot_stats.py``: count-weighted mean and quantiles, parallel variance).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.layout.files import chunk_file
from episodekit.core.layout.info import Info
from episodekit.core.layout.rules import (
    DATA_PATH_V3,
    DEFAULT_CHUNKS_SIZE,
    DEFAULT_DATA_FILES_SIZE_IN_MB,
    DEFAULT_VIDEO_FILES_SIZE_IN_MB,
    V3,
    VIDEO_PATH_V3,
)
from episodekit.core.paths import INFO_FILE, MIB
from episodekit.metadata import lerobot_stats
from episodekit.writers.data import TaskValues
from episodekit.writers.plan import OutputPlan
from episodekit.writers.sink_meta import places

STAT_KEYS = ("min", "max", "mean", "std", "count", *lerobot_stats.LEROBOT_QUANTILE_KEYS)
V2_ONLY_KEYS = ("total_chunks", "total_videos")


def unify_tasks(
    plan: OutputPlan, rename: dict[str, str]
) -> tuple[list[str], list[np.ndarray], list[list[str]]]:
    """The new tasks (strings used by the kept episodes, after ``rename``, in the order of the
    sources' tasks tables), each source's ``old task_index -> new`` map (-1: not kept), and each
    output episode's task list."""
    ep_tasks = []
    for d, r in zip(plan.ds_id.tolist(), plan.row.tolist()):
        tasks = plan.datasets[d].episodes["tasks"][r].as_py() or []
        ep_tasks.append([rename.get(t, t) for t in tasks])
    used = {t for ts in ep_tasks for t in ts}
    order: dict[str, int] = {}
    for ds in plan.datasets:
        for t in ds.task_strings():
            t = rename.get(t, t)
            if t in used and t not in order:
                order[t] = len(order)
    for ts in ep_tasks:  # tasks the tables lack (an inconsistent source): still listed
        for t in ts:
            order.setdefault(t, len(order))
    maps = []
    for ds in plan.datasets:
        idx = ds.tasks["task_index"].to_numpy()
        m = np.full(int(idx.max()) + 1 if len(idx) else 0, -1, dtype=np.int64)
        for i, t in zip(idx.tolist(), ds.task_strings()):
            m[i] = order.get(rename.get(t, t), -1)
        maps.append(m)
    return list(order), maps, ep_tasks


def _list_column(matrix: np.ndarray, like: pa.DataType | None) -> pa.Array:
    """``(E, D)`` values as a list column (of ``like``'s type when the source had one)."""
    e, d = matrix.shape
    offsets = pa.array(np.arange(e + 1, dtype=np.int32) * d)
    arr = pa.ListArray.from_arrays(offsets, pa.array(matrix.ravel()))
    return arr.cast(like) if like is not None else arr


def _closed_form_stats(kind: str, value: np.ndarray, n: np.ndarray) -> dict[str, np.ndarray]:
    """Per-episode stats of ``arange(value, value + n)`` (``kind="range"``) or of ``n`` copies
    of ``value`` (``"constant"``), as LeRobot's definitions give them: population std, and each
    quantile the ``ceil(q n)``-th smallest value (LeRobot's 5000-bin histogram interpolates
    within one bin of it; the stats checks allow one bin). One numpy pass for all episodes."""
    v = value.astype(np.float64)
    nf = n.astype(np.float64)
    if kind == "range":
        out = {
            "min": v,
            "max": v + nf - 1,
            "mean": v + (nf - 1) / 2,
            "std": np.sqrt((nf**2 - 1) / 12),
        }
        for q, k in zip(lerobot_stats.LEROBOT_QUANTILES, lerobot_stats.LEROBOT_QUANTILE_KEYS):
            out[k] = v + np.maximum(np.ceil(q * nf) - 1, 0)
    else:
        out = {"min": v, "max": v, "mean": v, "std": np.zeros_like(v)}
        out.update({k: v for k in lerobot_stats.LEROBOT_QUANTILE_KEYS})
    return {k: x.reshape(-1, 1).copy() for k, x in out.items()}


def renumbered_stats(
    plan: OutputPlan, tasks: TaskValues, present: dict[str, dict[str, pa.DataType]]
) -> dict[str, pa.Array]:
    """``stats/<col>/<stat>`` of index, episode_index and task_index recomputed per output
    episode (only for the columns whose stats the sources carry)."""
    n = plan.length
    per_col = {
        "index": _closed_form_stats("range", plan.from_index, n),
        "episode_index": _closed_form_stats("constant", np.arange(plan.num_episodes), n),
    }
    if "task_index" in present:
        const = np.array([tasks.constant(e) for e in range(plan.num_episodes)], dtype=np.float64)
        stats = _closed_form_stats("constant", np.nan_to_num(const), n)
        for e in np.flatnonzero(np.isnan(const)).tolist():  # several tasks in one episode
            one = lerobot_stats.episode_stats(tasks.values(e).reshape(-1, 1))
            for k in stats:
                stats[k][e] = one[k]
        per_col["task_index"] = stats
    out: dict[str, pa.Array] = {}
    for col, stats in per_col.items():
        if col not in present:
            continue
        for stat, matrix in stats.items():
            out[f"stats/{col}/{stat}"] = _list_column(matrix, present[col].get(stat))
        out[f"stats/{col}/count"] = _list_column(n.reshape(-1, 1), present[col].get("count"))
    return out


IMAGE_DTYPES = ("image", "video")


def nested_image_stats(table: pa.Table, features: dict | None) -> pa.Table:
    """Image/video ``stats/*`` columns stored flat (one value per channel, as episodekit's
    samples wrote them before) in LeRobot's per-channel ``(C, 1, 1)`` nesting; others as they
    are. Vectorized: the values are wrapped twice, the rows keep their offsets (and nulls)."""
    for name, f in (features or {}).items():
        if f.get("dtype") not in IMAGE_DTYPES:
            continue
        for key in STAT_KEYS:
            col = f"stats/{name}/{key}"
            if key == "count" or col not in table.column_names:
                continue
            arr = table[col].combine_chunks()
            if not pa.types.is_list(arr.type) or pa.types.is_list(arr.type.value_type):
                continue
            values = arr.values.cast(pa.float64())
            ones = pa.array(np.arange(len(values) + 1, dtype=np.int32))
            wrapped = pa.ListArray.from_arrays(ones, pa.ListArray.from_arrays(ones, values))
            nested = pa.ListArray.from_arrays(arr.offsets, wrapped, mask=arr.is_null())
            table = table.set_column(table.schema.get_field_index(col), col, nested)
    return table


def _image_shape(entry: dict, dtype: str | None) -> dict:
    """A stats.json entry of an image/video feature with LeRobot's ``(C, 1, 1)`` values."""
    if dtype not in IMAGE_DTYPES:
        return entry
    out = {}
    for k, v in entry.items():
        a = np.asarray(v)
        out[k] = a.reshape(-1, 1, 1).tolist() if k != "count" and a.ndim == 1 else v
    return out


def _stats_types(table: pa.Table) -> dict[str, dict[str, pa.DataType]]:
    out: dict[str, dict[str, pa.DataType]] = {}
    for f in table.schema:
        parts = f.name.split("/")
        if len(parts) == 3 and parts[0] == "stats":
            out.setdefault(parts[1], {})[parts[2]] = f.type
    return out


def episodes_table(
    plan: OutputPlan,
    metas: list[pa.Table],
    ep_tasks: list[list[str]],
    chunks_size: int,
    removed: set[str],
    tasks: TaskValues,
    video_cols: dict[str, pa.Array],
    file_limit_mb: float,
    features: dict | None = None,
) -> pa.Table:
    """The output's episodes table, one row per output episode (see the module docstring)."""
    parts = [
        nested_image_stats(metas[d].take(pa.array(plan.row[plan.ds_id == d])), features)
        for d in range(len(metas))
    ]
    src = pa.concat_tables(parts, promote_options="permissive") if parts else pa.table({})
    order = np.concatenate([np.flatnonzero(plan.ds_id == d) for d in range(len(metas))])
    src = src.take(pa.array(np.argsort(order, kind="stable")))
    n = plan.num_episodes
    data_chunk, data_file = chunk_file(plan.file_seq, chunks_size)
    cols: dict[str, pa.Array] = {
        "episode_index": pa.array(np.arange(n, dtype=np.int64)),
        "tasks": pa.array(ep_tasks, pa.list_(pa.string())),
        "length": pa.array(plan.length),
        "data/chunk_index": pa.array(data_chunk),
        "data/file_index": pa.array(data_file),
        "dataset_from_index": pa.array(plan.from_index),
        "dataset_to_index": pa.array(plan.from_index + plan.length),
        **video_cols,
    }
    types = _stats_types(src)
    for name in src.column_names:
        feature = name.split("/")[1] if name.startswith(("stats/", "videos/")) else None
        if name in cols or name.startswith(("videos/", "meta/episodes/")) or feature in removed:
            continue
        cols[name] = src[name].combine_chunks()
    cols.update(renumbered_stats(plan, tasks, types))
    row_bytes = pa.table(cols).nbytes / max(n, 1)
    meta_chunk, meta_file = places(n, row_bytes, file_limit_mb * MIB, chunks_size)
    cols["meta/episodes/chunk_index"] = pa.array(meta_chunk)
    cols["meta/episodes/file_index"] = pa.array(meta_file)
    return pa.table(cols)


def dataset_stats(episodes: pa.Table, features: dict, fallback: dict) -> dict[str, dict[str, list]]:
    """stats.json: LeRobot's aggregation of the episodes' stats per feature; a feature without
    complete per-episode stats keeps ``fallback``'s entry (the source's stats.json)."""
    out = {}
    names = set(episodes.column_names)
    base = [k for k in STAT_KEYS if k not in lerobot_stats.LEROBOT_QUANTILE_KEYS]
    for name in features:
        cols = [f"stats/{name}/{k}" for k in base]
        dtype = features[name].get("dtype")
        if not all(c in names for c in cols) or any(episodes[c].null_count for c in cols):
            if isinstance(fallback.get(name), dict):
                out[name] = _image_shape(fallback[name], dtype)
            continue
        quantiles = [f"stats/{name}/{k}" for k in lerobot_stats.LEROBOT_QUANTILE_KEYS]
        whole = all(c in names and not episodes[c].null_count for c in quantiles)
        keys = STAT_KEYS if whole else base  # v2.1's stats (converted) have no quantiles
        stacked = {k: _stacked(episodes[f"stats/{name}/{k}"]) for k in keys}
        agg = lerobot_stats.aggregate_stacked(stacked)
        out[name] = _image_shape({k: np.asarray(v).tolist() for k, v in agg.items()}, dtype)
    return out


def _stacked(col: pa.ChunkedArray) -> np.ndarray:
    """A column of (nested) lists of equal shape per row as one ``(E, ...)`` array."""
    arr = col.combine_chunks()
    shape = np.asarray(arr[0].as_py()).shape if len(arr) else ()
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        arr = pc.list_flatten(arr)
    return arr.to_numpy(zero_copy_only=False).reshape(len(col), *shape)


def info_json(base: dict, plan: OutputPlan, n_tasks: int, features: dict) -> Info:
    """info.json of the output: the first source's, with new totals, splits and v3.0 paths, in
    the source's key order (a key it lacks after the others); parsed strictly, so an output
    info.json LeRobot could not read is refused before anything is published."""
    info = {k: v for k, v in base.items() if k not in V2_ONLY_KEYS}
    has_video = any(f.get("dtype") == "video" for f in features.values())
    info.update(
        codebase_version=V3,
        total_episodes=plan.num_episodes,
        total_frames=plan.num_frames,
        total_tasks=n_tasks,
        chunks_size=int(base.get("chunks_size") or DEFAULT_CHUNKS_SIZE),
        data_files_size_in_mb=base.get("data_files_size_in_mb", DEFAULT_DATA_FILES_SIZE_IN_MB),
        video_files_size_in_mb=base.get("video_files_size_in_mb", DEFAULT_VIDEO_FILES_SIZE_IN_MB),
        splits={"train": f"0:{plan.num_episodes}"},
        data_path=DATA_PATH_V3,
        video_path=VIDEO_PATH_V3 if has_video else None,
        features=features,
    )
    return Info.parse(info, INFO_FILE)
