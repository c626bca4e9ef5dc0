"""Per-episode quantile sketches: mergeable, with a stated rank-error bound, kept in a sidecar.

Every episode of ``n`` frames keeps, per numeric feature and dimension, ``k = min(n, POINTS)``
of its order statistics: those of 1-based ranks ``ceil(j n / k)``, ``j = 1..k`` (all of them when
``n <= POINTS``). Each point stands for the ranks since the previous one, at most
``ceil(n / POINTS)``, so an episode's sketch counts ``x <= v`` within ``ceil(n / POINTS) - 1``
and any union of episodes' sketches within the sum of theirs: less than ``N / POINTS`` of its
``N`` frames. Quantiles read from the merged points aim at the middle of that interval, so a
quantile of any set of whole episodes is within ``1 / (2 POINTS)`` in rank plus one point's
weight. ``POINTS`` is picked from the bound every stats.json we write promises, 0.005 in rank:
``1 / (2 * 128) = 0.0039`` leaves room for the point's weight. The points are made by the stats
pass from the per-episode sort it already does (no other pass), and stored in
``meta/episodekit_sketches.parquet`` (one row per episode: ``episode_index``, ``length``, and per
feature and dimension ``points/{feature}/{d}``, a list of ``k`` ascending values in the
feature's float dtype; version 1 files held one ``points/{feature}`` list of ``D * k`` values,
dimension after dimension, and are still read); LeRobot reads no such file. ``edit``, ``split``
and ``merge`` take the kept episodes' rows from it instead of reading the data again.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.atomic import atomic_path
from episodekit.core.dataset import Dataset
from episodekit.core.errors import DatasetError
from episodekit.core.parquet_read import read_schema, read_table
from episodekit.core.parquet_write import Encoding, RowGroupWriter
from episodekit.metadata.stats.keys import QUANTILE_KEYS, QUANTILES
from episodekit.metadata.stats.sketch import Sketch, lerp_quantile, order_indices

SKETCHES_FILE = "meta/episodekit_sketches.parquet"
SKETCHES_KEY = b"episodekit_sketches"
SKETCHES_VERSION = 2  # 1: one packed ``points/{feature}`` column (still read)
READABLE_VERSIONS = (1, 2)
POINTS = 128  # order statistics kept per episode and dimension (at most): 1/256 rank bound


def sketch_ranks(lengths: np.ndarray, points: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """The 0-based order statistics every episode keeps, concatenated episode after episode,
    and how many each keeps (``min(length, points)``)."""
    n = np.asarray(lengths, dtype=np.int64)
    k = np.minimum(n, points)
    ep = np.repeat(np.arange(len(n)), k)
    j = np.arange(int(k.sum()), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k) + 1
    kk = np.maximum(k[ep], 1)
    return (j * n[ep] + kk - 1) // kk - 1, k


def sketch_weights(lengths: np.ndarray, points: int = POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Per kept point (concatenated as :func:`sketch_ranks`), the ranks it stands for; and per
    episode its largest weight - 1 (its rank-error contribution)."""
    ranks, k = sketch_ranks(lengths, points)
    first = np.cumsum(k) - k
    prev = np.r_[-1, ranks[:-1]]
    prev[first[k > 0]] = -1
    w = ranks - prev
    err = np.zeros(len(k))
    if len(w):
        err[k > 0] = np.maximum.reduceat(w, first[k > 0]) - 1
    return w, err


