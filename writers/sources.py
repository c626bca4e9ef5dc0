"""The writer's input: an ordered list of source episodes, each a row of a source
:class:`~episodekit.core.dataset.Dataset` (v3.0 or v2.1), and the per-episode metadata of a source
that the writer carries over (every ``stats/*`` column, video columns).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import V2, Dataset, episodes_files, read_jsonl, read_parquet
from episodekit.core.errors import DatasetError

RENUMBERED = ("index", "episode_index", "task_index")  # columns the writer renumbers


@dataclass(frozen=True, eq=False)
class SourceEpisode:
    """One episode of ``ds`` (``row``: its position in ``ds.episodes``) to copy, in output order;
    ``frames``: which of its frames to keep (a bool mask over its frames; None: all of them,
    see :mod:`~episodekit.writers.frames`)."""

    ds: Dataset
    row: int
    frames: np.ndarray | None = None

    @property
    def episode_index(self) -> int:
        return int(self.ds.episodes["episode_index"][self.row].as_py())

    @property
    def length(self) -> int:
        if self.frames is not None:
            return int(np.count_nonzero(self.frames))
        return int(self.ds.episodes["length"][self.row].as_py())

    @property
    def file_id(self) -> int:
        return int(self.ds.episodes["file_id"][self.row].as_py())

    @property
    def tasks(self) -> list[str]:
        return list(self.ds.episodes["tasks"][self.row].as_py() or [])


def source_episodes(
    ds: Dataset, episodes: list[int] | np.ndarray | None = None
) -> list[SourceEpisode]:
    """The episodes ``episodes`` (episode indices; all when None) of ``ds``, in episode order."""
    rows = ds.episode_rows(None if episodes is None else np.sort(np.asarray(episodes)))
    return [SourceEpisode(ds, int(r)) for r in rows]


def episode_meta(ds: Dataset) -> pa.Table:
    """Every column of the source's episodes table, one row per episode in ``ds.episodes`` order.

    v3.0: the episodes parquet files, all columns. v2.1: ``meta/episodes_stats.jsonl`` turned
    into ``stats/<feature>/<stat>`` list columns (none when that file is absent).
    """
    if ds.version in V2:
        table = _v2_stats(ds)
    else:
        parts = [read_parquet(ds.fs, f) for f in episodes_files(ds.fs, ds.path)]
        table = pa.concat_tables(parts, promote_options="permissive").sort_by("episode_index")
    if table.num_rows and not np.array_equal(
        table["episode_index"].to_numpy(), ds.column("episode_index")
    ):
        raise DatasetError("episodes metadata does not match the episodes table", ds.root)
    return table


def _v2_stats(ds: Dataset) -> pa.Table:
    """``meta/episodes_stats.jsonl`` as ``stats/<feature>/<stat>`` list columns, one row per
    episode of ``ds`` (null where an episode lacks a stat), parsed by Arrow's JSON reader: no
    Python object per number (10,000 episodes of v2.1 stats are millions of them)."""
    path = posixpath.join(ds.path, "meta/episodes_stats.jsonl")
    ep = ds.column("episode_index")
    out: dict[str, pa.Array] = {"episode_index": pa.array(ep)}
    if not ds.fs.exists(path):
        return pa.table(out)
    with ds.fs.open(path, "rb") as fh:
        raw = fh.read()
    if not raw.strip():
        return pa.table(out)
    table = read_jsonl(raw, pa.schema([("episode_index", pa.int64())]), path)
    if "stats" not in table.column_names or not pa.types.is_struct(table["stats"].type):
        return pa.table(out)
    rows = np.full(len(ep), -1, dtype=np.int64)  # each episode's line (-1: none)
    have = table["episode_index"].to_numpy()
    pos = np.searchsorted(ep, have)
    ok = (pos < len(ep)) & (ep[np.minimum(pos, len(ep) - 1)] == have)
    rows[pos[ok]] = np.flatnonzero(ok)
    take = pa.array(np.where(rows >= 0, rows, 0))
    missing = pa.array(rows < 0)
    stats = table["stats"].combine_chunks()
    for f in stats.type:
        feat = stats.field(f.name)
        if not pa.types.is_struct(feat.type):
            continue
        for g in feat.type:
            col = feat.field(g.name).take(take)
            null = pa.nulls(len(col), col.type)
            out[f"stats/{f.name}/{g.name}"] = pc.if_else(missing, null, col)
    return pa.table(out)
