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
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from episodekit.core.dataset import V3, DatasetError, is_local, read_parquet, read_schema
from episodekit.core.words import noun_for, plural
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
from episodekit.validate.stats_merge import MERGED_KEYS, EpisodeMerge

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


def _missing(what: str, missing: list[str], file: str, root: str, images: bool = False) -> Finding:
    """``stats.present`` for missing stats keys (or ``stats/<f>/<k>`` columns): an error, but
    only a warning when just the quantiles are absent. LeRobot's v2.1 -> v3.0 converter carries
    v2.1's stats over as they are (min, max, mean, std, count: v2.1 had no quantiles), so every
    converted dataset lacks them; LeRobot needs them only for QUANTILES normalization.
    ``images``: an image/video feature's, which only ``metadata stats --images`` computes."""
    if all(m.rsplit("/", 1)[-1] in QUANTILE_KEYS for m in missing):
        fix = (
            f"compute them with `episodekit metadata stats {root} --images`"
            if images
            else f"compute it with `episodekit metadata stats {root}`"
        )
        return Finding(
            "stats.present",
            WARNING,
            f"{what}: no quantiles ({', '.join(QUANTILE_KEYS)}; LeRobot's v2.1 converter writes "
            f"none), which QUANTILES normalization needs: {fix}",
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
            msg = f"{name}: {what} in {noun_for(len(dims), 'dimension')} {dims} ({ORDER_TOLERANCE})"
            out.append(Finding("stats.order", ERROR, msg, file, episode))
    return out


# Per-episode stats, one episodes file at a time: the driver holds one file's columns of one
# feature and, per file, a few numbers per check (and the merge's vectors), never every
# episode's stats (except for --deep, which compares every episode with a recomputation).
# Findings are those of the whole table sorted by episode: a check's finding names the smallest
# offending episode of every file, and a key dropped anywhere (missing, misshapen, NaN) is left
# out of the order checks everywhere (files checked with other keys are checked again).


@dataclass
class _FilePart:
    """One episodes file's summary of one feature's per-episode stats.

    ``valid``: keys present with the expected shape; ``finite``: those finite in every episode of
    the file (the keys ``order``, ``count`` and ``merge`` were computed with); ``nonfinite``: key
    -> (episodes, smallest episode); ``order``: (episodes, smallest episode, [(relation, hit)]);
    ``count``: (episodes, smallest episode, its count, its length) or None (no lengths);
    ``values``: the per-episode values, kept only for ``--deep``."""

    valid: tuple[str, ...]
    finite: tuple[str, ...]
    nonfinite: dict[str, tuple[int, int]]
    order: tuple[int, int, list[tuple[str, bool]]]
    count: tuple[int, int, int, int] | None
    merge: EpisodeMerge | None
    values: dict[str, np.ndarray] | None


@dataclass
class _EpisodeStats:
    """What the per-episode part hands on: findings, the merge per feature, and (``--deep``
    only) every episode's values sorted by episode."""

    findings: list[Finding]
    merged: dict[str, dict[str, np.ndarray] | None]
    ep: np.ndarray
    episodes: dict[str, dict[str, np.ndarray]]


def _column_values(t: pa.Table, c: str, want: int, dims: int, rel: str, ep: np.ndarray, out):
    """A stats column as ``(episodes, want)`` float64 values, or None (with a finding)."""
    col = t[c].combine_chunks()
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
            f"{c}: {plural(len(bad), 'episode')} with {lengths[bad[0]]} values, expected {want} "
            f"(feature shape [{dims}])"
        )
        out.append(Finding("stats.shape", ERROR, msg, rel, int(ep[bad[0]])))
        return None
    vals = pc.list_flatten(col).cast(pa.float64()).fill_null(np.nan).to_numpy()
    return vals.reshape(-1, want)


def _read_feature(pf, n: str, dims: int, keys, rel: str, ep: np.ndarray, out) -> dict:
    """``{key: (episodes, D) values}`` of feature ``n`` for the ``keys`` with a good shape."""
    cols = [f"stats/{n}/{k}" for k in keys]
    if not cols:
        return {}
    t = pf.read(columns=cols)
    got = {}
    for k, c in zip(keys, cols):
        v = _column_values(t, c, 1 if k == "count" else dims, dims, rel, ep, out)
        if v is not None:
            got[k] = v
    return got


def _order_summary(got: dict[str, np.ndarray], ep: np.ndarray):
    """(episodes violating an order relation, the smallest of them, [(relation, violated)])."""
    bad = np.zeros(len(ep), bool)
    hits = []
    for what, mask in _order_bad(got):
        rows = np.any(mask, axis=1)
        hits.append((what, bool(np.any(rows))))
        bad |= rows
    return int(bad.sum()), int(ep[bad].min()) if np.any(bad) else -1, hits


