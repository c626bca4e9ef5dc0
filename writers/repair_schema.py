"""What LeRobot's recorder (0.4.x-0.6.1) writes, rebuilt from ``info.json`` alone: the data
files' Arrow schema, and each ``meta/episodes`` row with its columns in LeRobot's order and types.

A footer-less file can only be read back under its exact schema (:mod:`episodekit.core.
parquet_salvage`); a readable sibling file gives it, and these give it when none survived (a
recording killed inside its first data file, or before its first ``meta/episodes`` flush).

- data (``get_hf_features_from_features`` + ``datasets.Features.arrow_schema``): every feature
  but videos, in ``info.json`` order; shape ``(1,)`` a scalar, ``(n,)`` a ``fixed_size_list``,
  images ``struct<bytes: binary, path: string>``; schema metadata ``huggingface`` holds the
  datasets features as JSON (LeRobot's files also carry a per-file ``fingerprint`` there, which
  cannot be rebuilt and is left out).
- episodes (``save_episode`` -> ``_save_episode_metadata`` -> ``pa.Table.from_pydict``):
  ``episode_index, tasks, length, data/chunk_index, data/file_index, dataset_from_index,
  dataset_to_index``, per camera ``videos/K/{chunk_index, file_index, from_timestamp,
  to_timestamp}``, per feature ``stats/F/{min, max, mean, std, count, q01, q10, q50, q90, q99}``
  (lists of doubles, count a list of int64, images ``(3, 1, 1)`` nested), then
  ``meta/episodes/chunk_index, meta/episodes/file_index``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.metadata import lerobot_stats
from episodekit.metadata.lerobot_image_stats import (  # noqa: F401 - also this module's API
    STAT_KEYS,
    lerobot_image_stats,
)

NO_STATS = ("string", "language")  # dtypes LeRobot computes no stats for


class SchemaUnknown(ValueError):
    """A feature whose column LeRobot writes in a form not rebuilt here (a 2-D array, ...)."""


def _shape(feature: dict) -> tuple[int, ...]:
    return tuple(int(x) for x in feature.get("shape") or (1,))


def _hf_feature(key: str, feature: dict) -> tuple[pa.DataType, dict] | None:
    """The Arrow type and datasets feature JSON LeRobot gives ``feature`` (None: a video)."""
    dtype = feature.get("dtype")
    if dtype == "video":
        return None
    if dtype == "image":
        return pa.struct([("bytes", pa.binary()), ("path", pa.string())]), {"_type": "Image"}
    shape = _shape(feature)
    try:
        value = pa.type_for_alias(str(dtype))
    except ValueError as exc:
        raise SchemaUnknown(f"feature {key!r}: dtype {dtype!r} has no Arrow type") from exc
    scalar = {"dtype": str(dtype), "_type": "Value"}
    if shape == (1,):
        return value, scalar
    if len(shape) == 1:
        return pa.list_(value, shape[0]), {"feature": scalar, "length": shape[0], "_type": "List"}
    raise SchemaUnknown(
        f"feature {key!r} of shape {list(shape)}: LeRobot stores it as a datasets array "
        "extension type, which is not rebuilt here"
    )


def data_schema(info: dict) -> pa.Schema:
    """The Arrow schema (with its ``huggingface`` metadata) of LeRobot's data files."""
    fields, hf = [], {}
    for key, feature in (info.get("features") or {}).items():
        got = _hf_feature(key, feature)
        if got is not None:
            fields.append(pa.field(key, got[0]))
            hf[key] = got[1]
    meta = {"huggingface": json.dumps({"info": {"features": hf}})}
    return pa.schema(fields, metadata=meta)


def stats_features(info: dict) -> list[str]:
    """The features LeRobot computes per-episode stats for, in its order."""
    return [k for k, f in (info.get("features") or {}).items() if f.get("dtype") not in NO_STATS]


def video_keys(info: dict) -> list[str]:
    return [k for k, f in (info.get("features") or {}).items() if f.get("dtype") == "video"]


def episode_row(
    info: dict,
    episode_index: int,
    tasks: list[str],
    length: int,
    data: tuple[int, int],
    from_index: int,
    videos: dict[str, tuple[int, int, float, float]],
    stats: dict[str, dict[str, np.ndarray]],
    meta_file: tuple[int, int],
) -> dict[str, Any]:
    """One ``meta/episodes`` row as LeRobot builds it (its keys in LeRobot's order, values as
    the Python types ``pa.Table.from_pydict`` turns into LeRobot's column types).

    ``data``: (chunk, file) of its rows; ``videos``: camera -> (chunk, file, from, to);
    ``stats``: feature -> LeRobot's stats of the episode (``count`` included)."""
    row: dict[str, Any] = {
        "episode_index": int(episode_index),
        "tasks": list(tasks),
        "length": int(length),
        "data/chunk_index": int(data[0]),
        "data/file_index": int(data[1]),
        "dataset_from_index": int(from_index),
        "dataset_to_index": int(from_index + length),
    }
    for key in video_keys(info):
        chunk, file, start, stop = videos[key]
        row[f"videos/{key}/chunk_index"] = int(chunk)
        row[f"videos/{key}/file_index"] = int(file)
        row[f"videos/{key}/from_timestamp"] = float(start)
        row[f"videos/{key}/to_timestamp"] = float(stop)
    for name in stats_features(info):
        for stat in STAT_KEYS:
            row[f"stats/{name}/{stat}"] = np.asarray(stats[name][stat]).tolist()
    row["meta/episodes/chunk_index"] = int(meta_file[0])
    row["meta/episodes/file_index"] = int(meta_file[1])
    return row


