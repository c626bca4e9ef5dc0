"""The per-signal checks over the merged summaries (frozen, jumps, out of range, clipping, dead
dimensions, action range), and :class:`Candidate`, what every check yields before it becomes a
finding."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from episodekit.core.words import plural
from episodekit.validate.quality.merge import Merged
from episodekit.validate.raw import RawRoot


@dataclass
class Candidate:
    """A flagged (episode, feature, dimension) before it becomes a :class:`Finding`."""

    check: str
    message: str
    episode: int | None = None
    file: str | None = None
    feature: str | None = None
    dimension: int | None = None
    value: float | None = None
    score: float = 0.0  # how far past the threshold (worst first)
    locate: str | None = None  # how to find the frame: "step", "max", "min", "extreme"
    details: dict = field(default_factory=dict)
    limits: tuple[float, ...] | None = None  # the check's limit(s) on the value (frame ranges)


def dim_label(raw: RawRoot, feature: str, j: int) -> str:
    names = raw.features.get(feature, {}).get("names")
    if isinstance(names, dict):  # older LeRobot: {"motors": [...]}
        names = next(iter(names.values()), None)
    if isinstance(names, list) and j < len(names) and isinstance(names[j], str):
        return f"{feature}[{j}] ({names[j]})"
    return f"{feature}[{j}]"


def signal_checks(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    """Per-feature signal checks over the merged per-episode summaries, then action range."""
    out: list[Candidate] = []
    for name, c in m.features.items():
        s = m.scales[name]
        for check in (_frozen, _jumps, _out_of_range, _clipping, _dead_dimensions):
            out += check(raw, m, th, name, c, s)
    out += _action_range(raw, m, th)
    return out


def _frozen(raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict) -> list[Candidate]:
    """``quality.frozen`` (one vector for most of an episode) and ``quality.frozen_run``."""
    out: list[Candidate] = []
    fps = raw.fps or 0.0
    L = m.rows
    # Frozen vectors.
    longest, midrun = c["frozen_longest"], c["frozen_mid"]
    with np.errstate(invalid="ignore"):
        frozen = (longest >= th["frozen_share"] * L) & (longest >= th["frozen_min_frames"])
        frozen &= L >= 2
    for i in np.flatnonzero(frozen):
        out.append(
            Candidate(
                "quality.frozen",
                f"{name} holds one vector for {int(longest[i])} of {plural(int(L[i]), 'frame')} "
                f"({longest[i] / L[i]:.0%}; threshold {th['frozen_share']:.0%})",
                feature=name,
                value=float(longest[i] / L[i]),
                score=float(longest[i] / L[i] / max(th["frozen_share"], 1e-9)),
                **episode_of(m, i),
            )
        )
    need = max(2, math.ceil(th["frozen_run_seconds"] * fps)) if fps else math.inf
    for i in np.flatnonzero((midrun >= need) & ~frozen):
        out.append(
            Candidate(
                "quality.frozen_run",
                f"{name} holds one vector for {plural(int(midrun[i]), 'frame')} "
                f"({midrun[i] / fps:.1f} s) mid-episode "
                f"(threshold {th['frozen_run_seconds']} s)",
                feature=name,
                value=float(midrun[i]),
                score=float(midrun[i] / need),
                **episode_of(m, i),
            )
        )
    return out


def _jumps(raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict) -> list[Candidate]:
    """``quality.jump``: one step far beyond the dimension's robust step deviation."""
    out: list[Candidate] = []
    with np.errstate(invalid="ignore"):
        limit = np.fmax(th["jump_sigmas"] * s["step_sigma"], th["jump_range_share"] * s["span"])
        limit[~(limit > 0)] = np.nan  # no scale to judge by (a near-constant dimension)
        jump = c["maxstep"] > limit[None, :]
    for i, j in zip(*np.nonzero(jump)):
        v = float(c["maxstep"][i, j])
        out.append(
            Candidate(
                "quality.jump",
                f"{dim_label(raw, name, j)} jumps by {v:.4g} in one step "
                f"({v / s['step_sigma'][j]:.0f} robust step deviations, "
                f"{v / s['span'][j]:.2f} of its range)"
                if s["span"][j] > 0 and s["step_sigma"][j] > 0
                else f"{dim_label(raw, name, j)} jumps by {v:.4g} in one step",
                feature=name,
                dimension=int(j),
                value=v,
                score=v / float(limit[j]) if limit[j] > 0 else math.inf,
                locate="step",
                limits=(float(limit[j]),),
                **episode_of(m, i),
            )
        )
    return out