def _feature_part(got: dict, ep: np.ndarray, lengths: np.ndarray | None, keep: bool) -> _FilePart:
    """Summarize one file's values of one feature (see :class:`_FilePart`)."""
    valid = tuple(got)
    nonfinite = {}
    for k, v in got.items():
        bad = ~np.all(np.isfinite(v), axis=1)
        if np.any(bad):
            nonfinite[k] = (int(bad.sum()), int(ep[bad].min()))
    fin = {k: v for k, v in got.items() if k not in nonfinite}
    count = None
    if "count" in fin and lengths is not None:
        bad = np.flatnonzero(fin["count"][:, 0] != lengths)
        i = int(bad[np.argmin(ep[bad])]) if len(bad) else 0
        first = (int(ep[i]), int(fin["count"][i, 0]), int(lengths[i])) if len(bad) else (-1, 0, 0)
        count = (len(bad), *first)
    merge = None
    if set(MERGED_KEYS) <= set(fin):
        merge = EpisodeMerge()
        merge.add(fin)
    return _FilePart(
        valid,
        tuple(fin),
        nonfinite,
        _order_summary(fin, ep),
        count,
        merge,
        got if keep else None,
    )


class _Lengths:
    """Episode lengths looked up by episode index (none when the table's indices repeat)."""

    def __init__(self, raw: RawRoot):
        e = raw.episodes
        idx = e["episode_index"].to_numpy()
        self.ok = len(idx) > 0 and len(np.unique(idx)) == len(idx)
        order = np.argsort(idx, kind="stable")
        self.idx, self.length = idx[order], e["length"].to_numpy()[order]

    def of(self, ep: np.ndarray) -> np.ndarray | None:
        """The lengths of ``ep`` (None when ``ep`` repeats or names an unknown episode)."""
        if not self.ok or len(np.unique(ep)) != len(ep):
            return None
        pos = np.minimum(np.searchsorted(self.idx, ep), len(self.idx) - 1)
        return self.length[pos] if np.array_equal(self.idx[pos], ep) else None


def _open_episodes(raw: RawRoot, rel: str) -> pq.ParquetFile:
    full = raw.join(rel)
    return pq.ParquetFile(full if is_local(raw.fs) else raw.fs.open(full, "rb"))


def _scan_file(raw, rel, feats, lengths: _Lengths, keep: bool):
    """One episodes file: (its findings, episode indices, lengths known, {feature: part}), or None
    when unreadable (the ``episodes.read`` check reports it)."""
    out: list[Finding] = []
    wanted = [f"stats/{n}/{k}" for n in feats for k in STAT_KEYS]
    try:
        with _open_episodes(raw, rel) as pf:
            names = pf.schema_arrow.names
            ep = pf.read(columns=["episode_index"])["episode_index"].to_numpy()
            missing = [c for c in wanted if c not in names]
            if missing and all(c.rsplit("/", 1)[-1] in QUANTILE_KEYS for c in missing):
                out.append(_missing("per-episode stats", missing, rel, raw.root))
            elif missing:
                msg = f"{plural(len(missing), 'stats column')} missing, e.g. {missing[:3]}"
                out.append(Finding("stats.present", ERROR, msg, rel))
            ln = lengths.of(ep)
            parts = {}
            for n, dims in feats.items():
                keys = [k for k in STAT_KEYS if f"stats/{n}/{k}" in names]
                got = _read_feature(pf, n, dims, keys, rel, ep, out)
                parts[n] = _feature_part(got, ep, ln, keep)
                del got
                pa.default_memory_pool().release_unused()  # else mimalloc keeps the reads
    except (DatasetError, pa.ArrowException, OSError):
        return None
    return out, ep, ln is not None, parts


def _reorder(raw, rel, n: str, dims: int, keys: tuple, part: _FilePart, ep: np.ndarray):
    """The order summary of one file checked with the dataset's keys of ``n`` (a key was dropped
    elsewhere): from the kept values, else read again."""
    if part.values is not None:
        return _order_summary({k: part.values[k] for k in keys}, ep)
    try:
        with _open_episodes(raw, rel) as pf:
            return _order_summary(_read_feature(pf, n, dims, list(keys), rel, ep, []), ep)
    except (DatasetError, pa.ArrowException, OSError):
        return 0, -1, []


