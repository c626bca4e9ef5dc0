"""``quality.drift``: a step change along the recording, per dimension, and the episode it starts.

What it catches: channels swapped, or a sensor recalibrated, between sessions. From then on every
episode's level (or spread) of that dimension sits elsewhere. What it must not catch: the natural
variation between episodes (another object placement, another operator), tasks recorded in
blocks, a slow trend. A false warning breaks a user's CI, so the test is built to be quiet.

It uses the per-episode summaries the quality pass already computed (no extra read): for every
float ``action*`` / ``observation.state*`` dimension, each episode's mean and its within-episode
standard deviation (as a log), in episode order.

1. **Tasks out.** Each value minus the median of its task, so tasks recorded in blocks are no
   change (unless there are more tasks than half the episodes: a task string per episode).
2. **Where.** The split maximizing a rank (Mann-Whitney) statistic over the sequence, with at
   least ``drift_min_segment`` episodes (and 5 % of them) on each side: ranks, so outliers weigh
   nothing; that statistic must exceed ``drift_z``. The episode is then the split within
   ``drift_window`` of it leaving the least absolute deviation from the two sides' medians.
3. **How big.** The two sides' medians must differ by more than ``drift_sigmas`` robust
   deviations of the episodes around their own side's median (1.4826 x MAD): the two sides
   barely overlap. For the level, the difference must also matter at frame level: more than
   ``drift_effect`` of the dimension's total standard deviation (within and between episodes);
   for the spread, a ratio above ``drift_std_ratio``.
4. **Abrupt, not a trend.** Across the split, the ``drift_window`` episodes just before and just
   after must show at least ``drift_abrupt`` of that difference: a step shows all of it there, a
   steady trend only a sliver.

At most one change per dimension and statistic is reported (the strongest), naming the first
episode after it; the finding's signal is the per-episode values around it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from episodekit.validate.raw import RawRoot

MAD_TO_SIGMA = 1.4826
MEAN_AD_TO_SIGMA = 1.2533  # a normal distribution's standard deviation over its mean |deviation|
SIGNAL_POINTS = 48

DEFAULTS: dict[str, float] = {
    # quality.drift: the median episode value before and after a split (tasks' medians taken
    # out) differs by > drift_sigmas robust deviations of the episodes around their side's median
    "drift_sigmas": 5.0,
    # ... and the split is significant: its rank statistic (Mann-Whitney z) > drift_z ...
    "drift_z": 4.0,
    # ... and (level) by > drift_effect total standard deviations of the dimension, or (spread)
    # by a ratio > drift_std_ratio of the within-episode standard deviations ...
    "drift_effect": 0.5,
    "drift_std_ratio": 2.0,
    # ... and the drift_window episodes on either side of the split show >= drift_abrupt of it
    "drift_abrupt": 0.6,
    "drift_window": 20,
    # ... with >= drift_min_segment episodes on each side, in >= drift_min_episodes episodes.
    "drift_min_segment": 5,
    "drift_min_episodes": 20,
}


@dataclass
class Change:
    """The strongest split of one sequence: the first position after it, the medians before and
    after (residuals and the raw values), the spread, and the step across the split alone."""

    at: int
    z: float
    delta: float
    spread: float
    local: float
    before: float
    after: float

    @property
    def sigmas(self) -> float:
        return abs(self.delta) / self.spread if self.spread > 0 else float("inf")


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share their mean rank), 1-based."""
    order = np.argsort(x, kind="stable")
    _, inverse, counts = np.unique(x[order], return_inverse=True, return_counts=True)
    mid = np.cumsum(counts) - (counts - 1) / 2.0
    ranks = np.empty(len(x))
    ranks[order] = mid[inverse]
    return ranks


