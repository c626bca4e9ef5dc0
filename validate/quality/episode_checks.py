"""The timing, episode, task and distribution-shift checks over the merged summaries."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.words import plural
from episodekit.validate.quality.merge import Merged
from episodekit.validate.quality.signals import (
    Candidate,
    dim_label,
    episode_of,
)
from episodekit.validate.quality.thresholds import (
    MAD_TO_SIGMA,
    PLACEHOLDER_PATTERN,
    PLACEHOLDER_TASKS,
)
from episodekit.validate.raw import RawRoot


def timing_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    out = []
    fps = raw.fps
    if not fps:
        return out
    for i in np.flatnonzero(m.ts_drops > 0):
        out.append(
            Candidate(
                "quality.dropped_frames",
                f"{plural(int(m.ts_drops[i]), 'timestamp gap')}, "
                f"{plural(int(m.ts_missing[i]), 'frame')} missing; "
                f"largest step {m.ts_maxstep[i]:.2f} frames ({m.ts_maxstep[i] / fps:.3f} s at "
                f"{fps:g} fps)",
                feature="timestamp",
                value=float(m.ts_missing[i]),
                score=float(m.ts_maxstep[i] / th["drop_factor"]) if th["drop_factor"] else math.inf,
                **episode_of(m, i),
            )
        )
    with np.errstate(invalid="ignore"):
        off = np.abs(m.ts_interval - 1) > th["interval_tolerance"]
    for i in np.flatnonzero(off & (m.ts_drops == 0)):
        out.append(
            Candidate(
                "quality.frame_interval",
                f"mean timestamp step is {m.ts_interval[i] / fps:.5f} s, 1/fps is {1 / fps:.5f} s "
                f"({m.ts_interval[i]:.3f} frames)",
                feature="timestamp",
                value=float(m.ts_interval[i] / fps),
                score=float(abs(m.ts_interval[i] - 1) / max(th["interval_tolerance"], 1e-9)),
                **episode_of(m, i),
            )
        )
    return out


def episode_table(raw: RawRoot) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.Array]:
    """episode_index, length, task_index, data_file of the episodes table (first row wins);
    data_file stays an Arrow array (a Python string per episode would cost ~90 bytes each)."""
    e = raw.episodes
    ep = e["episode_index"].to_numpy(zero_copy_only=False)
    length = e["length"].to_numpy(zero_copy_only=False) if "length" in e.column_names else None
    if length is None:
        length = np.full(len(ep), -1)
    task = e["task_index"].to_numpy(zero_copy_only=False)
    _, first = np.unique(ep, return_index=True)
    first.sort()
    return (
        ep[first],
        np.nan_to_num(length[first].astype(np.float64), nan=-1),
        task[first],
        e["data_file"].take(pa.array(first)).combine_chunks(),
    )


def rows_per_episode(ep: np.ndarray, m: Merged) -> np.ndarray:
    """Rows scanned of each of the episodes ``ep`` (unique), summed over the files they are in."""
    rows = np.zeros(len(ep), np.int64)
    if len(ep) and len(m.episodes):
        by = np.argsort(ep, kind="stable")
        at = np.minimum(np.searchsorted(ep, m.episodes, sorter=by), len(ep) - 1)
        k = by[at]
        known = ep[k] == m.episodes
        np.add.at(rows, k[known], m.rows[known])
    return rows


def episode_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    if raw.episodes is None or raw.episodes.num_rows == 0:
        return []
    ep, length, task, files = episode_table(raw)
    rows = rows_per_episode(ep, m)
    scanned = pa.array(sorted(m.scanned), pa.string())
    in_scanned = pc.fill_null(pc.is_in(files, value_set=scanned), False).to_numpy(
        zero_copy_only=False
    )
    out = []

    def add(check: str, mask: np.ndarray, msg: Callable[[int], str], value, score=None) -> None:
        for k in np.flatnonzero(mask):
            out.append(
                Candidate(
                    check,
                    msg(k),
                    episode=int(ep[k]),
                    file=str(files[int(k)].as_py()),
                    value=float(value[k]),
                    score=float(score[k]) if score is not None else 1.0,
                )
            )

    empty = (length == 0) | (in_scanned & (rows == 0))
    add(
        "quality.empty_episode",
        empty,
        lambda k: f"no frames (length {int(length[k])}, {plural(int(rows[k]), 'row')} in the data)",
        rows,
    )
    add("quality.single_frame", (length == 1) & ~empty, lambda k: "one frame only", length)
    if th["min_length"] > 0:
        short = (length > 1) & (length < th["min_length"])
        add(
            "quality.short_episode",
            short,
            lambda k: (
                f"{plural(int(length[k]), 'frame')}, fewer than "
                f"--min-length {int(th['min_length'])}"
            ),
            length,
            th["min_length"] / np.maximum(length, 1),
        )
    # Length outliers per task (robust z of log length).
    logl = np.log(np.maximum(length, 1))
    z = np.zeros(len(ep))
    med = np.zeros(len(ep))
    for t in np.unique(task):
        sel = (task == t) & (length > 0)
        if sel.sum() < th["length_min_episodes"]:
            continue
        mu = np.median(logl[sel])
        sd = max(MAD_TO_SIGMA * np.median(np.abs(logl[sel] - mu)), th["length_log_floor"])
        z[sel] = np.abs(logl[sel] - mu) / sd
        med[sel] = np.exp(mu)
    add(
        "quality.length_outlier",
        z > th["length_sigmas"],
        lambda k: (
            f"{plural(int(length[k]), 'frame')}; task {int(task[k])}'s median is {med[k]:.0f} "
            f"({z[k]:.1f} robust deviations of log length, threshold {th['length_sigmas']:g})"
        ),
        length,
        z / max(th["length_sigmas"], 1e-9),
    )
    return out


def task_checks(raw: RawRoot, th: dict) -> list[Candidate]:
    if raw.tasks is None:
        return []
    names = [c for c in ("task", "__index_level_0__") if c in raw.tasks.column_names]
    if not names:
        return []
    strings = raw.tasks[names[0]].to_pylist()
    index = raw.tasks["task_index"].to_pylist()
    out = []
    for t, s in zip(index, strings):
        norm = (s or "").strip().casefold()
        if norm in PLACEHOLDER_TASKS or PLACEHOLDER_PATTERN.match(norm):
            out.append(
                Candidate(
                    "quality.task_placeholder",
                    f"task {t} is {s!r}: empty or a placeholder, not an instruction",
                    file="meta/tasks.parquet" if raw.version == "v3.0" else "meta/tasks.jsonl",
                    value=float(t),
                    details={"task_index": t, "task": s},
                )
            )
    if raw.episodes is not None and raw.episodes.num_rows:
        _, _, task, _ = episode_table(raw)
        counts = {t: 0 for t in index}
        vals, n = np.unique(task[task >= 0], return_counts=True)
        counts.update(zip(vals.tolist(), n.tolist()))
        median = float(np.median(list(counts.values()))) if counts else 0.0
        need = th["min_task_episodes"]
        if need > 0 and median >= need * th["task_rare_factor"]:
            for t, c in counts.items():
                if c < need:
                    out.append(
                        Candidate(
                            "quality.task_rare",
                            f"task {t} has {plural(c, 'episode')} (the median task has "
                            f"{median:.0f})",
                            value=float(c),
                            score=need / max(c, 0.5),
                            details={"task_index": t},
                        )
                    )
    return out


def _quarter(c: dict[str, np.ndarray], L: np.ndarray, sel: np.ndarray) -> tuple:
    """Robust summary of a quarter of the episodes (merged rows ``sel``; ``L``: their lengths
    as a float column): median episode mean, spread of the episode means (1.4826 x MAD),
    median within-episode standard deviation, episode count, then the median and spread of the
    log standard deviations. Medians, so that one bad episode (a spike) moves nothing; only
    the quarter's rows are computed (not every episode's)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        Ls = L[sel]
        means = c["sums"][sel] / Ls
        stds = np.sqrt(np.maximum(c["sumsq"][sel] / Ls - means**2, 0))
        mu = np.nanmedian(means, 0)
        spread = MAD_TO_SIGMA * np.nanmedian(np.abs(means - mu), 0)
        del means
        sd = np.nanmedian(stds, 0)
        # the same on log within-episode standard deviations (they vary a lot between
        # episodes: a ratio of two medians alone is noise for small quarters)
        logs = np.log(np.maximum(stds, 1e-12))
        del stds
        log_mu = np.nanmedian(logs, 0)
        log_spread = MAD_TO_SIGMA * np.nanmedian(np.abs(logs - log_mu), 0)
    return mu, spread, sd, len(sel), log_mu, log_spread