def _feature_findings(raw, n: str, dims: int, files: list, lengths_ok: bool):
    """Findings on feature ``n`` from every file's part, and the keys left (valid, finite)."""
    out: list[Finding] = []
    parts = [f[2][n] for f in files]
    keys = []
    for k in (k for k in STAT_KEYS if all(k in p.valid for p in parts)):
        bad = [p.nonfinite[k] for p in parts if k in p.nonfinite]
        if bad:
            msg = f"stats/{n}/{k}: {plural(sum(b[0] for b in bad), 'episode')} with NaN/inf"
            out.append(Finding("stats.finite", ERROR, msg, None, min(b[1] for b in bad)))
        else:
            keys.append(k)
    keys = tuple(keys)
    orders = [
        p.order if p.finite == keys else _reorder(raw, rel, n, dims, keys, p, ep)
        for (rel, ep, _), p in zip(files, parts)
    ]
    rows = sum(o[0] for o in orders)
    if rows:
        hit = {}
        for o in orders:
            for what, h in o[2]:
                hit[what] = hit.get(what, False) or h
        msg = (
            f"stats/{n}: {plural(rows, 'episode')} with "
            f"{', '.join(w for w, h in hit.items() if h)} "
            f"(min <= q01 <= ... <= q99 <= max, min <= mean <= max; {ORDER_TOLERANCE})"
        )
        first = min(o[1] for o in orders if o[0])
        out.append(Finding("stats.order", ERROR, msg, None, first))
    counts = [p.count for p in parts if p.count is not None and p.count[0]]
    if "count" in keys and lengths_ok and counts:
        first = min(counts, key=lambda c: c[1])
        msg = (
            f"stats/{n}/count: {plural(sum(c[0] for c in counts), 'episode')} whose count is "
            f"not their length (e.g. {first[2]} vs {first[3]})"
        )
        out.append(Finding("stats.count", ERROR, msg, None, first[1]))
    return out, keys


def _episode_part(raw: RawRoot, feats: dict[str, int], keep: bool = False) -> _EpisodeStats:
    """Findings on the per-episode columns, file by file, and the merge of each feature's
    stats; with ``keep`` (``--deep``) also every episode's values, sorted by episode."""
    out: list[Finding] = []
    files = []  # (rel, episode indices, {feature: _FilePart}) per readable file
    lengths_ok = True
    e = raw.episodes
    names = sorted(pc.unique(e["__file"]).to_pylist()) if e is not None else []
    lengths = _Lengths(raw) if names else None
    for rel in names:
        res = _scan_file(raw, rel, feats, lengths, keep)
        if res is None:
            continue
        found, ep, known, parts = res
        out += found
        lengths_ok &= known
        files.append((rel, ep, parts))
    if not files:
        return _EpisodeStats(out, {}, np.zeros(0, np.int64), {})
    ep = np.concatenate([f[1] for f in files])
    lengths_ok &= len(np.unique(ep)) == len(ep)
    merged: dict = {}
    episodes: dict = {}
    for n, dims in feats.items():
        found, keys = _feature_findings(raw, n, dims, files, lengths_ok)
        out += found
        merged[n] = None
        if set(MERGED_KEYS) <= set(keys):
            merge = EpisodeMerge()
            for f in files:
                merge.join(f[2][n].merge)
            merged[n] = merge.merged()
        if keep:
            order = np.argsort(ep, kind="stable")
            episodes[n] = {
                k: np.concatenate([f[2][n].values[k] for f in files])[order] for k in keys
            }
    return _EpisodeStats(out, merged, np.sort(ep, kind="stable"), episodes)


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
        f"stats/{name}: {plural(len(rows), 'episode')} with {', '.join(whats)} "
        f"(min <= q01 <= ... <= q99 <= max, min <= mean <= max; {ORDER_TOLERANCE})"
    )
    return [Finding("stats.order", ERROR, msg, None, int(ep[rows[0]]))]