def episodes_table(rows: list[dict[str, Any]], like: pa.Schema | None = None) -> pa.Table:
    """Rows of :func:`episode_row` as LeRobot's table (``pa.Table.from_pydict``), cast to
    ``like`` (the schema of the episodes file they join) when given."""
    if not rows:
        raise ValueError("no rows")
    table = pa.Table.from_pydict({k: [r[k] for r in rows] for k in rows[0]})
    if like is None:
        return table
    missing = [n for n in like.names if n not in table.column_names]
    if missing:
        raise SchemaUnknown(f"episodes file has columns {missing[:3]} the rebuilt rows lack")
    return (
        table.select(like.names).cast(like.remove_metadata()).replace_schema_metadata(like.metadata)
    )


def episodes_schema(info: dict) -> pa.Schema:
    """The Arrow schema LeRobot's episodes files get (from a row of placeholder values)."""
    feats = info.get("features") or {}
    stats = {}
    for name in stats_features(info):
        f = feats[name]
        if f.get("dtype") in ("image", "video"):
            value = np.zeros((3, 1, 1))
        else:
            value = np.zeros(int(np.prod(_shape(f))))
        stats[name] = {k: (np.zeros(1, np.int64) if k == "count" else value) for k in STAT_KEYS}
    videos = {k: (0, 0, 0.0, 0.0) for k in video_keys(info)}
    row = episode_row(info, 0, ["task"], 1, (0, 0), 0, videos, stats, (0, 0))
    return episodes_table([row]).schema


def lerobot_episode_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """LeRobot's stats of one episode's ``(frames, ...)`` values of a numeric feature: its
    ``RunningQuantileStats`` promotes them to at least float32 first (ints to float64)."""
    x = np.asarray(values)
    x = x.reshape(len(x), -1)
    x = x.astype(np.result_type(x.dtype, np.float32), copy=False)
    return lerobot_stats.episode_stats(x)


def _columns(table: pa.Table, name: str) -> tuple[tuple[int, ...], dict[str, np.ndarray]]:
    """The ``stats/NAME/*`` columns of an episodes table as ``(episodes, values)`` float64
    arrays (count: int64), and the shape of one episode's value (``(3, 1, 1)`` for images)."""
    shape: tuple[int, ...] = ()
    out = {}
    for k in STAT_KEYS:
        arr = table.column(f"stats/{name}/{k}").combine_chunks()
        dims = []
        while pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
            lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
            if arr.null_count or len(lengths) == 0 or np.any(lengths != lengths[0]):
                raise ValueError(f"stats/{name}/{k}: values of different shapes")
            dims.append(int(lengths[0]))
            arr = arr.flatten()
        values = arr.to_numpy(zero_copy_only=False).reshape(table.num_rows, -1)
        out[k] = values.astype(np.int64 if k == "count" else np.float64)
        shape = shape or tuple(dims)
    return shape, out


STATS_BLOCK = 8192  # episodes whose stats are taken out of the table as numpy at a time


def _held(table: pa.Table, names: list[str], feats: dict) -> list[tuple]:
    """Per feature of ``names``: (name, shape, width, type, held values, count) of the episodes
    of ``table``, in the types the recorder held them in (see :func:`lerobot_dataset_stats`)."""
    parts = []
    for name in names:
        shape, cols = _columns(table, name)
        dtype = feats[name].get("dtype")
        base = np.float32 if dtype in ("image", "video") else np.result_type(dtype, np.float32)
        base = np.float64 if name == "timestamp" else base
        if cols["count"].shape[1] != 1:
            raise ValueError(f"stats/{name}/count: one count per episode expected")
        width = cols["mean"].shape[1]
        count = np.repeat(cols["count"], width, axis=1)
        held = {k: cols[k].astype(base) for k in ("min", "max", "mean", "std")}
        single = count[:, :1] < 2  # an episode of one frame keeps its quantiles in its type
        for q in lerobot_stats.LEROBOT_QUANTILE_KEYS:
            held[q] = np.where(single, cols[q].astype(base).astype(np.float64), cols[q])
        held["var"] = (held["std"] ** 2).astype(np.float64)  # squared in its type, as LeRobot
        parts.append((name, shape, width, base, held, count))
    return parts


def lerobot_dataset_stats(
    info: dict, episodes: pa.Table | list[dict[str, Any]], block: int = STATS_BLOCK
) -> dict[str, dict[str, list]]:
    """stats.json as LeRobot's recorder writes it for these episodes (a ``meta/episodes``
    table, or its rows, in order): :class:`DatasetStats` fed the whole table."""
    table = episodes if isinstance(episodes, pa.Table) else episodes_table(list(episodes))
    acc = DatasetStats(info, block)
    acc.add(table)
    return acc.result()