def _out_of_range(
    raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict
) -> list[Candidate]:
    """``quality.out_of_range``: values far outside the dataset's q1..q99."""
    out: list[Candidate] = []
    rs = np.where(s["span"] > 0, s["span"] / 4.653 * th["range_sigmas"], np.nan)
    lo_lim, hi_lim = s["lo"] - rs, s["hi"] + rs
    with np.errstate(invalid="ignore"):
        over, under = c["maxs"] > hi_lim, c["mins"] < lo_lim
    for i, j in zip(*np.nonzero(over | under)):
        v = float(c["maxs"][i, j] if over[i, j] else c["mins"][i, j])
        sd = s["span"][j] / 4.653
        dev = (v - s["hi"][j] if over[i, j] else s["lo"][j] - v) / sd if sd > 0 else math.inf
        out.append(
            Candidate(
                "quality.out_of_range",
                f"{dim_label(raw, name, j)} reaches {v:.4g}, dataset q1..q99 is "
                f"{s['lo'][j]:.4g}..{s['hi'][j]:.4g} ({dev:.0f} robust deviations beyond)",
                feature=name,
                dimension=int(j),
                value=v,
                score=dev / th["range_sigmas"] if th["range_sigmas"] else math.inf,
                locate="max" if over[i, j] else "min",
                limits=(float(lo_lim[j]), float(hi_lim[j])),
                **episode_of(m, i),
            )
        )
    return out


def _clipping(raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict) -> list[Candidate]:
    """``quality.clipping``: a dimension saturated at its min/max mid-episode."""
    out: list[Candidate] = []
    L = m.rows
    # Clipping (candidates were counted in the pass).
    with np.errstate(invalid="ignore"):
        need_clip = np.maximum(th["clip_min_frames"], th["clip_share"] * L)[:, None]
        clipped = (c["clip"] >= need_clip) & (c["clip"] > 0)
    for i, j in zip(*np.nonzero(clipped)):
        k = int(c["clip"][i, j])
        out.append(
            Candidate(
                "quality.clipping",
                f"{dim_label(raw, name, j)} sits exactly at its min/max for {k} of "
                f"{plural(int(L[i]), 'frame')} mid-episode (saturation?)",
                feature=name,
                dimension=int(j),
                value=k / float(L[i]),
                score=k / float(need_clip[i, 0]),
                locate="extreme",
                **episode_of(m, i),
            )
        )
    return out


def _dead_dimensions(
    raw: RawRoot, m: Merged, th: dict, name: str, c: dict, s: dict
) -> list[Candidate]:
    """``quality.dead_dimension``: one value in every frame of the dataset."""
    out: list[Candidate] = []
    L = m.rows
    # Dead dimensions.
    dmin, dmax = np.nanmin(c["mins"], axis=0), np.nanmax(c["maxs"], axis=0)
    if L.sum() >= 2:
        for j in np.flatnonzero(dmin == dmax):
            out.append(
                Candidate(
                    "quality.dead_dimension",
                    f"{dim_label(raw, name, j)} is {float(dmin[j]):.4g} in every frame",
                    feature=name,
                    dimension=int(j),
                    value=float(dmin[j]),
                    score=1.0,
                )
            )
    return out


def episode_of(m: Merged, i: int) -> dict[str, Any]:
    return {"episode": int(m.episodes[i]), "file": m.file_of(i)}


def dim_names(raw: RawRoot, feature: str, d: int) -> list[str] | None:
    names = raw.features.get(feature, {}).get("names")
    if isinstance(names, dict):
        names = next(iter(names.values()), None)
    if isinstance(names, list) and len(names) == d and all(isinstance(n, str) for n in names):
        return names
    return None


def _action_range(raw: RawRoot, m: Merged, th: dict) -> list[Candidate]:
    """Action dimensions against the state dimension of the same joint: by name when the two
    features share names, else by position when their shapes are equal."""
    a, st = m.features.get("action"), m.features.get("observation.state")
    if a is None or st is None:
        return []
    da, ds = a["mins"].shape[1], st["mins"].shape[1]
    na, ns = dim_names(raw, "action", da), dim_names(raw, "observation.state", ds)
    if na and ns and set(na) & set(ns):
        pairs = [(j, ns.index(n)) for j, n in enumerate(na) if n in ns]
    elif da == ds:
        pairs = [(j, j) for j in range(da)]
    else:
        return []
    smin, smax = np.nanmin(st["mins"], axis=0), np.nanmax(st["maxs"], axis=0)
    out = []
    for ja, js in pairs:
        span = smax[js] - smin[js]
        if not span > 0:
            continue
        lo, hi = (
            smin[js] - th["action_state_margin"] * span,
            smax[js] + th["action_state_margin"] * span,
        )
        amax, amin = a["maxs"][:, ja], a["mins"][:, ja]
        with np.errstate(invalid="ignore"):
            bad = (amax > hi) | (amin < lo)
        for i in np.flatnonzero(bad):
            over = amax[i] > hi
            v = float(amax[i] if over else amin[i])
            beyond = (v - smax[js] if over else smin[js] - v) / span
            out.append(
                Candidate(
                    "quality.action_range",
                    f"{dim_label(raw, 'action', ja)} reaches {v:.4g}, {beyond:.2f} state ranges "
                    f"outside observation.state[{js}] ({smin[js]:.4g}..{smax[js]:.4g})",
                    feature="action",
                    dimension=int(ja),
                    value=v,
                    score=beyond / th["action_state_margin"]
                    if th["action_state_margin"]
                    else math.inf,
                    locate="max" if over else "min",
                    **episode_of(m, i),
                )
            )
    return out
