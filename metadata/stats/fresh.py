"""Freshness and the batch entry points: :func:`ensure_stats` (compute and write what is stale),
:func:`stats_report`, :func:`load_lerobot_stats`."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from pathlib import Path

import numpy as np

from episodekit.core.dataset import V3, Dataset, DatasetError, as_dataset, resolve_root
from episodekit.metadata.image_stats import (
    image_features,
)
from episodekit.metadata.stats.compute import (
    StatsOptions,
    StatsResult,
    compute_stats,
    data_state,
)
from episodekit.metadata.stats.episode_sketch import read_sketches_meta
from episodekit.metadata.stats.keys import (
    DEFAULT_MEMORY_MB,
    STATS_FILE,
    STATS_VERSION,
    SUMMARY_FILE,
    numeric_features,
)
from episodekit.metadata.stats.summary import read_summary_meta
from episodekit.metadata.stats.write import file_state, write_stats


def stale_reason(ds: Dataset, meta: dict | None, features: dict[str, int] | None = None) -> str:
    """Why the written stats are not fresh for ``ds`` ("" when fresh)."""
    if meta is None:
        return f"no {SUMMARY_FILE}"
    if meta.get("version") != STATS_VERSION:
        return f"summary version {meta.get('version')!r}"
    if meta.get("fingerprint") != ds.fingerprint:
        return "episodes changed since the stats were computed (fingerprint)"
    if meta.get("data_state") != data_state(ds):
        return "data files changed since the stats were computed (size or parquet footer)"
    if features and not set(features) <= set(meta.get("features") or {}):
        return "features missing from the stats"
    return ""


def _outputs_intact(ds: Dataset, meta: dict) -> bool:
    out = meta.get("outputs") or {}
    base = Path(ds.path)
    try:
        text = (base / STATS_FILE).read_bytes()
    except FileNotFoundError:
        return False
    if hashlib.sha256(text).hexdigest() != out.get("stats_sha256"):
        return False
    now = {str(f.relative_to(base)) for f in base.glob("meta/episodes/*/*.parquet")}
    if now != set(out.get("episodes") or {}):
        return False
    return all(file_state(str(base / rel)) == st for rel, st in out["episodes"].items())


def ensure_stats(
    root: Dataset | str | os.PathLike,
    force: bool = False,
    features: list[str] | None = None,
    quantiles: str = "exact",
    memory_mb: float = DEFAULT_MEMORY_MB,
    executor: str = "local",
    jobs: int | None = None,
    images: bool = False,
) -> tuple[StatsResult | None, str]:
    """Batch path (CLI, prepare): ``(result, status)``, status "fresh" (result None: nothing was
    computed), "written" or "not written" (other rank, read-only or remote root). ``images``:
    image/video stats too (fresh only when recorded for the same episodes fingerprint)."""
    ds = as_dataset(root)
    if ds.version != V3:
        raise DatasetError(
            f"stats are written for v3.0 roots only (this one is {ds.version}); convert it first"
        )
    feats = numeric_features(ds.info, features)
    if not force and ds.is_local:
        meta = read_summary_meta(ds)
        if (
            not stale_reason(ds, meta, feats)
            and _outputs_intact(ds, meta)
            and (read_sketches_meta(ds) or {}).get("fingerprint") == ds.fingerprint
            and all((meta.get("quantiles") or {}).get(n) == quantiles for n in feats)
            and (not images or _images_fresh(ds, meta))
        ):
            return None, "fresh"
    opts = StatsOptions(features, quantiles, memory_mb, executor=executor, jobs=jobs, images=images)
    res = compute_stats(ds, opts)
    return res, "written" if write_stats(res, ds) else "not written"


def _images_fresh(ds: Dataset, meta: dict) -> bool:
    rec = meta.get("images") or {}
    want = set(image_features(ds.info))
    return rec.get("fingerprint") == ds.fingerprint and want <= set(rec.get("features") or {})


def stats_report(root: Dataset | str | os.PathLike, **kwargs) -> dict:
    """Ensure fresh stats and describe them: status, per feature dims, mode and rank error."""
    ds = as_dataset(root)
    res, status = ensure_stats(ds, **kwargs)
    meta = read_summary_meta(ds) if res is None else None
    if res is not None:
        feats = {
            n: {"dims": d, "quantiles": res.mode[n], "rank_error": res.rank_error[n]}
            for n, d in res.features.items()
        }
    else:
        feats = {
            n: {"dims": d, "quantiles": meta["quantiles"][n], "rank_error": meta["rank_error"][n]}
            for n, d in meta["features"].items()
        }
    rec = res.images.meta() if res is not None and res.images is not None else None
    if rec is None:
        rec = (meta if meta is not None else read_summary_meta(ds) or {}).get("images")
    return {
        "root": ds.root,
        "file": STATS_FILE,
        "status": status,
        "images": rec,
        "fingerprint": ds.fingerprint,
        "frames": ds.num_frames,
        "episodes": ds.num_episodes,
        "features": feats,
    }


def load_lerobot_stats(root: Dataset | str | os.PathLike) -> dict | None:
    """``meta/stats.json`` as LeRobot's ``load_stats`` sees it: ``{feature: {key: ndarray}}``."""
    fs, path = (root.fs, root.path) if isinstance(root, Dataset) else resolve_root(str(root))
    full = posixpath.join(path, STATS_FILE)
    if not fs.exists(full):
        return None
    with fs.open(full, "rb") as fh:
        raw = json.loads(fh.read())
    return {
        n: {k: np.atleast_1d(np.array(v)) for k, v in d.items()}
        for n, d in raw.items()
        if isinstance(d, dict)
    }