@dataclass
class EpisodeSketches:
    """The sketches of a set of episodes: ``episode_index`` and ``length`` per episode and, per
    feature, ``(D, sum k)`` points (episode after episode) with ``dims``."""

    episode_index: np.ndarray
    length: np.ndarray
    points: dict[str, np.ndarray]
    points_per_episode: int = POINTS

    def _spans(self) -> tuple[np.ndarray, np.ndarray]:
        k = np.minimum(self.length, self.points_per_episode)
        return np.cumsum(k) - k, k

    def select(self, rows: np.ndarray) -> EpisodeSketches:
        """The sketches of the episodes at positions ``rows`` (in that order)."""
        rows = np.asarray(rows, dtype=np.int64)
        start, k = self._spans()
        take = np.repeat(start[rows], k[rows]) + (
            np.arange(int(k[rows].sum())) - np.repeat(np.cumsum(k[rows]) - k[rows], k[rows])
        )
        return EpisodeSketches(
            self.episode_index[rows],
            self.length[rows],
            {n: p[:, take] for n, p in self.points.items()},
            self.points_per_episode,
        )

    def sketches(self, feature: str) -> list[Sketch]:
        """One merged :class:`Sketch` per dimension of ``feature`` over these episodes."""
        w, err = sketch_weights(self.length, self.points_per_episode)
        pts = self.points[feature]
        out = []
        for row in pts:
            order = np.argsort(row, kind="stable")
            out.append(
                Sketch(row[order].astype(np.float64), w[order].astype(np.float64), err.sum())
            )
        return out

    def quantiles(self, feature: str) -> np.ndarray:
        """The quantiles (5 x D) of ``feature`` over these episodes (NaN points last, ignored
        as numpy's sort puts them)."""
        sk = self.sketches(feature)
        n = int(self.length.sum())
        out = np.empty((len(QUANTILES), len(sk)))
        for d, s in enumerate(sk):
            for i, q in enumerate(QUANTILES):
                k0, k1, g = order_indices(n, q)
                a, b = s.order_statistic(np.array([k0, k1]))
                out[i, d] = lerp_quantile(a, b, g)
        return out

    def rank_error(self) -> float:
        """The bound of a union's counts, as a fraction of its frames."""
        _, err = sketch_weights(self.length, self.points_per_episode)
        return float(err.sum()) / max(int(self.length.sum()), 1)

    def with_episode_index(self, episode_index: np.ndarray) -> EpisodeSketches:
        return EpisodeSketches(
            np.asarray(episode_index, np.int64), self.length, self.points, self.points_per_episode
        )

    def table(self, dtypes: dict[str, str]) -> pa.Table:
        """The sidecar's rows (``dtypes``: feature -> info.json dtype; float32 stays float32):
        one ``points/{feature}/{d}`` list column per dimension, each row an episode's ``k``
        points (the ``(D, sum k)`` arrays' rows as they are: no reordering)."""
        _, k = self._spans()
        offsets = pa.array(np.r_[0, np.cumsum(k)].astype(np.int32))
        cols: dict[str, pa.Array] = {
            "episode_index": pa.array(self.episode_index, pa.int64()),
            "length": pa.array(self.length, pa.int64()),
        }
        for n, pts in self.points.items():
            typ = pa.float32() if dtypes.get(n) == "float32" else pa.float64()
            for d, row in enumerate(pts):
                values = pa.array(row, type=typ)
                cols[f"points/{n}/{d}"] = pa.ListArray.from_arrays(offsets, values)
        return pa.table(cols)

    @classmethod
    def from_table(
        cls,
        t: pa.Table,
        features: dict[str, int],
        points: int,
        version: int = SKETCHES_VERSION,
    ) -> EpisodeSketches:
        length = t["length"].to_numpy().astype(np.int64)
        k = np.minimum(length, points)
        start = np.cumsum(k) - k
        out = {}
        for n, dims in features.items():
            if version == 1:  # one packed column, each episode's (D, k) points dimension-major
                flat = _values(t[f"points/{n}"])
                pts = np.empty((dims, int(k.sum())), flat.dtype)
                pts.reshape(-1)[_layout(start, k, dims, pts.shape[1])] = flat
            else:
                rows = [_values(t[f"points/{n}/{d}"]) for d in range(dims)]
                pts = np.stack(rows) if rows else np.empty((0, int(k.sum())))
            out[n] = pts
        return cls(t["episode_index"].to_numpy().astype(np.int64), length, out, points)


def _values(col: pa.ChunkedArray) -> np.ndarray:
    """A list column's values, concatenated."""
    return col.combine_chunks().flatten().to_numpy(zero_copy_only=False)


