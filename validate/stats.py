"""Normalization statistics checks (``stats.*``): ``meta/stats.json`` and the per-episode
``stats/{feature}/{key}`` columns of ``meta/episodes`` are present, finite, shaped like the
features, ordered (min <= q01 <= ... <= q99 <= max, min <= mean <= max), count the frames, agree
with each other (cheap: the dataset's min/max/mean/std/count against the counts-weighted merge of
the episodes'), are fresh (``meta/episodekit_stats.parquet``'s fingerprint and data-file state),
and with ``--deep`` agree with a recomputation from the data. v3.0 roots only (v2.1 kept its
stats elsewhere). Tolerance for every comparison: ``|a - b| <= RTOL*|b| + ATOL*(1 + scale)``
with scale the feature's largest magnitude; it is printed in the messages. The order checks allow
one bin of LeRobot's quantile histogram (``order_tolerance``), and ``--deep`` recomputes stats
episodekit did not write the way LeRobot computes them (metadata/lerobot_stats.py).
"""

from __future__ import annotations

import json
import posixpath

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.dataset import V3, DatasetError, read_parquet, read_schema
from episodekit.metadata import lerobot_stats
from episodekit.metadata.image_stats import estimate_num_samples, image_features
from episodekit.metadata.stats import (
    ORDERED_KEYS,
    QUANTILE_KEYS,
    STAT_KEYS,
    STATS_FILE,
    compute_stats,
    feature_values,
    numeric_features,
    read_summary_meta,
    stale_reason,
)
from episodekit.validate.artifacts import dataset_from_raw
from episodekit.validate.raw import ERROR, WARNING, Finding, RawRoot

RTOL = 1e-6
ATOL = 1e-9
TOLERANCE = f"|a-b| <= {RTOL:g}*|b| + {ATOL:g}*(1+scale)"
EXAMPLES = 3


