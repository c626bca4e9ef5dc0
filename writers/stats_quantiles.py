"""The output's dataset quantiles: from the kept episodes' sketches, never a mean of quantiles.

LeRobot's editors (and ours, before) wrote a dataset's q01..q99 as the count-weighted mean of
the episodes' quantiles: up to 0.15 away in rank from the data. Here every quantile key of a
numeric feature in stats.json comes from the merged per-episode sketches
(:mod:`episodekit.metadata.stats.episode_sketch`): a kept whole episode brings its source's
sketch (``meta/episodekit_sketches.parquet``, fresh), so nothing is read again; a feature some
source has no sketch for (LeRobot-written sources), an episode that was cut, and the columns the
writer renumbers (``index``, ``episode_index``, ``task_index``) are computed exactly from the
written output's columns (``compute_stats``, which reads only those columns). The output gets
its own sidecar, so that the next edit of it reads nothing either. min, max, mean, std and count
stay the exact merge of the episodes' stats (:func:`episodekit.writers.meta.dataset_stats`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from episodekit.core.atomic import atomic_write_text
from episodekit.core.dataset import open_dataset
from episodekit.metadata.stats import QUANTILE_KEYS, compute_stats, data_state, numeric_features
from episodekit.metadata.stats.episode_sketch import (
    POINTS,
    EpisodeSketches,
    concat,
    read_episode_sketches,
    write_sketches,
)
from episodekit.writers.plan import OutputPlan

RENUMBERED = ("index", "episode_index", "task_index")  # the writer gives them new values


def _from_sources(plan: OutputPlan, feats: dict[str, int]) -> tuple[EpisodeSketches | None, list]:
    """The output episodes' sketches of the features every source's sidecar holds for whole
    kept episodes (renumbered columns excluded), and the names of those features."""
    names = [n for n in feats if n not in RENUMBERED]
    parts = []
    for d, ds in enumerate(plan.datasets):
        pos = np.flatnonzero(plan.ds_id == d)
        if not len(pos):
            continue
        sk = read_episode_sketches(ds)
        if sk is None or sk.points_per_episode != POINTS:
            return None, []
        rows = np.searchsorted(sk.episode_index, plan.src_episode[pos])
        rows = np.minimum(rows, len(sk.episode_index) - 1)
        whole = np.array_equal(sk.episode_index[rows], plan.src_episode[pos]) and np.array_equal(
            sk.length[rows], plan.length[pos]
        )
        if not whole:  # an episode cut or missing from the sidecar: compute them all
            return None, []
        names = [n for n in names if n in sk.points and sk.points[n].shape[0] == feats[n]]
        parts.append((pos, sk.select(rows)))
    if not parts or not names:
        return None, []
    out = [
        EpisodeSketches(pos.astype(np.int64), p.length, {n: p.points[n] for n in names})
        for pos, p in parts
    ]
    return concat(out), names


def write_stats_json(
    staging: Path, plan: OutputPlan | None, stats: dict, executor: str = "local"
) -> bool:
    """Write ``staging``'s meta/stats.json from ``stats`` (feature -> key -> list) with every
    quantile key it holds of a numeric feature taken from the output episodes' sketches (from
    the sources' sidecars through ``plan``, else computed from the written columns), and the
    output's sketch sidecar; returns whether the sidecar was written. Keys ``stats`` does not
    hold are not added (a v2.1 conversion's stats have no quantiles)."""
    ds = open_dataset(str(staging))
    feats = {
        n: d
        for n, d in numeric_features(ds.info).items()
        if any(k in (stats.get(n) or {}) for k in QUANTILE_KEYS)
    }
    sidecar = False
    if feats:
        sketched, names = _from_sources(plan, feats) if plan is not None else (None, [])
        rest = [n for n in feats if n not in names]
        points = dict(sketched.points) if sketched is not None else {}
        quantiles = {n: sketched.quantiles(n) for n in names} if sketched is not None else {}
        lengths = plan.length if plan is not None else None
        if rest:
            res = compute_stats(ds, features=rest, executor=executor)
            quantiles.update({n: res.dataset[n].quantiles for n in rest})
            if res.sketches is not None:
                points.update(res.sketches.points)
                lengths = res.sketches.length
        for n, q in quantiles.items():
            for i, key in enumerate(QUANTILE_KEYS):
                if key in stats[n]:
                    stats[n][key] = q[i].tolist()
        if lengths is not None:
            index = np.arange(len(lengths), dtype=np.int64)
            meta = {
                "fingerprint": ds.fingerprint,
                "data_state": data_state(ds),
                "stats": "quantiles",
            }
            write_sketches(staging, EpisodeSketches(index, lengths, points), ds.info, meta)
            sidecar = True
    atomic_write_text(staging / "meta/stats.json", json.dumps(stats, indent=4))
    return sidecar
