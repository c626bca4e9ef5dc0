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

This module checks stats.json and runs the rest: :mod:`.stats_rules` (tolerances, order,
consistency), :mod:`.stats_episodes` (the per-episode columns), :mod:`.stats_recompute`
(``--deep``), :mod:`.stats_images` (image/video features).
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import numpy as np
import pyarrow.compute as pc

from episodekit.core.dataset import V3
from episodekit.metadata.stats import (
    QUANTILE_KEYS,
    STAT_KEYS,
    STATS_FILE,
    numeric_features,
    read_summary_meta,
    stale_reason,
)
from episodekit.validate.artifacts import dataset_from_raw
from episodekit.validate.raw import ERROR, Finding, RawRoot
from episodekit.validate.stats_episodes import episode_part
from episodekit.validate.stats_images import check_image_stats
from episodekit.validate.stats_quantiles import check_quantile_ranks
from episodekit.validate.stats_recompute import recompute_findings
from episodekit.validate.stats_rules import (
    TOLERANCE,
    consistency_findings,
    missing_finding,
    order_findings,
    order_tolerance,
    stat_values,
)


def dataset_part(raw: RawRoot, feats: dict[str, int]) -> tuple[list[Finding], dict]:
    """Findings on stats.json and its parsed numeric stats ``{feature: {key: vector}}``."""
    out: list[Finding] = []
    full = raw.join(STATS_FILE)

    def err(check: str, msg: str) -> None:
        out.append(Finding(check, ERROR, msg, STATS_FILE))

    if not raw.fs.exists(full):
        err("stats.present", f"missing; compute it with `episodekit metadata stats {raw.root}`")
        return out, {}
    try:
        data = json.loads(raw.read_bytes(full))
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
            out.append(missing_finding(name, missing, STATS_FILE, raw.root))
        if not isinstance(entry, dict):
            continue
        got: dict[str, np.ndarray] = {}
        for key in STAT_KEYS:
            if key not in entry:
                continue
            arr, why = stat_values(entry[key], dims, key)
            if arr is None:
                err("stats.shape", f"{name}/{key}: {why} (feature shape [{dims}])")
                continue
            if not np.all(np.isfinite(arr)):
                err("stats.finite", f"{name}/{key}: not finite ({arr.tolist()[:6]})")
                continue
            got[key] = arr
        parsed[name] = got
        out += order_findings(name, got, STATS_FILE)
        if "count" in got and raw.episodes is not None:
            frames = int(pc.sum(raw.episodes["length"]).as_py() or 0)
            if int(got["count"][0]) != frames:
                err(
                    "stats.count",
                    f"{name}/count is {int(got['count'][0])}, the dataset has {frames} frames",
                )
    return out, parsed


_UNSET: Any = object()


def check_stats(
    raw: RawRoot, deep: bool = False, executor: str = "local", ds: Any = _UNSET
) -> list[Finding]:
    """Every ``stats.*`` finding of a v3.0 root. ``ds``: the root's
    :func:`~episodekit.validate.artifacts.dataset_from_raw` when the caller holds it already
    (the validate run's, shared with the artifact checks), else built here."""
    if raw.version != V3:
        return []
    feats = numeric_features(raw.info)
    if not feats:
        return check_image_stats(raw)
    out, dataset = dataset_part(raw, feats)
    per = episode_part(raw, feats, keep=deep)
    out += per.findings
    out += consistency_findings(feats, dataset, per.merged)
    if ds is _UNSET:
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
        out += recompute_findings(raw, feats, dataset, per.ep, per.episodes, executor)
        out += check_quantile_ranks(raw, dataset, feats)
    return out + check_image_stats(raw)


__all__ = ["QUANTILE_KEYS", "TOLERANCE", "check_image_stats", "check_stats", "order_tolerance"]