def _close(a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    return np.abs(a - b) <= RTOL * np.abs(b) + ATOL * (1 + scale)


def _values(v, dims: int, key: str) -> tuple[np.ndarray | None, str]:
    """A stats.json entry as a float vector of the expected length, or (None, why)."""
    try:
        arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        return None, f"not numbers ({str(v)[:40]})"
    want = 1 if key == "count" else dims
    if arr.size != want or arr.ndim > 1:
        return None, f"shape {list(arr.shape)}, expected [{want}]"
    return arr.reshape(want), ""


def _missing(what: str, missing: list[str], file: str, root: str) -> Finding:
    """``stats.present`` for missing stats keys (or ``stats/<f>/<k>`` columns): an error, but
    only a warning when just the quantiles are absent. LeRobot's v2.1 -> v3.0 converter carries
    v2.1's stats over as they are (min, max, mean, std, count: v2.1 had no quantiles), so every
    converted dataset lacks them; LeRobot needs them only for QUANTILES normalization."""
    if all(m.rsplit("/", 1)[-1] in QUANTILE_KEYS for m in missing):
        return Finding(
            "stats.present",
            WARNING,
            f"{what}: no quantiles ({', '.join(QUANTILE_KEYS)}; LeRobot's v2.1 converter writes "
            "none), which QUANTILES normalization needs: compute it with "
            f"`episodekit metadata stats {root}`",
            file,
        )
    return Finding("stats.present", ERROR, f"{what}: keys {missing} missing", file)


def _dataset_part(raw: RawRoot, feats: dict[str, int]) -> tuple[list[Finding], dict]:
    """Findings on stats.json and its parsed numeric stats ``{feature: {key: vector}}``."""
    out: list[Finding] = []
    full = raw.join(STATS_FILE)

    def err(check: str, msg: str) -> None:
        out.append(Finding(check, ERROR, msg, STATS_FILE))

    if not raw.fs.exists(full):
        err("stats.present", f"missing; compute it with `episodekit metadata stats {raw.root}`")
        return out, {}
    try:
        with raw.fs.open(full, "rb") as fh:
            data = json.loads(fh.read())
    except (ValueError, UnicodeDecodeError, OSError) as exc:
        err("stats.present", f"not valid JSON ({exc})")
        return out, {}
    if not isinstance(data, dict):
        err("stats.present", "not a JSON object")
        return out, {}
    parsed: dict[str, dict[str, np.ndarray]] = {}
    for name, dims in feats.items():
        entry = data.get(name)
        missing = [k for k in STAT_KEYS if not isinstance(entry, dict) or k not in entry]
        if missing:
            out.append(_missing(name, missing, STATS_FILE, raw.root))
        if not isinstance(entry, dict):
            continue
        got: dict[str, np.ndarray] = {}
        for key in STAT_KEYS:
            if key not in entry:
                continue
            arr, why = _values(entry[key], dims, key)
            if arr is None:
                err("stats.shape", f"{name}/{key}: {why} (feature shape [{dims}])")
                continue
            if not np.all(np.isfinite(arr)):
                err("stats.finite", f"{name}/{key}: not finite ({arr.tolist()[:6]})")
                continue
            got[key] = arr
        parsed[name] = got
        out += _order(name, got, STATS_FILE)
        if "count" in got and raw.episodes is not None:
            frames = int(pc.sum(raw.episodes["length"]).as_py() or 0)
            if int(got["count"][0]) != frames:
                err(
                    "stats.count",
                    f"{name}/count is {int(got['count'][0])}, the dataset has {frames} frames",
                )
    return out, parsed


# LeRobot's quantiles (``compute_stats.py``, RunningQuantileStats): a 5000-bin histogram per
# dimension with edges ``min - 1e-10 .. max + 1e-10``, quantiles interpolated inside a bin. So a
# quantile is only known to within one bin width, ``(max - min + 2e-10) / 5000``, and may sit up
# to the 1e-10 padding outside [min, max] (q99 = 4e-14 where min = max = 0). It computes in the
# feature's dtype (float32 for LeRobot's default), so one float32 rounding step of the values'
# magnitude is allowed too. A violation beyond that is damage, not rounding.
LEROBOT_BINS = 5000
LEROBOT_PAD = 1e-10
F32_EPS = float(np.finfo(np.float32).eps)
ORDER_TOLERANCE = (
    f"tolerance (max-min+2e-10)/{LEROBOT_BINS} + {LEROBOT_PAD:g} + float32 eps*|max value|: "
    "one bin of LeRobot's quantile histogram"
)


def order_tolerance(got: dict[str, np.ndarray]) -> np.ndarray | float:
    """Per-dimension slack of the order checks (see ``ORDER_TOLERANCE``), shaped like the stats."""
    if not {"min", "max"} <= set(got):
        return LEROBOT_PAD
    lo, hi = got["min"], got["max"]
    width = (np.abs(hi - lo) + 2 * LEROBOT_PAD) / LEROBOT_BINS
    return width + LEROBOT_PAD + F32_EPS * np.maximum(np.abs(lo), np.abs(hi))


def _order_bad(got: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    """``(what, bad mask)`` for each order relation violated beyond ``order_tolerance``."""
    tol = order_tolerance(got)
    out = []
    keys = [k for k in ORDERED_KEYS if k in got]
    for a, b in zip(keys, keys[1:]):
        out.append((f"{a} > {b}", got[a] > got[b] + tol))
    if {"min", "mean", "max"} <= set(got):
        out.append(
            (
                "mean outside [min, max]",
                (got["mean"] < got["min"] - tol) | (got["mean"] > got["max"] + tol),
            )
        )
    if "std" in got:
        out.append(("negative std", got["std"] < 0))
    return out


def _order(name: str, got: dict[str, np.ndarray], file: str, episode=None) -> list[Finding]:
    """min <= q01 <= ... <= q99 <= max, min <= mean <= max (within one LeRobot histogram bin),
    std >= 0."""
    out = []
    for what, bad in _order_bad(got):
        if np.any(bad):
            dims = np.flatnonzero(bad).tolist()[:6]
            msg = f"{name}: {what} in dimension(s) {dims} ({ORDER_TOLERANCE})"
            out.append(Finding("stats.order", ERROR, msg, file, episode))
    return out


def _read_episode_file(raw: RawRoot, rel: str, feats: dict[str, int], out: list[Finding]):
    """One episodes file's ``episode_index`` and stats columns (None when unreadable: the
    ``episodes.read`` check reports it); missing columns become a finding."""
    full = raw.join(rel)
    wanted = [f"stats/{n}/{k}" for n in feats for k in STAT_KEYS]
    try:
        names = read_schema(raw.fs, full).names
        present = [c for c in wanted if c in names]
        t = read_parquet(raw.fs, full, columns=["episode_index", *present])
    except (DatasetError, pa.ArrowException, OSError):
        return None
    missing = [c for c in wanted if c not in names]
    if missing and all(c.rsplit("/", 1)[-1] in QUANTILE_KEYS for c in missing):
        out.append(_missing("per-episode stats", missing, rel, raw.root))
    elif missing:
        msg = f"{len(missing)} stats columns missing, e.g. {missing[:3]}"
        out.append(Finding("stats.present", ERROR, msg, rel))
    return t


def _column_values(t: pa.Table, c: str, want: int, dims: int, rel: str, out: list[Finding]):
    """A stats column as ``(episodes, want)`` float64 values, or None (with a finding)."""
    col = t[c].combine_chunks()
    ep = t["episode_index"].to_numpy()
    if not (
        pa.types.is_list(col.type)
        or pa.types.is_large_list(col.type)
        or pa.types.is_fixed_size_list(col.type)
    ):
        msg = f"{c}: type {col.type}, expected a list per episode"
        out.append(Finding("stats.shape", ERROR, msg, rel))
        return None
    lengths = pc.list_value_length(col).fill_null(-1).to_numpy()
    bad = np.flatnonzero(lengths != want)
    if len(bad):
        msg = (
            f"{c}: {len(bad)} episode(s) with {lengths[bad[0]]} values, expected {want} "
            f"(feature shape [{dims}])"
        )
        out.append(Finding("stats.shape", ERROR, msg, rel, int(ep[bad[0]])))
        return None
    vals = pc.list_flatten(col).cast(pa.float64()).fill_null(np.nan).to_numpy()
    return vals.reshape(-1, want)


def _episode_feature(
    n: str, got: dict[str, np.ndarray], ep: np.ndarray, lengths: np.ndarray | None
) -> list[Finding]:
    """Finite, ordered and counted per-episode stats of one feature (drops non-finite keys)."""
    out: list[Finding] = []
    for k, v in list(got.items()):
        bad = np.flatnonzero(~np.all(np.isfinite(v), axis=1))
        if len(bad):
            msg = f"stats/{n}/{k}: {len(bad)} episode(s) with NaN/inf"
            out.append(Finding("stats.finite", ERROR, msg, None, int(ep[bad[0]])))
            del got[k]
    out += _order_rows(n, got, ep)
    if "count" in got and lengths is not None:
        bad = np.flatnonzero(got["count"][:, 0] != lengths)
        if len(bad):
            msg = (
                f"stats/{n}/count: {len(bad)} episode(s) whose count is not their length "
                f"(e.g. {int(got['count'][bad[0], 0])} vs {int(lengths[bad[0]])})"
            )
            out.append(Finding("stats.count", ERROR, msg, None, int(ep[bad[0]])))
    return out


def _episode_part(
    raw: RawRoot, feats: dict[str, int]
) -> tuple[list[Finding], np.ndarray, dict[str, dict[str, np.ndarray]]]:
    """Findings on the per-episode columns, and the parsed ``(episodes, D)`` values."""
    out: list[Finding] = []
    eps_all: list[np.ndarray] = []
    cols_all: dict[str, dict[str, list[np.ndarray]]] = {n: {} for n in feats}
    ok_all: dict[str, dict[str, bool]] = {n: dict.fromkeys(STAT_KEYS, True) for n in feats}
    files = sorted(set(raw.episodes["__file"].to_pylist())) if raw.episodes is not None else []
    for rel in files:
        t = _read_episode_file(raw, rel, feats, out)
        if t is None:
            continue
        eps_all.append(t["episode_index"].to_numpy())
        for n, dims in feats.items():
            for k in STAT_KEYS:
                c = f"stats/{n}/{k}"
                v = None
                if c in t.column_names:
                    v = _column_values(t, c, 1 if k == "count" else dims, dims, rel, out)
                if v is None:
                    ok_all[n][k] = False
                else:
                    cols_all[n].setdefault(k, []).append(v)
    if not eps_all:
        return out, np.zeros(0, np.int64), {}
    ep = np.concatenate(eps_all)
    order = np.argsort(ep, kind="stable")
    parsed: dict[str, dict[str, np.ndarray]] = {}
    lengths = _lengths_by_episode(raw, ep[order])
    for n in feats:
        got = {k: np.concatenate(v)[order] for k, v in cols_all[n].items() if ok_all[n][k]}
        out += _episode_feature(n, got, ep[order], lengths)
        parsed[n] = got
    return out, ep[order], parsed


def _lengths_by_episode(raw: RawRoot, ep: np.ndarray) -> np.ndarray | None:
    """Each listed episode's length (None when episode indices repeat: episodes.index says so)."""
    e = raw.episodes
    idx = e["episode_index"].to_numpy()
    if len(np.unique(idx)) != len(idx) or len(np.unique(ep)) != len(ep):
        return None
    length = e["length"].to_numpy()
    order = np.argsort(idx, kind="stable")
    pos = np.searchsorted(idx[order], ep)
    pos = np.minimum(pos, len(idx) - 1)
    if len(idx) == 0 or not np.array_equal(idx[order][pos], ep):
        return None
    return length[order][pos]


def _order_rows(name: str, got: dict[str, np.ndarray], ep: np.ndarray) -> list[Finding]:
    bad = np.zeros(len(ep), bool)
    whats = []
    for what, mask in _order_bad(got):
        rows = np.any(mask, axis=1)
        if np.any(rows):
            whats.append(what)
        bad |= rows
    rows = np.flatnonzero(bad)
    if not len(rows):
        return []
    msg = (
        f"stats/{name}: {len(rows)} episode(s) with {', '.join(whats)} "
        f"(min <= q01 <= ... <= q99 <= max, min <= mean <= max; {ORDER_TOLERANCE})"
    )
    return [Finding("stats.order", ERROR, msg, None, int(ep[rows[0]]))]


def _consistency(feats: dict[str, int], dataset: dict, episodes: dict) -> list[Finding]:
    """Cheap: the dataset's min/max/mean/std/count against the merge of the episodes'."""
    out = []
    for n in feats:
        d, e = dataset.get(n, {}), episodes.get(n, {})
        if not {"min", "max", "mean", "std", "count"} <= set(d) & set(e):
            continue
        w = e["count"][:, 0].astype(np.float64)
        total = w.sum()
        if total <= 0:
            continue
        mean = (e["mean"] * w[:, None]).sum(0) / total
        var = ((e["std"] ** 2 + (e["mean"] - mean) ** 2) * w[:, None]).sum(0) / total
        merged = {
            "min": e["min"].min(0),
            "max": e["max"].max(0),
            "mean": mean,
            "std": np.sqrt(var),
            "count": np.array([total]),
        }
        scale = float(np.max(np.abs(np.r_[merged["min"], merged["max"]])))
        for k, v in merged.items():
            bad = ~_close(d[k], v, scale)
            if np.any(bad):
                j = int(np.flatnonzero(bad)[0])
                out.append(
                    Finding(
                        "stats.consistent",
                        ERROR,
                        f"{n}/{k}: stats.json has "
                        f"{d[k][j]:.9g} in dimension {j}, the episodes' stats merge "
                        f"to {v[j]:.9g} (tolerance {TOLERANCE})",
                        STATS_FILE,
                    )
                )
    return out


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
        f"{n}: {len(found)} stats differ from the data, e.g. {found[0].message}; LeRobot's "
        "editors renumber this column and keep the recorded stats (never normalized)"
    )
    return [Finding("stats.recompute", WARNING, msg, found[0].file, found[0].episode)]


def _recompute_lerobot(raw, ds, feats, dataset, ep, episodes) -> list[Finding]:
    """``--deep`` on stats episodekit did not write: recompute them LeRobot's way (see
    metadata/lerobot_stats.py) and compare; the dataset's quantiles may be LeRobot 0.4.4's
    count-weighted mean of the episodes' or its later envelope."""
    try:
        per = _lerobot_episode_stats(ds, feats)
    except (DatasetError, OSError, ValueError, pa.ArrowException) as exc:
        return [Finding("stats.recompute", ERROR, f"cannot recompute: {exc}")]
    out = []
    how = f"recomputed LeRobot's way, tolerance float32 rounding + {ORDER_TOLERANCE}"
    for n in feats:
        if not per[n] or set(per[n]) != set(ep.tolist()):
            continue
        rows = [per[n][int(e)] for e in ep]
        found: list[Finding] = []
        want = {k: np.stack([r[k] for r in rows]).astype(np.float64) for k in STAT_KEYS}
        for k, v in episodes.get(n, {}).items():
            bad = np.flatnonzero(~np.all(_lerobot_close(k, v, want[k], want), axis=1))
            if len(bad):
                msg = f"stats/{n}/{k}: {len(bad)} episode(s) differ from the data ({how})"
                found.append(Finding("stats.recompute", ERROR, msg, None, int(ep[bad[0]])))
        agg = lerobot_stats.aggregate(rows)
        env = lerobot_stats.envelope(rows)
        for k, v in dataset.get(n, {}).items():
            good = _lerobot_close(k, v, agg[k].astype(np.float64), agg)
            if k in env:
                good |= _lerobot_close(k, v, env[k], agg)
            if not np.all(good):
                j = int(np.flatnonzero(~good)[0])
                msg = (
                    f"{n}/{k}: stats.json has {v[j]:.9g} in dimension {j}, the data give "
                    f"{float(agg[k][j]):.9g} ({how})"
                )
                found.append(Finding("stats.recompute", ERROR, msg, STATS_FILE))
        out += _renumbered(n, found)
    return out


def _recompute(raw: RawRoot, feats, dataset, ep, episodes, executor: str) -> list[Finding]:
    """``--deep``: recompute every stat from the data and compare (exactly for stats episodekit
    wrote, LeRobot's way for the others)."""
    ds = dataset_from_raw(raw)
    if ds is None:
        return []
    meta = read_summary_meta(ds)
    if meta is None:
        return _recompute_lerobot(raw, ds, feats, dataset, ep, episodes)
    mode = "sketch" if "sketch" in (meta.get("quantiles") or {}).values() else "exact"
    try:
        res = compute_stats(ds, list(feats), quantiles=mode, executor=executor)
    except (DatasetError, OSError, ValueError, pa.ArrowException) as exc:
        return [Finding("stats.recompute", ERROR, f"cannot recompute: {exc}")]
    out = []
    for n in feats:
        fs = res.dataset[n]
        scale = float(np.max(np.abs(np.r_[fs.min, fs.max])))
        want = fs.to_lerobot()
        for k in STAT_KEYS:
            if k in dataset.get(n, {}):
                bad = ~_close(dataset[n][k], np.asarray(want[k], dtype=np.float64), scale)
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
            bad = np.flatnonzero(~np.all(_close(episodes[n][k], ref, scale), axis=1))
            if len(bad):
                out.append(
                    Finding(
                        "stats.recompute",
                        ERROR,
                        f"stats/{n}/{k}: {len(bad)} "
                        f"episode(s) differ from the data (tolerance {TOLERANCE})",
                        None,
                        int(ep[bad[0]]),
                    )
                )
    return out


# --------------------------------------------------------------------------------------------
# Image/video features: checked where their stats exist (they are written with --images)


def _image_values(v, key: str) -> tuple[np.ndarray | None, str]:
    """An image stat as a channel vector: stats.json needs LeRobot's ``(C, 1, 1)`` (C 3 or 1),
    count ``[N]``."""
    try:
        arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        return None, f"not numbers ({str(v)[:40]})"
    if key == "count":
        return (arr.reshape(1), "") if arr.shape == (1,) else (None, f"shape {list(arr.shape)}")
    if arr.shape not in ((3, 1, 1), (1, 1, 1)):
        return None, f"shape {list(arr.shape)}, expected [3, 1, 1] (or [1, 1, 1])"
    return arr.reshape(-1), ""


# LeRobot's image quantiles come from the same padded histogram (values / 255 in [0, 1]): a
# quantile may sit the padding plus one bin (of at most 1.0 / 5000) outside [0, 1].
UNIT_SLACK = (1 + 2 * LEROBOT_PAD) / LEROBOT_BINS + LEROBOT_PAD


def _outside_unit(v: np.ndarray) -> np.ndarray:
    return (v < -UNIT_SLACK) | (v > 1 + UNIT_SLACK)


def _image_range(name: str, got: dict[str, np.ndarray], file, episode=None) -> list[Finding]:
    bad = [k for k, v in got.items() if k != "count" and np.any(_outside_unit(v))]
    if not bad:
        return []
    msg = f"{name}: {bad} outside [0, 1] (image stats are pixel values / 255; {UNIT_SLACK:g} slack)"
    return [Finding("stats.order", ERROR, msg, file, episode)]


def _expected_samples(raw: RawRoot) -> np.ndarray | None:
    """LeRobot's sampled frames per episode (what ``count`` of image stats is), in table order."""
    if raw.episodes is None:
        return None
    return np.array([estimate_num_samples(int(n)) for n in raw.episodes["length"].to_numpy()])


def _image_dataset_part(
    raw: RawRoot, feats: list[str], ours: set[str], parsed: dict
) -> list[Finding]:
    """Findings on the image entries of stats.json; their values go into ``parsed``."""
    out: list[Finding] = []
    try:
        with raw.fs.open(raw.join(STATS_FILE), "rb") as fh:
            data = json.loads(fh.read())
    except (ValueError, UnicodeDecodeError, OSError):
        return out  # stats.present reports it
    samples = _expected_samples(raw)
    for name in feats:
        entry = data.get(name) if isinstance(data, dict) else None
        if not isinstance(entry, dict):
            continue  # image stats are optional (computed with --images)
        missing = [k for k in STAT_KEYS if k not in entry]
        if missing:
            out.append(_missing(name, missing, STATS_FILE, raw.root))
        got = {}
        for key in STAT_KEYS:
            if key not in entry:
                continue
            arr, why = _image_values(entry[key], key)
            if arr is None:
                out.append(Finding("stats.shape", ERROR, f"{name}/{key}: {why}", STATS_FILE))
            elif not np.all(np.isfinite(arr)):
                out.append(Finding("stats.finite", ERROR, f"{name}/{key}: not finite", STATS_FILE))
            else:
                got[key] = arr
        parsed[name] = got
        out += _order(name, got, STATS_FILE) + _image_range(name, got, STATS_FILE)
        if "count" in got and samples is not None:
            n, want = int(got["count"][0]), int(samples.sum())
            frames = int(raw.episodes["length"].to_numpy().sum())
            if (name in ours and n != want) or not 1 <= n <= frames:
                msg = f"{name}/count is {n}: " + (
                    f"LeRobot's sampling gives {want} sampled frames"
                    if name in ours
                    else f"expected 1..{frames} (sampled frames)"
                )
                out.append(Finding("stats.count", ERROR, msg, STATS_FILE))
    return out


def _flat_channels(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode values of a (nested) list column: (values flattened, values per episode)."""
    lengths = None
    while (
        pa.types.is_list(col.type)
        or pa.types.is_large_list(col.type)
        or (pa.types.is_fixed_size_list(col.type))
    ):
        if lengths is None:
            lengths = pc.list_value_length(col).fill_null(0).to_numpy().astype(np.int64)
        else:  # inner lists must hold one value each ((C, 1, 1)): count leaves per episode
            inner = pc.list_value_length(col).fill_null(0).to_numpy().astype(np.int64)
            if np.any(inner != 1):
                return np.zeros(0), np.full(len(lengths), -1)
        col = pc.list_flatten(col)
    vals = col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
    return vals, lengths if lengths is not None else np.full(len(vals), -1)


def _image_episode_part(
    raw: RawRoot, feats: list[str], ours: set[str], parsed: dict
) -> list[Finding]:
    """Findings on the per-episode image columns; their values go into ``parsed``
    (``{feature: {key: [(episodes, C) per file]}}``)."""
    out: list[Finding] = []
    e = raw.episodes
    if e is None:
        return out
    samples = _expected_samples(raw)
    length = e["length"].to_numpy()
    ep_all = e["episode_index"].to_numpy()
    for rel in sorted(set(e["__file"].to_pylist())):
        rows = np.flatnonzero(np.asarray(e["__file"].to_pylist()) == rel)
        full = raw.join(rel)
        try:
            names = read_schema(raw.fs, full).names
            cols = [f"stats/{n}/{k}" for n in feats for k in STAT_KEYS]
            present = [c for c in cols if c in names]
            if not present:
                continue
            t = read_parquet(raw.fs, full, columns=present)
        except (DatasetError, pa.ArrowException, OSError):
            continue  # episodes.read reports it
        if t.num_rows != len(rows):
            continue
        for n in feats:
            got = {}
            for k in STAT_KEYS:
                c = f"stats/{n}/{k}"
                if c not in present:
                    continue
                vals, per = _flat_channels(t[c].combine_chunks())
                want = (1,) if k == "count" else (3, 1)
                bad = np.flatnonzero(~np.isin(per, want))
                if len(bad) or len(vals) != int(per.sum()) or len(set(per.tolist())) > 1:
                    i = int(bad[0]) if len(bad) else 0
                    out.append(
                        Finding(
                            "stats.shape",
                            ERROR,
                            f"{c}: {per[i]} value(s) per episode, expected "
                            f"{'[1]' if k == 'count' else '[3, 1, 1] (or [3])'}",
                            rel,
                            int(ep_all[rows][i]),
                        )
                    )
                    continue
                v = vals.reshape(len(rows), -1)
                fin = np.flatnonzero(~np.all(np.isfinite(v), axis=1))
                if len(fin):
                    msg = f"{c}: {len(fin)} episode(s) with NaN/inf"
                    out.append(Finding("stats.finite", ERROR, msg, rel, int(ep_all[rows][fin[0]])))
                    continue
                got[k] = v
            ep = ep_all[rows]
            for k, v in got.items():
                parsed.setdefault(n, {}).setdefault(k, []).append(v)
            out += _order_rows(n, got, ep)
            bad = np.flatnonzero(
                np.any(
                    [np.any(_outside_unit(v), axis=1) for k, v in got.items() if k != "count"]
                    or [np.zeros(len(rows), bool)],
                    axis=0,
                )
            )
            if len(bad):
                msg = f"stats/{n}: {len(bad)} episode(s) with values outside [0, 1]"
                out.append(Finding("stats.order", ERROR, msg, rel, int(ep[bad[0]])))
            if "count" in got:
                cnt = got["count"][:, 0]
                want = samples[rows] if n in ours else None
                bad = np.flatnonzero(
                    (cnt != want) if want is not None else (cnt < 1) | (cnt > length[rows])
                )
                if len(bad):
                    msg = f"stats/{n}/count: {len(bad)} episode(s) whose count is not " + (
                        "LeRobot's sampled frames" if want is not None else "in 1..length"
                    )
                    out.append(Finding("stats.count", ERROR, msg, rel, int(ep[bad[0]])))
    return out


def check_image_stats(raw: RawRoot) -> list[Finding]:
    """Image/video stats where present: LeRobot's shapes, finite, in [0, 1], ordered, count of
    sampled frames (exactly LeRobot's sampling when episodekit wrote them)."""
    feats = list(image_features(raw.info))
    if not feats or raw.version != V3:
        return []
    ds = dataset_from_raw(raw)
    rec = ((read_summary_meta(ds) if ds is not None else None) or {}).get("images") or {}
    fresh = ds is not None and rec.get("fingerprint") == ds.fingerprint
    ours = set(rec.get("features") or {}) if fresh else set()
    dataset: dict = {}
    episodes: dict = {}
    out = _image_dataset_part(raw, feats, ours, dataset)
    out += _image_episode_part(raw, feats, ours, episodes)
    # written by --images: the dataset's stats are the sampled-frame-weighted merge of the
    # episodes' (every frame of a feature has the same size); others may use another weighting
    merged = {
        n: {k: np.concatenate(v) for k, v in episodes.get(n, {}).items()}
        for n in ours
        if n in dataset and n in episodes
    }
    return out + _consistency({n: 3 for n in merged}, dataset, merged)


def check_stats(raw: RawRoot, deep: bool = False, executor: str = "local") -> list[Finding]:
    """Every ``stats.*`` finding of a v3.0 root."""
    if raw.version != V3:
        return []
    feats = numeric_features(raw.info)
    if not feats:
        return check_image_stats(raw)
    out, dataset = _dataset_part(raw, feats)
    more, ep, episodes = _episode_part(raw, feats)
    out += more
    out += _consistency(feats, dataset, episodes)
    ds = dataset_from_raw(raw)
    meta = read_summary_meta(ds) if ds is not None else None
    if ds is not None and meta is not None:
        why = stale_reason(ds, meta)
        if why:
            out.append(
                Finding(
                    "stats.fresh",
                    ERROR,
                    f"stale: {why}; recompute with `episodekit metadata stats {raw.root} --force`",
                    posixpath.join("meta", "episodekit_stats.parquet"),
                )
            )
    if deep:
        out += _recompute(raw, feats, dataset, ep, episodes, executor)
    return out + check_image_stats(raw)


__all__ = ["QUANTILE_KEYS", "TOLERANCE", "check_stats"]
