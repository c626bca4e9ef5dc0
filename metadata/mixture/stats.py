"""Normalization stats of a mixture, weighted as sampled: ``DIR/stats.json`` beside its plan.

A mixture draws ``quota_i`` frames of source ``i`` per epoch (:func:`mixture.summarize`: the
spec's weights, ``balance`` and ``overflow`` over the selected episodes, ``epoch_frames`` as
written, not rounded to a plan's bins). The stats are those of that epoch's frames: every frame
of source ``i`` counts ``quota_i / frames_i`` times, so a source drawn 3x counts 3x. With whole
repeats they equal numpy's over the sources' selected frames repeated by their repeats; with
fractional repeats, the same formulas with fractional frame weights (``count`` is the epoch,
``sum(quota)``).

- mean/std: counts-weighted parallel merge (Chan et al.) of per-batch moments, exact up to
  float rounding; min/max over the selected frames (a weight changes neither);
- quantiles: from the merged per-source rank summaries (:func:`stats.merge_stats`), each
  weighted by its source's ``quota / frames``, never an envelope. With ``quantiles="exact"``
  while the selected columns fit ``memory_mb`` every summary is the sorted data itself and the
  quantiles are exact (``np.quantile``'s linear rule over the weighted frames). Otherwise
  (``"sketch"``, or beyond the budget) a source whose per-episode sketches are fresh
  (``meta/episodekit_sketches.parquet``, :mod:`.sketched`) brings its selected episodes'
  sketches and per-episode moments and none of its data is read (rank error about 1/256 of
  its frames plus one point's weight); a source without them (LeRobot-written) is read once,
  each batch (about 64 MiB) compacted to ``sketch_points`` (8192) order statistics. The merged
  bound is recorded, and each source's row says what was read (``read``: ``data`` or ``sketches``);
- features: the mixture's names (``rename``, ``drop``, ``pad_to`` as the loader's FeatureMap
  applies them); numeric one-dimensional features only (images/videos have no mixture stats).
  A ``pad_to`` feature has ``pad_to`` dimensions; dimension ``d`` counts only the sources
  whose vector is longer than ``d`` (padding is not data); a dimension no source has gets the
  padding's own stats (all 0). Per-dimension counts are in the metadata file;
- the sources' ``episodes``/``tasks`` filters are honoured: only the selected episodes' rows
  are read (each data file that holds one, row filtered), so the stats never depend on what a
  source's own ``meta/stats.json`` says.

Files in ``DIR`` (the mixture plan's ``--out``): ``stats.json`` in LeRobot's ``meta/stats.json``
shapes (``{feature: {min, max, mean, std, count: [N], q01 ... q99}}``) and ``stats_meta.json``:
the normalized spec, every source's fingerprint, data state, weight, effective weight, quota and
repeats, per feature the quantile mode and rank-error bound, and the digest of ``stats.json``.
Both are written atomically (stats first; the metadata, written last, vouches for it), by the
global main process only. A rerun with the same spec and unchanged sources keeps them; a changed
source makes them stale, the reason naming the source.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from episodekit.core.atomic import atomic_write_bytes
from episodekit.core.dataset import Dataset, DatasetError
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.parquet_read import open_data_file
from episodekit.core.words import plural
from episodekit.core.world import rank_info
from episodekit.metadata.mixture.sketched import sketched_source_stats
from episodekit.metadata.mixture.spec import (
    MIXTURE_FILE,
    MixtureError,
    MixtureSpec,
    ResolvedSource,
    mixture_fingerprint,
    parse_mixture,
    renamed_features,
    resolve_sources,
    summarize,
)
from episodekit.metadata.stats import (
    DEFAULT_MEMORY_MB,
    NON_NUMERIC_DTYPES,
    QUANTILE_KEYS,
    QUANTILE_MODES,
    QUANTILES,
    FeatureStats,
    Sketch,
    block_rows,
    data_state,
    feature_values,
    merge_stats,
    pick_features,
)

MIXTURE_STATS_FILE = "stats.json"
MIXTURE_STATS_META = "stats_meta.json"
MIXTURE_STATS_FORMAT = "episodekit.mixture_stats"
MIXTURE_STATS_VERSION = 1
SKETCH_POINTS = 8192  # order statistics kept per batch beyond the budget: ~1e-4 rank error at 10M
BYTES_PER_VALUE = 40  # a kept value: float64 value + weight, their merged copies, a sort index


# --------------------------------------------------------------------------------------------
# One source: stats of its selected episodes


def _part(values: np.ndarray, exact: bool, points: int) -> FeatureStats:
    """Stats of one batch ``(n, D)`` (float64) with its rank summary: the sorted data itself
    (``exact``) or compacted to ``points`` values per dimension."""
    n, dims = values.shape
    mean = values.mean(0)
    cols = np.sort(values, axis=0).T
    sketches = []
    for d in range(dims):
        s = Sketch(cols[d].copy(), np.ones(n), 0.0)
        sketches.append(s if exact else s.compact(points))
    return FeatureStats(
        count=n,
        mass=float(n),
        mean=mean,
        m2=((values - mean) ** 2).sum(0),
        min=cols[:, 0].copy(),
        max=cols[:, -1].copy(),
        quantiles=np.zeros((len(QUANTILES), dims)),
        sketches=sketches,
    )


def source_stats(
    ds: Dataset,
    features: dict[str, int],
    episodes: np.ndarray | None = None,
    exact: bool = True,
    sketch_points: int = SKETCH_POINTS,
    batch_rows: int | None = None,
) -> dict[str, FeatureStats]:
    """Stats of ``features`` (``{name: dims}``, the source's own names) over the rows of
    ``episodes`` (all when None): one bounded pass over the data files holding them, rows
    filtered by ``episode_index``. Summaries are the data (``exact``) or compacted per batch."""
    ep_all = ds.column("episode_index").astype(np.int64)
    keep = ep_all if episodes is None else np.asarray(episodes, dtype=np.int64)
    file_ids = ds.column("file_id")[np.isin(ep_all, keep)]
    rows = batch_rows or block_rows(ds.info, features)
    parts: list[dict[str, FeatureStats]] = []
    for fid in sorted(set(file_ids.tolist())):
        with open_data_file(ds.join(ds.data_files[fid]), ds.fs) as df:
            for batch in df.batches(rows, ["episode_index", *features]):
                ep = batch.column("episode_index").to_numpy(zero_copy_only=False)
                sel = np.isin(ep, keep)
                if not sel.any():
                    continue
                part = {}
                for name, dims in features.items():
                    values = feature_values(batch.column(name), dims, name).astype(np.float64)
                    part[name] = _part(values if sel.all() else values[sel], exact, sketch_points)
                parts.append(part)
    if not parts:
        raise DatasetError("the selected episodes have no rows in the data files", ds.root)
    return merge_stats(parts)


# --------------------------------------------------------------------------------------------
# The feature mapping (the loader's FeatureMap, for numeric features)


def _shape(f: dict) -> list[int]:
    return [int(x) for x in (f.get("shape") or [1])]


def mixture_features(
    spec: MixtureSpec, datasets: list[Dataset], only: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """``{mixture feature: {"dims": D, "source_names": [name in source i], "widths": [w_i]}}``
    for the numeric one-dimensional features of the mixture (after rename/drop/pad_to); the
    errors of the loader's FeatureMap for a key a source lacks or shapes that differ."""
    where = spec.where
    mapped: list[dict[str, str]] = []  # mixture name -> source name, per source
    for i, ds in enumerate(datasets):
        mapped.append({v: k for k, v in renamed_features(spec, i, ds.features).items()})
    drop = {k for k, o in spec.features.items() if o.get("drop")}
    pad_to = {k: int(o["pad_to"]) for k, o in spec.features.items() if "pad_to" in o}
    union: list[str] = []
    for m in mapped:
        union += [k for k in m if k not in union and k not in drop]
    out: dict[str, dict[str, Any]] = {}
    for key in union:
        missing = [s.name for s, m in zip(spec.sources, mapped) if key not in m]
        if missing:
            i = spec.names.index(missing[0])
            raise MixtureError(
                f"{where}: source {missing[0]!r} has no feature {key!r}: map one of its features "
                f"to it with sources[{i}].rename, or drop it with features.{key}.drop"
            )
        feats = [ds.features[m[key]] for ds, m in zip(datasets, mapped)]
        numeric = [f.get("dtype") not in NON_NUMERIC_DTYPES and len(_shape(f)) == 1 for f in feats]
        if not any(numeric):
            continue
        if not all(numeric):
            raise MixtureError(f"{where}: feature {key!r} is a numeric vector in some sources only")
        widths = [_shape(f)[0] for f in feats]
        if key in pad_to:
            dims = pad_to[key]
            for name, w in zip(spec.names, widths):
                if w > dims:
                    raise MixtureError(
                        f"{where}: features.{key}.pad_to {dims}: source {name!r} has shape [{w}] "
                        f"(pad_to takes vectors of at most {dims} values)"
                    )
        elif len(set(widths)) > 1:
            desc = ", ".join(f"{n!r} [{w}]" for n, w in zip(spec.names, widths))
            raise MixtureError(
                f"{where}: feature {key!r} has different shapes ({desc}): declare "
                f"features.{key}.pad_to"
            )
        else:
            dims = widths[0]
        out[key] = {"dims": dims, "source_names": [m[key] for m in mapped], "widths": widths}
    out = pick_features(out, only, "this mixture")
    if not out:
        raise MixtureError(f"{where}: the mixture has no numeric one-dimensional features")
    return out


# --------------------------------------------------------------------------------------------
# Weighting and merging


def _slice(fs: FeatureStats, lo: int, hi: int) -> FeatureStats:
    return FeatureStats(
        count=fs.count,
        mass=fs.mass,
        mean=fs.mean[lo:hi],
        m2=fs.m2[lo:hi],
        min=fs.min[lo:hi],
        max=fs.max[lo:hi],
        quantiles=fs.quantiles[:, lo:hi],
        sketches=fs.sketches[lo:hi],
        quantile_error=fs.quantile_error,
    )


def as_drawn(fs: FeatureStats, quota: int) -> FeatureStats:
    """A source's stats with each frame counted ``quota / count`` times (its epoch share):
    count and mass become the quota, m2 scales with it; :func:`stats.merge_stats` then scales
    the rank summary by the same factor."""
    r = quota / fs.mass
    return FeatureStats(
        count=int(quota),
        mass=float(quota),
        mean=fs.mean,
        m2=fs.m2 * r,
        min=fs.min,
        max=fs.max,
        quantiles=fs.quantiles,
        sketches=fs.sketches,
        quantile_error=fs.quantile_error * r,
    )


def _pad_stats(dims: int) -> dict[str, np.ndarray]:
    z = np.zeros(dims)
    return {"mean": z, "std": z, "min": z, "max": z, "quantiles": np.zeros((len(QUANTILES), dims))}


def weighted_feature(parts: list[FeatureStats], widths: list[int], dims: int) -> dict[str, Any]:
    """One mixture feature from its sources' as-drawn stats: dimension ``d`` merges the sources
    with ``width > d``; a dimension none has gets the padding's stats (0). Returns the arrays,
    the LeRobot count (frames drawn of the sources holding dimension 0), per-dimension counts and
    the quantiles' rank-error bound (a fraction of the frames drawn, the largest over dims)."""
    keys = ("mean", "std", "min", "max")
    out = {k: np.zeros(dims) for k in keys}
    out["quantiles"] = np.zeros((len(QUANTILES), dims))
    dim_count = np.zeros(dims, dtype=np.int64)
    error = 0.0
    cuts = sorted({0, dims, *[min(w, dims) for w in widths]})
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        have = [p for p, w in zip(parts, widths) if w > lo and p.count > 0]
        if not have:
            continue  # padding only: zeros
        [m] = merge_stats([{"f": _slice(p, lo, hi)} for p in have]).values()
        out["mean"][lo:hi], out["std"][lo:hi] = m.mean, m.std
        out["min"][lo:hi], out["max"][lo:hi] = m.min, m.max
        out["quantiles"][:, lo:hi] = m.quantiles
        dim_count[lo:hi] = m.count
        error = max(error, m.quantile_error / m.mass)
    return {**out, "count": int(dim_count[0]), "dim_count": dim_count, "rank_error": error}


def _lerobot(f: dict[str, Any]) -> dict[str, list]:
    out: dict[str, list] = {
        "min": f["min"].tolist(),
        "max": f["max"].tolist(),
        "mean": f["mean"].tolist(),
        "std": f["std"].tolist(),
        "count": [int(f["count"])],
    }
    for i, key in enumerate(QUANTILE_KEYS):
        out[key] = f["quantiles"][i].tolist()
    return out


# --------------------------------------------------------------------------------------------
# The whole mixture


@dataclass
class MixtureStats:
    """What :func:`compute_mixture_stats` produced: LeRobot stats and their metadata."""

    stats: dict[str, dict[str, list]]
    meta: dict[str, Any]


def _spec(mixture: str | os.PathLike | dict | MixtureSpec) -> MixtureSpec:
    return mixture if isinstance(mixture, MixtureSpec) else parse_mixture(mixture)


def _source_meta(spec: MixtureSpec, sources: list[ResolvedSource]) -> dict[str, Any]:
    summary = summarize(spec, [s.frames for s in sources], [s.episodes for s in sources])
    for row, s in zip(summary["sources"], sources):
        row["fingerprint"] = s.ds.fingerprint
        try:
            row["data_state"] = data_state(s.ds)
        except OSError as exc:
            raise MixtureError(f"{spec.where}: source {s.name!r}: {exc}") from exc
    return summary


def compute_mixture_stats(
    mixture: str | os.PathLike | dict | MixtureSpec,
    features: list[str] | None = None,
    quantiles: str = "exact",
    memory_mb: float = DEFAULT_MEMORY_MB,
    sketch_points: int = SKETCH_POINTS,
    batch_rows: int | None = None,
) -> MixtureStats:
    """Compute (do not write) the mixture's weighted stats; see the module docstring."""
    if quantiles not in QUANTILE_MODES:
        raise ValueError(f"quantiles must be one of {QUANTILE_MODES}, got {quantiles!r}")
    spec = _spec(mixture)
    sources = resolve_sources(spec)
    feats = mixture_features(spec, [s.ds for s in sources], features)
    summary = _source_meta(spec, sources)
    need = sum(s.frames for s in sources) * sum(f["dims"] for f in feats.values())
    exact = quantiles == "exact" and need * BYTES_PER_VALUE <= memory_mb * 2**20
    per_source = []
    for i, s in enumerate(sources):
        own = {f["source_names"][i]: f["widths"][i] for f in feats.values()}
        eps = None if s.episodes == s.ds.num_episodes else s.episode_index
        state = summary["sources"][i]["data_state"]
        res = None if exact else sketched_source_stats(s.ds, own, eps, state)
        summary["sources"][i]["read"] = "sketches" if res is not None else "data"
        try:
            res = res or source_stats(s.ds, own, eps, exact, sketch_points, batch_rows)
        except DatasetError as exc:
            raise MixtureError(f"{spec.where}: source {s.name!r}: {exc}") from exc
        per_source.append(res)
    quota = [row["quota"] for row in summary["sources"]]
    stats: dict[str, dict[str, list]] = {}
    feature_meta: dict[str, Any] = {}
    for key, f in feats.items():
        parts = [
            as_drawn(res[f["source_names"][i]], q)
            for i, (res, q) in enumerate(zip(per_source, quota))
        ]
        w = weighted_feature(parts, f["widths"], f["dims"])
        stats[key] = _lerobot(w)
        feature_meta[key] = {
            "dims": f["dims"],
            "source_features": f["source_names"],
            "source_dims": f["widths"],
            "dim_count": w["dim_count"].tolist(),
            "quantiles": "exact" if w["rank_error"] == 0 else "sketch",
            "rank_error": w["rank_error"],
        }
    meta = {
        "format": MIXTURE_STATS_FORMAT,
        "version": MIXTURE_STATS_VERSION,
        "mixture": spec.to_dict(),
        "fingerprint": mixture_fingerprint(spec, [s.ds.fingerprint for s in sources]),
        "requested_quantiles": quantiles,
        "epoch_frames": summary["epoch_frames"],
        "weighting": (
            "as sampled: each frame of source i counts quota_i / frames_i times (quota: frames "
            "drawn per epoch of epoch_frames); count = frames drawn per epoch"
        ),
        "padding": "a pad_to dimension d counts only the sources whose vector is longer than d "
        "(dim_count); a dimension no source has holds the padding's stats (0)",
        "rank_error_meaning": (
            "each quantile lies between the exact weighted order statistics at ranks "
            "(N-1)q -/+ rank_error*N (0: exact, np.quantile's linear rule over the weighted frames)"
        ),
        "sources": summary["sources"],
        "features": feature_meta,
    }
    return MixtureStats(stats, meta)


# --------------------------------------------------------------------------------------------
# Files, freshness


def _paths(out: str | os.PathLike) -> tuple[str, str]:
    out = os.fspath(out)
    return os.path.join(out, MIXTURE_STATS_FILE), os.path.join(out, MIXTURE_STATS_META)


def read_mixture_stats_meta(out: str | os.PathLike) -> dict | None:
    """``DIR/stats_meta.json`` (None when absent or unreadable)."""
    try:
        with open(_paths(out)[1], "rb") as fh:
            meta = json.loads(fh.read())
    except (FileNotFoundError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _stats_digest(out: str | os.PathLike) -> str | None:
    try:
        with open(_paths(out)[0], "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except FileNotFoundError:
        return None


def mixture_stats_stale_reason(
    out: str | os.PathLike,
    mixture: str | os.PathLike | dict | MixtureSpec,
    features: list[str] | None = None,
    quantiles: str | None = None,
) -> str:
    """Why ``DIR``'s mixture stats are not fresh for ``mixture`` ("" when fresh); a changed
    source is named."""
    spec = _spec(mixture)
    meta = read_mixture_stats_meta(out)
    if meta is None:
        return f"no {MIXTURE_STATS_META}"
    if meta.get("format") != MIXTURE_STATS_FORMAT or meta.get("version") != MIXTURE_STATS_VERSION:
        return f"{MIXTURE_STATS_META} is of another format or version"
    if meta.get("mixture") != spec.to_dict():
        return "the mixture spec changed"
    if _stats_digest(out) != meta.get("stats_sha256"):
        return f"{MIXTURE_STATS_FILE} is missing or was edited"
    if quantiles is not None and meta.get("requested_quantiles") != quantiles:
        return f"quantiles were {meta.get('requested_quantiles')!r}, {quantiles!r} asked"
    sources = resolve_sources(spec)
    wanted = mixture_features(spec, [s.ds for s in sources], features)
    if not set(wanted) <= set(meta.get("features") or {}):
        return "features missing from the stats"
    old = {s["name"]: s for s in meta.get("sources") or []}
    for s in sources:
        o = old.get(s.name) or {}
        if o.get("fingerprint") != s.ds.fingerprint:
            return f"source {s.name!r} changed (its episodes fingerprint) since the stats"
        if o.get("data_state") != data_state(s.ds):
            return f"source {s.name!r} changed (its data files) since the stats"
    return ""


def write_mixture_stats(res: MixtureStats, out: str | os.PathLike) -> bool:
    """Write ``DIR/stats.json`` then ``DIR/stats_meta.json`` atomically (main process only)."""
    if not rank_info().is_main:
        return False
    out = os.fspath(out)
    if os.path.exists(os.path.join(out, "meta", "info.json")):
        raise MixtureError(
            f"{out}: --out is a dataset root; give the mixture stats their own folder"
        )
    roots = [s["root"] for s in (res.meta.get("mixture") or {}).get("sources") or []]
    check_output_dir(out, sources=roots)  # never a user's folder, nor in or around a source
    os.makedirs(out, exist_ok=True)
    stats_path, meta_path = _paths(out)
    text = json.dumps(res.stats, indent=4).encode()
    atomic_write_bytes(stats_path, text)
    meta = {**res.meta, "stats_sha256": hashlib.sha256(text).hexdigest()}
    atomic_write_bytes(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
    mark_output_dir(out, "a mixture plan folder")
    res.meta = meta
    return True


def ensure_mixture_stats(
    mixture: str | os.PathLike | dict | MixtureSpec,
    out: str | os.PathLike,
    force: bool = False,
    features: list[str] | None = None,
    quantiles: str = "exact",
    memory_mb: float = DEFAULT_MEMORY_MB,
) -> dict[str, Any]:
    """Batch path (CLI): keep fresh stats, else compute and write them. Returns a report:
    path, status ("fresh", "written", "not written"), why it was recomputed, the sources and
    features of the metadata."""
    spec = _spec(mixture)
    out = os.fspath(out)
    if os.path.exists(os.path.join(out, "meta", "info.json")):
        raise MixtureError(
            f"{out}: --out is a dataset root; give the mixture stats their own folder"
        )
    check_output_dir(out, sources=[s.root for s in spec.sources])  # before the computation
    reason = "--force" if force else mixture_stats_stale_reason(out, spec, features, quantiles)
    if not reason:
        meta = read_mixture_stats_meta(out) or {}
        status = "fresh"
    else:
        res = compute_mixture_stats(spec, features, quantiles, memory_mb)
        status = "written" if write_mixture_stats(res, out) else "not written"
        meta = res.meta
    return {
        "path": _paths(out)[0],
        "status": status,
        "reason": reason,
        "fingerprint": meta.get("fingerprint"),
        "epoch_frames": meta.get("epoch_frames"),
        "sources": meta.get("sources"),
        "features": meta.get("features"),
    }


def _stats_hint(out: str | os.PathLike, mixture: Any) -> str:
    """The command that (re)computes ``out``'s stats: the mixture file given, else the plan
    folder's ``mixture.json``, else a placeholder."""
    out = os.fspath(out)
    if isinstance(mixture, (str, os.PathLike)) and not os.fspath(mixture).lstrip().startswith("{"):
        m = os.fspath(mixture)
    elif mixture is None and os.path.isfile(os.path.join(out, MIXTURE_FILE)):
        m = os.path.join(out, MIXTURE_FILE)
    else:
        m = "MIXTURE.json"
    return f"episodekit metadata stats --mixture {m} --out {out}"


def load_mixture_stats(
    out: str | os.PathLike, mixture: str | os.PathLike | dict | MixtureSpec | None = None
) -> dict[str, dict[str, np.ndarray]]:
    """``DIR/stats.json`` as LeRobot's ``load_stats`` sees it, after checking it is fresh for
    ``mixture`` (default: the spec recorded with it); stale: :class:`MixtureError` naming why."""
    meta = read_mixture_stats_meta(out)
    if meta is None:
        raise MixtureError(
            f"{out}: no mixture stats; compute them with: {_stats_hint(out, mixture)}"
        )
    spec = mixture if mixture is not None else meta["mixture"]
    reason = mixture_stats_stale_reason(out, spec)
    if reason:
        raise MixtureError(
            f"{out}: mixture stats are stale: {reason}; recompute them with: "
            f"{_stats_hint(out, mixture)}"
        )
    with open(_paths(out)[0], "rb") as fh:
        raw = json.loads(fh.read())
    return {n: {k: np.atleast_1d(np.array(v)) for k, v in d.items()} for n, d in raw.items()}


def format_mixture_stats(report: dict[str, Any]) -> str:
    """Lines for the CLI: status, sources with quotas, repeats and what was read (``data`` or
    their ``sketches``), features with their mode."""
    head = f"{report['path']}: {report['status']}"
    reason = report["reason"]
    if report["status"] != "fresh" and reason and reason != f"no {MIXTURE_STATS_META}":
        head += " (--force)" if reason == "--force" else f" (were stale: {reason})"
    lines = [
        head,
        f"  epoch {plural(report['epoch_frames'], 'frame')}, fingerprint {report['fingerprint']}",
        f"  {'source':<16}{'frames':>12}{'quota':>12}{'repeats':>9}  read",
    ]
    for s in report["sources"] or []:
        lines.append(
            f"  {s['name'][:16]:<16}{s['frames']:>12,}{s['quota']:>12,}{s['repeats']:>9.3f}"
            f"  {s.get('read', 'data')}"
        )
    lines.append(f"  {'feature':<28} {'dims':>5} {'quantiles':>9} {'rank error':>11}")
    for name, f in (report["features"] or {}).items():
        lines.append(f"  {name:<28} {f['dims']:>5} {f['quantiles']:>9} {f['rank_error']:>11.2e}")
    return "\n".join(lines)
