"""``stats.recompute`` (``--deep``): the stored stats against a recomputation from the data, ours
exactly, LeRobot's the way LeRobot computes them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import DatasetError, read_parquet
from episodekit.core.words import plural
from episodekit.metadata import lerobot_stats
from episodekit.metadata.stats import (
    QUANTILE_KEYS,
    QUANTILES,
    STAT_KEYS,
    STATS_FILE,
    compute_stats,
    feature_values,
    read_summary_meta,
)
from episodekit.metadata.stats.episode_sketch import read_sketches_meta
from episodekit.validate.artifacts import dataset_from_raw
from episodekit.validate.raw import ERROR, WARNING, Finding, RawRoot
from episodekit.validate.stats_rules import (
    ATOL,
    F32_EPS,
    ORDER_TOLERANCE,
    RTOL,
    TOLERANCE,
    close_enough,
    order_tolerance,
)


def _lerobot_episode_stats(ds, feats: dict[str, int]) -> dict[str, dict[int, dict]]:
    """LeRobot's per-episode stats recomputed from the data: ``{feature: {episode: stats}}``."""
    out: dict[str, dict[int, dict]] = {n: {} for n in feats}
    for i in range(len(ds.data_files)):
        cols = ["episode_index", *(n for n in feats if n != "episode_index")]
        t = read_parquet(ds.fs, ds.data_path(i), columns=cols)
        ep = t["episode_index"].to_numpy()
        cuts = np.flatnonzero(np.diff(ep)) + 1
        starts, stops = np.r_[0, cuts], np.r_[cuts, len(ep)]
        for n, dims in feats.items():
            vals = feature_values(t[n], dims, n)
            for a, b in zip(starts, stops):
                out[n][int(ep[a])] = lerobot_stats.episode_stats(vals[a:b])
                out[n][int(ep[a])]["exact"] = _exact_episode_stats(vals[a:b])
    return out


def _exact_episode_stats(values: np.ndarray) -> dict[str, np.ndarray]:
    """One episode's stats as ``metadata stats`` writes them (float64, numpy's linear
    quantiles): an episode an editor carried over from such a source holds these."""
    x = values.reshape(len(values), -1).astype(np.float64)
    out = {"min": x.min(0), "max": x.max(0), "mean": x.mean(0), "std": x.std(0)}
    out.update(zip(QUANTILE_KEYS, np.quantile(x, QUANTILES, axis=0)))
    out["count"] = np.array([len(x)], np.float64)
    return out


def _lerobot_close(key: str, a: np.ndarray, b: np.ndarray, ref: dict) -> np.ndarray:
    """Equal up to float32 rounding of the values (LeRobot computes in the data's dtype), plus one
    histogram bin for a quantile (``order_tolerance``)."""
    scale = np.maximum(np.abs(ref["min"]), np.abs(ref["max"]))
    tol = RTOL * np.abs(b) + ATOL * (1 + scale) + 4 * F32_EPS * scale
    if key in QUANTILE_KEYS:
        tol = tol + order_tolerance(ref)
    return np.abs(a - b) <= tol


# LeRobot's editors (delete_episodes, split, aggregate) renumber these columns and keep each
# episode's recorded stats: theirs describe the old numbering. Policies never normalize them, so a
# difference there is a warning, not damage.
RENUMBERED = ("index", "episode_index", "task_index")


def _renumbered(n: str, found: list[Finding]) -> list[Finding]:
    """The findings of one feature; for a RENUMBERED column one warning saying why."""
    if n not in RENUMBERED or not found:
        return found
    msg = (
        f"{n}: {plural(len(found), 'stat')} {'differs' if len(found) == 1 else 'differ'} from "
        f"the data, e.g. {found[0].message}; LeRobot's "
        "editors renumber this column and keep the recorded stats (never normalized)"
    )
    return [Finding("stats.recompute", WARNING, msg, found[0].file, found[0].episode)]


def _exact_quantiles(ds, names: list[str], executor: str) -> dict[str, np.ndarray] | None:
    """The data's exact quantiles (5 x D) of features ``names`` (None when they cannot be
    computed: the LeRobot-way findings stand)."""
    try:
        res = compute_stats(ds, features=names, quantiles="exact", executor=executor)
    except (DatasetError, OSError, ValueError, pa.ArrowException):
        return None
    return {n: res.dataset[n].quantiles for n in names}


