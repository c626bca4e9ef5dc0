"""Stats of output episodes computed while their rows stream through the writer: no other read.

The data stage hands every output row group to :meth:`StreamedStats.add`. A group holds whole
episodes (groups never split one), already renumbered as they are written, so each episode is
reduced once, by the stats pass's own code (:func:`~episodekit.metadata.stats.blocks.block_stats`):
min, max, mean, m2, the exact per-episode quantiles (numpy's linear rule) and the episode's
sketch points (:mod:`~episodekit.metadata.stats.episode_sketch`). Which episodes, per numeric
feature, is decided before the write (:class:`StreamWant`, see
:func:`episodekit.writers.stats_quantiles.stream_want`): the episodes cut inside (their stats
changed), every episode of an added feature, and the episodes whose source has no sketch of a
feature when the dataset quantiles come from sketches. Everything else keeps the stats and
sketches its source carries. The features whose dataset quantiles are exact instead
(``StreamWant.counted``) have every written value counted in range bins
(:class:`~episodekit.metadata.stats.range_counts.RangeCounts`), a few KiB per feature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from episodekit.metadata.stats.blocks import block_stats, episode_segments, feature_values
from episodekit.metadata.stats.episode_sketch import POINTS, EpisodeSketches
from episodekit.metadata.stats.keys import DEFAULT_SKETCH_POINTS, QUANTILE_KEYS, STAT_KEYS
from episodekit.metadata.stats.range_counts import RangeCounts

MOMENTS = ("min", "max", "mean", "m2")


@dataclass
class StreamWant:
    """Per numeric feature (``features``: name -> dims), which output episodes to reduce while
    streaming (``want``: a bool per output episode) and whose per-episode stats the reduced
    ones replace (``replace``: sorted output episodes; cut inside, or an added feature)."""

    features: dict[str, int]
    want: dict[str, np.ndarray]
    replace: dict[str, np.ndarray] = field(default_factory=dict)
    # features whose dataset quantiles come from range counts of every written row (name ->
    # lo, hi per dimension), not from sketches: some output episode has no source sketch
    counted: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.counted) or any(w.any() for w in self.want.values())


@dataclass
class _Part:
    """One feature's reduction of some episodes (episode order inside a group)."""

    episodes: np.ndarray
    count: np.ndarray
    stats: dict[str, np.ndarray]  # min, max, mean, m2 (n, D); q (5, n, D); points (D, sum k)