def _layout(start: np.ndarray, k: np.ndarray, dims: int, total: int) -> np.ndarray:
    """Positions in a flattened ``(D, total)`` points array of version 1's stored order:
    episode after episode, each one's ``(D, k)`` points dimension-major."""
    kd = k * dims
    e = np.repeat(np.arange(len(k)), kd)
    within = np.arange(int(kd.sum()), dtype=np.int64) - np.repeat(np.cumsum(kd) - kd, kd)
    kk = np.maximum(k[e], 1)
    return (within // kk) * total + start[e] + within % kk


def concat(parts: list[EpisodeSketches]) -> EpisodeSketches:
    """Episodes of several parts, sorted by episode_index."""
    ep = np.concatenate([p.episode_index for p in parts])
    length = np.concatenate([p.length for p in parts])
    names = list(parts[0].points)
    sizes = {p.points_per_episode for p in parts}
    if len(sizes) != 1:
        raise ValueError(f"sketches of different sizes: {sorted(sizes)}")
    merged = EpisodeSketches(
        ep,
        length,
        {n: np.concatenate([p.points[n] for p in parts], axis=1) for n in names},
        parts[0].points_per_episode,
    )
    if np.all(ep[1:] > ep[:-1]):  # files in episode order (the usual case): no copy
        return merged
    return merged.select(np.argsort(ep, kind="stable"))


GROUP_EPISODES = 4096  # episodes per row group of a sidecar written from memory
ENCODING = Encoding(compression="zstd", dictionary=False, page_index=False)


def sketch_record(points: int, features: dict[str, int], meta: dict[str, object]) -> dict:
    """The sidecar's key-value metadata: format, points, ``{feature: dims}``, bound, ``meta``."""
    return {
        "version": SKETCHES_VERSION,
        "points": int(points),
        "features": {n: int(d) for n, d in features.items()},
        "rank_error_bound": "a union of episodes counts x <= v within sum(ceil(n/points) - 1)",
        **meta,
    }


def point_dtypes(info: dict, names) -> dict[str, str]:
    """info.json dtype of each feature whose points are stored (float32 stays float32)."""
    feats = info.get("features") or {}
    return {n: str((feats.get(n) or {}).get("dtype")) for n in names}


def write_sketches(root: str | Path, sk, info: dict, meta: dict[str, object]) -> None:
    """``meta/episodekit_sketches.parquet`` under a local ``root``, atomically; ``meta`` (the
    fingerprint, data state, ...) goes into its key-value metadata with the points and bound.
    ``sk``: an :class:`EpisodeSketches` in memory, or the stats pass's spilled ones
    (:class:`~episodekit.metadata.stats.sketch_spill.SpilledSketches`), copied or streamed
    row group by row group (memory: one group)."""
    with atomic_path(Path(root) / SKETCHES_FILE) as tmp:
        if not isinstance(sk, EpisodeSketches):
            sk.write(tmp, meta)
            return
        dims = {n: int(p.shape[0]) for n, p in sk.points.items()}
        record = sketch_record(sk.points_per_episode, dims, meta)
        write_sketches_file(tmp, sk, point_dtypes(info, sk.points), record)


def write_sketches_file(
    path: str | os.PathLike, sk: EpisodeSketches, dtypes: dict[str, str], record: dict
) -> None:
    """``sk`` as a sidecar-format file at ``path`` (not atomic: the caller's temporary) with
    ``record`` as its metadata, :data:`GROUP_EPISODES` episodes per row group."""
    table = sk.table(dtypes)
    schema = table.schema.with_metadata({SKETCHES_KEY: json.dumps(record)})
    with RowGroupWriter(path, schema, encoding=ENCODING) as w:
        for off in range(0, table.num_rows, GROUP_EPISODES):
            w.write_group(table.slice(off, GROUP_EPISODES))
        w.finish()


def read_sketches_meta(ds: Dataset) -> dict | None:
    """The sidecar's metadata (None when absent or unreadable)."""
    full = posixpath.join(ds.path, SKETCHES_FILE)
    try:
        schema = read_schema(ds.fs, full)
        meta = json.loads((schema.metadata or {}).get(SKETCHES_KEY, b"null"))
    except (DatasetError, OSError, ValueError):
        return None
    if isinstance(meta, dict) and meta.get("version") in READABLE_VERSIONS:
        return meta
    return None


def read_episode_sketches(ds: Dataset, fingerprint: str | None = None) -> EpisodeSketches | None:
    """The sidecar of ``ds`` when it describes its episodes (``fingerprint``: the episodes'
    fingerprint it must record, default ``ds.fingerprint``); None when absent or stale."""
    meta = read_sketches_meta(ds)
    if meta is None or meta.get("fingerprint") != (fingerprint or ds.fingerprint):
        return None
    full = posixpath.join(ds.path, SKETCHES_FILE)
    try:
        t = read_table(ds.fs, full)
    except (DatasetError, OSError):
        return None
    return EpisodeSketches.from_table(
        t, meta["features"], int(meta["points"]), int(meta["version"])
    )


__all__ = [
    "POINTS",
    "QUANTILE_KEYS",
    "SKETCHES_FILE",
    "EpisodeSketches",
    "read_episode_sketches",
    "sketch_ranks",
    "write_sketches",
]
