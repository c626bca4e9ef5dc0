"""What the ``stats.*`` checks compare with: the tolerance, a stats value parsed to its shape,
the order relations (within one bin of LeRobot's quantile histogram) and the consistency of the
dataset's stats with the merge of the episodes'."""

from __future__ import annotations

import numpy as np

from episodekit.core.words import noun_for
from episodekit.metadata.stats import (
    ORDERED_KEYS,
    QUANTILE_KEYS,
    STATS_FILE,
)
from episodekit.metadata.stats.episode_merge import MERGED_KEYS
from episodekit.validate.raw import ERROR, WARNING, Finding

RTOL = 1e-6
ATOL = 1e-9
TOLERANCE = f"|a-b| <= {RTOL:g}*|b| + {ATOL:g}*(1+scale)"
EXAMPLES = 3


def close_enough(a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    return np.abs(a - b) <= RTOL * np.abs(b) + ATOL * (1 + scale)


def stat_values(v, dims: int, key: str) -> tuple[np.ndarray | None, str]:
    """A stats.json entry as a float vector of the expected length, or (None, why)."""
    try:
        arr = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):
        return None, f"not numbers ({str(v)[:40]})"
    want = 1 if key == "count" else dims
    if arr.size != want or arr.ndim > 1:
        return None, f"shape {list(arr.shape)}, expected [{want}]"
    return arr.reshape(want), ""


def missing_finding(
    what: str, missing: list[str], file: str, root: str, images: bool = False
) -> Finding:
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


def order_violations(got: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
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


def order_findings(name: str, got: dict[str, np.ndarray], file: str, episode=None) -> list[Finding]:
    """min <= q01 <= ... <= q99 <= max, min <= mean <= max (within one LeRobot histogram bin),
    std >= 0."""
    out = []
    for what, bad in order_violations(got):
        if np.any(bad):
            dims = np.flatnonzero(bad).tolist()[:6]
            msg = f"{name}: {what} in {noun_for(len(dims), 'dimension')} {dims} ({ORDER_TOLERANCE})"
            out.append(Finding("stats.order", ERROR, msg, file, episode))
    return out


def consistency_findings(names, dataset: dict, merged: dict) -> list[Finding]:
    """Cheap: the dataset's min/max/mean/std/count against the merge of the episodes'
    (``merged``: :meth:`EpisodeMerge.merged` per feature)."""
    out = []
    for n in names:
        d, m = dataset.get(n, {}), merged.get(n)
        if m is None or not set(MERGED_KEYS) <= set(d):
            continue
        scale = float(np.max(np.abs(np.r_[m["min"], m["max"]])))
        for k, v in m.items():
            bad = ~close_enough(d[k], v, scale)
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