@dataclass
class StreamedStats:
    """What the writer's groups gave, per feature (see the module docstring)."""

    want: StreamWant
    parts: dict[str, list[_Part]] = field(default_factory=dict)
    counts: dict[str, RangeCounts] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, (lo, hi) in self.want.counted.items():
            self.counts.setdefault(name, RangeCounts.over(lo, hi))

    def add(self, group: pa.Table) -> None:
        """Reduce the wanted episodes of one written row group (whole episodes, output
        ``episode_index``), and count the values of the counted features."""
        for name, rc in self.counts.items():
            rc.add(feature_values(group.column(name), self.want.features[name], name))
        ep = group.column("episode_index").to_numpy().astype(np.int64, copy=False)
        for name, dims in self.want.features.items():
            sel = self.want.want[name][ep]
            if not sel.any():
                continue
            col = group.column(name)
            rows = None if sel.all() else np.flatnonzero(sel)
            if rows is not None:
                col = col.take(pa.array(rows))
            x = feature_values(col, dims, name)
            eps = ep if rows is None else ep[rows]
            starts, lens = episode_segments(eps)
            r = block_stats([x], starts, lens, DEFAULT_SKETCH_POINTS, None)
            keep = {k: r[k] for k in (*MOMENTS, "q", "points")}
            self.parts.setdefault(name, []).append(_Part(eps[starts], lens, keep))

    def merge(self, other: StreamedStats) -> None:
        """Take ``other``'s parts and counts (another output file's)."""
        for name, parts in other.parts.items():
            self.parts.setdefault(name, []).extend(parts)
        for name, rc in other.counts.items():
            self.counts[name].merge(rc)

    def _order(self, name: str) -> tuple[list[_Part], np.ndarray]:
        parts = self.parts.get(name, [])
        ep = np.concatenate([p.episodes for p in parts]) if parts else np.zeros(0, np.int64)
        return parts, np.argsort(ep, kind="stable")

    def episode_stats(self, name: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(sorted episodes, ``{key: (n, D)}`` for every per-episode key LeRobot writes, count
        ``(n, 1)`` int64)."""
        parts, order = self._order(name)
        ep = np.concatenate([p.episodes for p in parts])[order]
        count = np.concatenate([p.count for p in parts])[order]
        out = {k: np.concatenate([p.stats[k] for p in parts])[order] for k in MOMENTS}
        q = np.concatenate([p.stats["q"] for p in parts], axis=1)[:, order]
        out["std"] = np.sqrt(out.pop("m2") / count[:, None])
        out.update({k: q[i] for i, k in enumerate(QUANTILE_KEYS)})
        out["count"] = count[:, None].astype(np.int64)
        return ep, {k: out[k] for k in STAT_KEYS}

    def sketches(self, name: str) -> EpisodeSketches:
        """The reduced episodes' sketch points of ``name`` (one feature), sorted by episode."""
        parts = self.parts.get(name, [])
        sk = EpisodeSketches(
            np.concatenate([p.episodes for p in parts]),
            np.concatenate([p.count for p in parts]),
            {name: np.concatenate([p.stats["points"] for p in parts], axis=1)},
            POINTS,
        )
        return sk.select(np.argsort(sk.episode_index, kind="stable"))


def _list_column(values: np.ndarray, like: pa.DataType | None) -> pa.Array:
    """``(n, D)`` values as a list column (``like``'s type when there is one)."""
    n, d = values.shape
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * d)
    arr = pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))
    return arr.cast(like) if like is not None else arr


def replace_rows(table: pa.Table, cols: dict[str, pa.Array], rows: np.ndarray) -> pa.Table:
    """``table`` with the values of columns ``cols`` (one entry per row of ``rows``) put at
    ``rows``; a column the table lacks must cover every row and is added last."""
    n = table.num_rows
    for name, new in cols.items():
        if name not in table.column_names:
            if len(rows) != n or not np.array_equal(rows, np.arange(n)):
                raise ValueError(f"{name}: stats of some episodes only, and no column to fill")
            table = table.append_column(name, new)
            continue
        old = table[name].combine_chunks()
        if new.type != old.type:
            new = new.cast(old.type)
        take = np.arange(n, dtype=np.int64)
        take[rows] = n + np.arange(len(rows))
        merged = pa.concat_arrays([old, new]).take(pa.array(take))
        table = table.set_column(table.schema.get_field_index(name), name, merged)
    return table


def patch_episodes(episodes: pa.Table, streamed: StreamedStats) -> pa.Table:
    """The episodes table with the ``stats/{feature}/*`` of the output episodes
    ``streamed.want.replace[feature]`` replaced by the streamed ones."""
    for name, want in streamed.want.replace.items():
        if not len(want):
            continue
        ep, stats = streamed.episode_stats(name)
        pos = np.searchsorted(ep, want)
        if not np.array_equal(ep[np.minimum(pos, max(len(ep) - 1, 0))], want):
            raise ValueError(f"{name}: episodes {want[:5].tolist()} were not reduced")
        types = {k: episodes.schema.field(f"stats/{name}/{k}").type for k in stats
                 if f"stats/{name}/{k}" in episodes.column_names}  # fmt: skip
        cols = {f"stats/{name}/{k}": _list_column(v[pos], types.get(k)) for k, v in stats.items()}
        if len(types) < len(cols) and len(want) != episodes.num_rows:
            continue  # a source without stats of it: nothing per episode to mend
        episodes = replace_rows(episodes, cols, want)
    return episodes