def _consistency(names, dataset: dict, merged: dict) -> list[Finding]:
    """Cheap: the dataset's min/max/mean/std/count against the merge of the episodes'
    (``merged``: :meth:`EpisodeMerge.merged` per feature)."""
    out = []
    for n in names:
        d, m = dataset.get(n, {}), merged.get(n)
        if m is None or not set(MERGED_KEYS) <= set(d):
            continue
        scale = float(np.max(np.abs(np.r_[m["min"], m["max"]])))
        for k, v in m.items():
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
        f"{n}: {plural(len(found), 'stat')} {'differs' if len(found) == 1 else 'differ'} from "
        f"the data, e.g. {found[0].message}; LeRobot's "
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
                verb = "differs" if len(bad) == 1 else "differ"
                msg = f"stats/{n}/{k}: {plural(len(bad), 'episode')} {verb} from the data ({how})"
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
                        f"stats/{n}/{k}: {plural(len(bad), 'episode')} "
                        f"{'differs' if len(bad) == 1 else 'differ'} from the data "
                        f"(tolerance {TOLERANCE})",
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
            out.append(_missing(name, missing, STATS_FILE, raw.root, images=True))
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
    raw: RawRoot, feats: list[str], ours: set[str], merges: dict[str, EpisodeMerge | None]
) -> list[Finding]:
    """Findings on the per-episode image columns; the stats of ``ours`` are folded file by file
    into ``merges`` (a feature becomes None when a file has only some of ``MERGED_KEYS``)."""
    out: list[Finding] = []
    e = raw.episodes
    if e is None:
        return out
    samples = _expected_samples(raw)
    length = e["length"].to_numpy()
    ep_all = e["episode_index"].to_numpy()
    for rel in sorted(pc.unique(e["__file"]).to_pylist()):
        rows = np.flatnonzero(pc.equal(e["__file"], rel).to_numpy(zero_copy_only=False))
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
                            f"{c}: {plural(int(per[i]), 'value')} per episode, expected "
                            f"{'[1]' if k == 'count' else '[3, 1, 1] (or [3])'}",
                            rel,
                            int(ep_all[rows][i]),
                        )
                    )
                    continue
                v = vals.reshape(len(rows), -1)
                fin = np.flatnonzero(~np.all(np.isfinite(v), axis=1))
                if len(fin):
                    msg = f"{c}: {plural(len(fin), 'episode')} with NaN/inf"
                    out.append(Finding("stats.finite", ERROR, msg, rel, int(ep_all[rows][fin[0]])))
                    continue
                got[k] = v
            ep = ep_all[rows]
            if n in ours:
                _fold(merges, n, got)
            out += _order_rows(n, got, ep)
            bad = np.flatnonzero(
                np.any(
                    [np.any(_outside_unit(v), axis=1) for k, v in got.items() if k != "count"]
                    or [np.zeros(len(rows), bool)],
                    axis=0,
                )
            )
            if len(bad):
                msg = f"stats/{n}: {plural(len(bad), 'episode')} with values outside [0, 1]"
                out.append(Finding("stats.order", ERROR, msg, rel, int(ep[bad[0]])))
            if "count" in got:
                cnt = got["count"][:, 0]
                want = samples[rows] if n in ours else None
                bad = np.flatnonzero(
                    (cnt != want) if want is not None else (cnt < 1) | (cnt > length[rows])
                )
                if len(bad):
                    msg = f"stats/{n}/count: {plural(len(bad), 'episode')} whose count is not " + (
                        "LeRobot's sampled frames" if want is not None else "in 1..length"
                    )
                    out.append(Finding("stats.count", ERROR, msg, rel, int(ep[bad[0]])))
    return out


def _fold(merges: dict[str, EpisodeMerge | None], n: str, got: dict[str, np.ndarray]) -> None:
    """Fold one file's image stats of ``n`` into its merge: a file without any of
    ``MERGED_KEYS`` adds nothing, one with only some of them leaves nothing to compare."""
    have = set(MERGED_KEYS) & set(got)
    if have == set(MERGED_KEYS) and merges.get(n, EpisodeMerge()) is not None:
        merges.setdefault(n, EpisodeMerge()).add(got)
    elif have:
        merges[n] = None


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
    merges: dict[str, EpisodeMerge | None] = {}
    out = _image_dataset_part(raw, feats, ours, dataset)
    out += _image_episode_part(raw, feats, ours, merges)
    # written by --images: the dataset's stats are the sampled-frame-weighted merge of the
    # episodes' (every frame of a feature has the same size); others may use another weighting
    merged = {n: m.merged() for n, m in merges.items() if m is not None and n in dataset}
    return out + _consistency([n for n in feats if n in merged], dataset, merged)


def check_stats(raw: RawRoot, deep: bool = False, executor: str = "local") -> list[Finding]:
    """Every ``stats.*`` finding of a v3.0 root."""
    if raw.version != V3:
        return []
    feats = numeric_features(raw.info)
    if not feats:
        return check_image_stats(raw)
    out, dataset = _dataset_part(raw, feats)
    per = _episode_part(raw, feats, keep=deep)
    out += per.findings
    out += _consistency(feats, dataset, per.merged)
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
        out += _recompute(raw, feats, dataset, per.ep, per.episodes, executor)
    return out + check_image_stats(raw)


__all__ = ["QUANTILE_KEYS", "TOLERANCE", "check_stats"]