def center_by_group(x: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """``x`` minus the median of its group (a task recorded in a block of episodes is then no
    change); when there are more groups than half the values (a task string per episode) they
    say nothing and one median is taken out."""
    _, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if len(counts) > len(x) / 2:
        return x - np.median(x)
    order = np.argsort(inverse, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty(len(x))
    for a, b in zip(bounds[:-1], bounds[1:]):
        sel = order[a:b]
        out[sel] = x[sel] - np.median(x[sel])
    return out


def find_change(
    x: np.ndarray, groups: np.ndarray, min_segment: int, window: int, min_z: float = 0.0
) -> Change | None:
    """The strongest step of the sequence ``x`` (finite values, in episode order; ``groups``:
    each value's task), or None when it is too short to split or the rank statistic of its
    best split is at most ``min_z``."""
    n = len(x)
    m = max(1, int(min_segment))
    if n < 2 * m:
        return None
    r = center_by_group(x, groups)
    ranks = _ranks(r)
    k = np.arange(1, n)
    u = np.cumsum(2 * ranks - (n + 1))[:-1]
    z = np.abs(u) / np.sqrt(k * (n - k) * (n + 1) / 3.0)
    z[(k < m) | (k > n - m)] = -1
    best = int(np.argmax(z))
    if z[best] <= min_z:
        return None
    w = max(m, int(window))
    at = _refine(r, int(k[best]), m, w)
    left, right = r[:at], r[at:]
    ml, mr = np.median(left), np.median(right)
    dev = np.abs(np.concatenate([left - ml, right - mr]))
    # MAD, or the mean deviation where values repeat (MAD 0 on mostly equal values)
    spread = max(MAD_TO_SIGMA * np.median(dev), MEAN_AD_TO_SIGMA * dev.mean())
    local = np.median(r[at : at + w]) - np.median(r[max(0, at - w) : at])
    before, after = np.median(x[:at]), np.median(x[at:])
    return Change(at, float(z[at - 1]), float(mr - ml), float(spread), float(local), before, after)


def _refine(r: np.ndarray, at: int, m: int, w: int) -> int:
    """The split near ``at`` (within ``w``) that leaves the least absolute deviation from the two
    sides' medians: the rank statistic finds the region, this finds the episode."""
    best, best_cost = at, np.inf
    for k in range(max(m, at - w), min(len(r) - m, at + w) + 1):
        cost = np.abs(r[:k] - np.median(r[:k])).sum() + np.abs(r[k:] - np.median(r[k:])).sum()
        if cost < best_cost - 1e-12 * abs(cost):
            best, best_cost = k, cost
    return best


def is_drift(c: Change, material: bool, th: dict) -> bool:
    """Whether a change passes every threshold (``material``: it matters at frame level)."""
    abrupt = c.delta * c.local > 0 and abs(c.local) >= th["drift_abrupt"] * abs(c.delta)
    return material and abrupt and c.sigmas > th["drift_sigmas"] and c.z > th["drift_z"]


def _per_episode(m: Any, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Episode ids (sorted), per-episode means and within-episode standard deviations (E, d) of
    feature ``name``, an episode split over files summed back into one."""
    c = m.features[name]
    ids, inverse = np.unique(m.episodes, return_inverse=True)
    d = c["sums"].shape[1]
    rows = np.zeros(len(ids))
    sums = np.zeros((len(ids), d))
    sumsq = np.zeros((len(ids), d))
    np.add.at(rows, inverse, m.rows)
    np.add.at(sums, inverse, c["sums"].astype(np.float64))
    np.add.at(sumsq, inverse, c["sumsq"].astype(np.float64))
    with np.errstate(all="ignore"):
        n = np.maximum(rows, 1)[:, None]
        mean = sums / n
        std = np.sqrt(np.maximum(sumsq / n - mean**2, 0))
    return ids, mean, std


def _tasks(raw: RawRoot, ids: np.ndarray) -> np.ndarray:
    """Task index of each episode in ``ids`` (0 when unknown)."""
    e = raw.episodes
    out = np.zeros(len(ids), np.int64)
    if e is None or "task_index" not in e.column_names or not len(ids):
        return out
    ep = e["episode_index"].to_numpy(zero_copy_only=False)
    task = e["task_index"].to_numpy(zero_copy_only=False)
    pos = np.clip(np.searchsorted(ids, ep), 0, len(ids) - 1)
    hit = ids[pos] == ep
    out[pos[hit]] = np.nan_to_num(task[hit].astype(np.float64), nan=0).astype(np.int64)
    return out


def _signal(values: np.ndarray, at: int) -> list[float]:
    """Up to SIGNAL_POINTS per-episode values centred on the change."""
    lo = max(0, min(at - SIGNAL_POINTS // 2, len(values) - SIGNAL_POINTS))
    return [float(v) for v in values[lo : lo + SIGNAL_POINTS]]


def drift_candidates(
    raw: RawRoot, m: Any, th: dict, label: Callable[[str, int], str]
) -> list[dict[str, Any]]:
    """``quality.drift`` over the quality pass's merged summaries ``m`` (episodes, rows, and per
    feature ``sums``/``sumsq``); ``label(feature, dimension)`` names a dimension. Returns the
    keyword arguments of each finding's candidate (check, message, episode, feature, ...)."""
    out: list[dict[str, Any]] = []
    if not len(m.episodes):
        return out
    first_file = {}
    for i in range(len(m.episodes) - 1, -1, -1):
        first_file[int(m.episodes[i])] = m.file_of(i)
    for name in m.features:
        ids, mean, std = _per_episode(m, name)
        tasks = _tasks(raw, ids)
        for j in range(mean.shape[1]):
            out += _dimension(ids, tasks, mean[:, j], std[:, j], name, j, th, label, first_file)
    return out


def _dimension(ids, tasks, mean, std, name, j, th, label, first_file) -> list[dict[str, Any]]:
    """The level and spread changes of one dimension that pass the thresholds."""
    out = []
    ok = np.isfinite(mean) & np.isfinite(std)
    if ok.sum() < max(th["drift_min_episodes"], 2 * th["drift_min_segment"]):
        return out
    ids, tasks, mean, std = ids[ok], tasks[ok], mean[ok], std[ok]
    with np.errstate(divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        logstd = np.log(np.maximum(std, 1e-12))
    seg = max(int(th["drift_min_segment"]), len(mean) // 20)
    win = int(th["drift_window"])
    level = find_change(mean, tasks, seg, win, th["drift_z"])
    if level is not None:
        total = float(np.hypot(np.median(std), level.spread))
        material = abs(level.delta) > th["drift_effect"] * total
        if is_drift(level, material, th):
            what = (
                f"{label(name, j)} episode level changes from {level.before:.4g} to "
                f"{level.after:.4g} at episode {int(ids[level.at])}"
            )
            out.append(_candidate(what, level, ids, mean, name, j, th, first_file, "level"))
    spread = None if np.median(std) <= 0 else find_change(logstd, tasks, seg, win, th["drift_z"])
    if spread is not None:
        material = abs(spread.delta) > np.log(max(th["drift_std_ratio"], 1.0))
        if is_drift(spread, material, th):
            what = (
                f"{label(name, j)} within-episode standard deviation changes from "
                f"{np.exp(spread.before):.4g} to {np.exp(spread.after):.4g} at episode "
                f"{int(ids[spread.at])}"
            )
            out.append(_candidate(what, spread, ids, std, name, j, th, first_file, "spread"))
    return out


def _candidate(what, c: Change, ids, values, name, j, th, first_file, kind) -> dict[str, Any]:
    episode = int(ids[c.at])
    sig = c.sigmas
    before, after = (np.exp(c.before), np.exp(c.after)) if kind == "spread" else (c.before, c.after)
    sigmas = "inf" if not np.isfinite(sig) else f"{sig:.1f}"
    return {
        "check": "quality.drift",
        "message": f"{what} ({sigmas} robust deviations of the episodes; threshold "
        f"{th['drift_sigmas']:g})",
        "episode": episode,
        "file": first_file.get(episode),
        "feature": name,
        "dimension": j,
        "value": float(after),
        "score": float(min(sig, 1e6) / max(th["drift_sigmas"], 1e-9)),
        "details": {
            "statistic": kind,
            "before": float(before),
            "after": float(after),
            "robust_deviations": None if not np.isfinite(sig) else sig,
            "first_episode": int(ids[0]),
            "signal": _signal(values, c.at),
        },
    }