class DatasetStats:
    """stats.json as LeRobot's recorder writes it, fed the episodes' ``meta/episodes`` rows in
    order, a table at a time (:meth:`add`; memory: one ``block`` of episodes' arrays and the
    running values, whatever the episodes): after each episode ``stats = aggregate_stats([stats,
    episode_stats])``, its ``aggregate_feature_stats`` (0.4.x-0.6.1) bit for bit: count-weighted
    mean and quantiles, parallel variance (each step squares the ``std`` the step before
    wrote).

    Each episode's stats are taken in the dtypes the recorder held them in: min/max/mean/std in
    the values' type promoted to float32 at least (images float32; timestamps float64, the
    recorder computes them as ``frame_index / fps``), quantiles float64 (an episode of one frame:
    its mean's type), count int64. Every numpy step of LeRobot's promotes to float64 before it
    rounds, so the recurrence runs in float64 over every feature's values at once (one step per
    episode, not one per feature and episode); min and max are order-free, taken in one go."""

    def __init__(self, info: dict, block: int = STATS_BLOCK) -> None:
        self.info = info
        self.block = max(1, block)
        self.names: list[str] | None = None  # from the first table's columns
        self.n = 0
        self._acc: dict | None = None
        self._first: list[tuple] = []
        self._lows: list[np.ndarray] = []
        self._highs: list[np.ndarray] = []

    def add(self, table: pa.Table) -> None:
        """The next episodes' rows, in order."""
        feats = self.info.get("features") or {}
        if self.names is None:
            names = stats_features(self.info)
            self.names = [n for n in names if f"stats/{n}/count" in table.column_names]
        if not self.names:
            self.n += table.num_rows
            return
        quantiles = lerobot_stats.LEROBOT_QUANTILE_KEYS
        keys = ("mean", "var", *quantiles)
        for at in range(0, table.num_rows, self.block):
            parts = _held(table.slice(at, self.block), self.names, feats)
            if not self._first:  # the first episode's values (their shapes, an only episode)
                self._first = [
                    (*p[:4], {k: v[:1].copy() for k, v in p[4].items()}, p[5][:1].copy())
                    for p in parts
                ]
            for p, q in zip(parts, self._first):
                if (p[1], p[2]) != (q[1], q[2]):
                    raise ValueError(f"stats/{p[0]}/mean: values of different shapes")
            lo = [p[4]["min"].min(axis=0) for p in parts]
            hi = [p[4]["max"].max(axis=0) for p in parts]
            lows, highs = self._lows, self._highs
            self._lows = lo if not lows else [np.minimum(a, b) for a, b in zip(lows, lo)]
            self._highs = hi if not highs else [np.maximum(a, b) for a, b in zip(highs, hi)]
            # every feature side by side: one float64 row per episode
            count = np.concatenate([p[5] for p in parts], axis=1)
            rows = {
                k: np.concatenate([p[4][k].astype(np.float64) for p in parts], axis=1) for k in keys
            }
            self._steps(count, rows, keys, quantiles)
        self.n += table.num_rows

    def _steps(self, count: np.ndarray, rows: dict, keys: tuple, quantiles: tuple) -> None:
        acc, start = self._acc, 0
        if acc is None:
            acc = {k: rows[k][0] for k in keys}
            acc["count"], acc["std"] = count[0], None
            start = 1
        for i in range(start, len(count)):
            c_a, c_b = acc["count"], count[i]
            total = c_a + c_b
            m_a, m_b = acc["mean"], rows["mean"][i]
            mean = (m_a * c_a + m_b * c_b) / total
            v_a = acc["var"] if acc["std"] is None else acc["std"] ** 2
            var = (
                (v_a + (m_a - mean) ** 2) * c_a + (rows["var"][i] + (m_b - mean) ** 2) * c_b
            ) / total
            acc = {q: (acc[q] * c_a + rows[q][i] * c_b) / total for q in quantiles}
            acc.update(mean=mean, var=var, std=np.sqrt(var), count=total)
        self._acc = acc

    def result(self) -> dict[str, dict[str, list]]:
        """stats.json's features for the episodes added ({} for none)."""
        if not self.n or not self.names:
            return {}
        quantiles = lerobot_stats.LEROBOT_QUANTILE_KEYS
        acc = self._acc or {}
        out = {}
        at = 0
        for f, (name, shape, width, _, held, cnt) in enumerate(self._first):
            sl = slice(at, at + width)
            at += width
            if self.n == 1:  # nothing aggregated: the episode's own values, in their types
                got = {k: held[k][0] for k in ("min", "max", "mean", "std", *quantiles)}
                got["count"] = cnt[0, :1]
            else:
                got = {k: acc[k][sl] for k in ("mean", "std", *quantiles)}
                got["min"], got["max"] = self._lows[f], self._highs[f]
                got["count"] = acc["count"][sl][:1]
            out[name] = {
                k: (got[k] if k == "count" else got[k].reshape(shape or got[k].shape)).tolist()
                for k in STAT_KEYS
            }
        return out