def _recompute_lerobot(
    raw, ds, feats, dataset, ep, episodes, ours: bool, executor: str = "local"
) -> list[Finding]:
    """``--deep`` on stats episodekit did not write: recompute them LeRobot's way (see
    metadata/lerobot_stats.py) and compare; the dataset's quantiles may be LeRobot 0.4.4's
    count-weighted mean of the episodes' or its later envelope, or the data's exact quantiles
    (``repair`` writes those; computed only for a feature whose quantiles are neither of
    LeRobot's). ``ours``: the dataset's quantiles came from the episodes' sketches (edit,
    split, merge): judged by their rank (``stats.quantile_rank``), not here."""
    try:
        per = _lerobot_episode_stats(ds, feats)
    except (DatasetError, OSError, ValueError, pa.ArrowException) as exc:
        return [Finding("stats.recompute", ERROR, f"cannot recompute: {exc}")]
    out = []
    exact_q: dict[str, np.ndarray | None] = {}
    how = f"recomputed LeRobot's way, tolerance float32 rounding + {ORDER_TOLERANCE}"
    for n in feats:
        if not per[n] or set(per[n]) != set(ep.tolist()):
            continue
        rows = [per[n][int(e)] for e in ep]
        found: list[Finding] = []
        want = {k: np.stack([r[k] for r in rows]).astype(np.float64) for k in STAT_KEYS}
        exact = {k: np.stack([r["exact"][k] for r in rows]) for k in STAT_KEYS}
        scale = float(np.max(np.abs(np.r_[exact["min"].ravel(), exact["max"].ravel()])))
        for k, v in episodes.get(n, {}).items():
            good = _lerobot_close(k, v, want[k], want) | close_enough(v, exact[k], scale)
            bad = np.flatnonzero(~np.all(good, axis=1))
            if len(bad):
                verb = "differs" if len(bad) == 1 else "differ"
                msg = f"stats/{n}/{k}: {plural(len(bad), 'episode')} {verb} from the data ({how})"
                found.append(Finding("stats.recompute", ERROR, msg, None, int(ep[bad[0]])))
        agg = lerobot_stats.aggregate([{k: v for k, v in r.items() if k != "exact"} for r in rows])
        env = lerobot_stats.envelope([{k: v for k, v in r.items() if k != "exact"} for r in rows])
        for k, v in dataset.get(n, {}).items():
            if ours and k in QUANTILE_KEYS:
                continue
            good = _lerobot_close(k, v, agg[k].astype(np.float64), agg)
            if k in env:
                good |= _lerobot_close(k, v, env[k], agg)
            if not np.all(good) and k in QUANTILE_KEYS:
                if n not in exact_q:
                    exact_q.update(_exact_quantiles(ds, [n], executor) or {n: None})
                if exact_q[n] is not None:
                    good |= close_enough(v, exact_q[n][QUANTILE_KEYS.index(k)], scale)
            if not np.all(good):
                j = int(np.flatnonzero(~good)[0])
                msg = (
                    f"{n}/{k}: stats.json has {v[j]:.9g} in dimension {j}, the data give "
                    f"{float(agg[k][j]):.9g} ({how})"
                )
                found.append(Finding("stats.recompute", ERROR, msg, STATS_FILE))
        out += _renumbered(n, found)
    return out


def recompute_findings(raw: RawRoot, feats, dataset, ep, episodes, executor: str) -> list[Finding]:
    """``--deep``: recompute every stat from the data and compare (exactly for stats episodekit
    wrote, LeRobot's way for the others)."""
    ds = dataset_from_raw(raw)
    if ds is None:
        return []
    meta = read_summary_meta(ds)
    if meta is None:
        sk = read_sketches_meta(ds) or {}
        ours = sk.get("fingerprint") == ds.fingerprint and sk.get("stats") == "quantiles"
        return _recompute_lerobot(raw, ds, feats, dataset, ep, episodes, ours, executor)
    mode = "sketch" if "sketch" in (meta.get("quantiles") or {}).values() else "exact"
    try:
        res = compute_stats(ds, features=list(feats), quantiles=mode, executor=executor)
    except (DatasetError, OSError, ValueError, pa.ArrowException) as exc:
        return [Finding("stats.recompute", ERROR, f"cannot recompute: {exc}")]
    out = []
    for n in feats:
        fs = res.dataset[n]
        scale = float(np.max(np.abs(np.r_[fs.min, fs.max])))
        want = fs.to_lerobot()
        for k in STAT_KEYS:
            if k in dataset.get(n, {}):
                bad = ~close_enough(dataset[n][k], np.asarray(want[k], dtype=np.float64), scale)
                if np.any(bad):
                    j = int(np.flatnonzero(bad)[0])
                    out.append(
                        Finding(
                            "stats.recompute",
                            ERROR,
                            f"{n}/{k}: stats.json has "
                            f"{dataset[n][k][j]:.9g} in dimension {j}, the data give "
                            f"{want[k][j]:.9g} (tolerance {TOLERANCE})",
                            STATS_FILE,
                        )
                    )
            if k not in episodes.get(n, {}) or not np.array_equal(ep, res.episode_index):
                continue
            ref = res.episode_count[:, None] if k == "count" else res.episode[n][k]
            bad = np.flatnonzero(~np.all(close_enough(episodes[n][k], ref, scale), axis=1))
            if len(bad):
                out.append(
                    Finding(
                        "stats.recompute",
                        ERROR,
                        f"stats/{n}/{k}: {plural(len(bad), 'episode')} "
                        f"{'differs' if len(bad) == 1 else 'differ'} from the data "
                        f"(tolerance {TOLERANCE})",
                        None,
                        int(ep[bad[0]]),
                    )
                )
    return out