def shift_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    """First vs last quarter of the episodes: the median episode mean moves (z against the
    spread of episode means, and effect size in frame standard deviations), or the typical
    within-episode standard deviation changes by a factor."""
    n = len(m.episodes)
    if n < max(th["shift_min_episodes"], 8):
        return []
    order = np.argsort(m.episodes, kind="stable")
    q = n // 4
    first, last = order[:q], order[-q:]
    out = []
    L = np.maximum(m.rows.astype(np.float64), 1)[:, None]
    for name, c in m.features.items():
        mf, pf, sf, nf, lf, lpf = _quarter(c, L, first)
        ml, pl_, sl, nl, ll, lpl = _quarter(c, L, last)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            # the median's standard error is ~1.25x the mean's
            z = np.abs(ml - mf) / (1.2533 * np.sqrt(pf**2 / nf + pl_**2 / nl))
            total = np.sqrt((sf**2 + sl**2) / 2 + (pf**2 + pl_**2) / 2)
            effect = np.abs(ml - mf) / total
            ratio = np.fmax(sl / sf, sf / sl)
            z_sd = np.abs(ll - lf) / (1.2533 * np.sqrt(lpf**2 / nf + lpl**2 / nl))
        for j in range(c["sums"].shape[1]):
            label = dim_label(raw, name, j)
            if z[j] > th["shift_sigmas"] and effect[j] > th["shift_effect"]:
                out.append(
                    Candidate(
                        "quality.shift",
                        f"{label} mean moves from {mf[j]:.4g} (first {nf} episodes) to "
                        f"{ml[j]:.4g} (last {nl}): {effect[j]:.2f} standard deviations, "
                        f"z={z[j]:.0f}",
                        feature=name,
                        dimension=j,
                        value=float(effect[j]),
                        score=float(effect[j] / max(th["shift_effect"], 1e-9)),
                    )
                )
            elif (
                ratio[j] > th["shift_std_ratio"]
                and z_sd[j] > th["shift_sigmas"]
                and min(sf[j], sl[j]) > 0
            ):
                out.append(
                    Candidate(
                        "quality.shift",
                        f"{label} standard deviation changes from {sf[j]:.4g} (first {nf} "
                        f"episodes) to {sl[j]:.4g} (last {nl}): ratio {ratio[j]:.2f}",
                        feature=name,
                        dimension=j,
                        value=float(ratio[j]),
                        score=float(ratio[j] / max(th["shift_std_ratio"], 1e-9)),
                    )
                )
    return out
