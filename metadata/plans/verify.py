"""``verify_plan``: a stored plan checked against its dataset (freshness, coverage of every
frame, per-bin totals, samples per rank, balance figures recomputed from the cost table)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset
from episodekit.core.words import plural
from episodekit.metadata.artifact import FORMAT, FRESH, Problem
from episodekit.metadata.plans.document import balance_figures, costs_digest, naive_totals
from episodekit.metadata.plans.partition import LOCALITIES
from episodekit.metadata.plans.plan_file import Plan, PlanHeader


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def verify_plan(plan: dict | Plan, ds: Dataset, costs: pa.Table | None = None) -> list[Problem]:
    """Problems with a plan against ``ds`` (empty when OK): freshness, every episode covered
    exactly once by non-overlapping frame ranges, per-bin totals, samples per rank, and the stored
    balance figures against a recomputation from the cost table (``costs``, else the stored one
    when its model matches, else computed)."""
    doc = plan.doc if isinstance(plan, Plan) else plan
    h = PlanHeader.of(doc)
    problems: list[Problem] = []
    if h.fingerprint != ds.fingerprint:
        problems.append(
            Problem(
                f"stale plan: fingerprint {h.fingerprint!r}, dataset has {ds.fingerprint!r}",
                FRESH,
            )
        )
        return problems
    W, K, B = h.world_size, h.num_workers, int(doc["num_bins"])
    if h.locality not in LOCALITIES:
        problems.append(Problem(f"unknown locality {h.locality!r}", FORMAT))
        return problems
    if B != W * K:
        problems.append(Problem(f"num_bins {B} != world_size {W} x num_workers {K}", FORMAT))
        return problems
    items = np.asarray(doc["items"], dtype=np.int64).reshape(-1, 3)
    offsets = np.asarray(doc["bin_offsets"], dtype=np.int64)
    if len(offsets) != B + 1 or offsets[0] != 0 or offsets[-1] != len(items):
        return problems + [Problem("bin_offsets do not match the items", FORMAT)]
    if np.any(np.diff(offsets) < 0):
        return problems + [Problem("bin_offsets are not ascending", FORMAT)]
    bin_of = np.repeat(np.arange(B), np.diff(offsets))
    e, s, t = items[:, 0], items[:, 1], items[:, 2]
    x = excluded_ranges(doc)  # the items and the excluded ranges together tile every episode
    covered = [np.r_[col, x[:, j]] for j, col in enumerate((e, s, t))]
    problems += [Problem(p) for p in _coverage_problems(*covered, ds)]
    if problems:
        return problems
    frames = t - s
    bin_frames = np.bincount(bin_of, frames, minlength=B)
    if not np.array_equal(bin_frames, np.asarray(doc["bin_frames"])):
        problems.append("stored bin_frames differ from the items")
    per_worker = int(doc["samples_per_worker"])
    expect = bin_frames.min() if h.policy == "trim" else bin_frames.max()
    if per_worker != expect:
        problems.append(f"samples_per_worker {per_worker} but policy {h.policy} gives {expect}")
    if int(doc["samples_per_rank"]) != per_worker * K:
        problems.append("samples_per_rank != samples_per_worker x num_workers")
    if int(doc["dropped_frames"]) != int(np.clip(bin_frames - per_worker, 0, None).sum()):
        problems.append("dropped_frames does not match the bins")
    if int(doc["repeated_frames"]) != int(np.clip(per_worker - bin_frames, 0, None).sum()):
        problems.append("repeated_frames does not match the bins")
    problems += _balance_problems(doc, ds, costs, e, frames, bin_of)
    return [p if isinstance(p, Problem) else Problem(p) for p in problems]


def excluded_ranges(doc: dict) -> np.ndarray:
    """The (episode, start, end) ranges a plan document records as excluded (none: empty)."""
    rows = (doc.get("excluded") or {}).get("ranges") or []
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def _coverage_problems(e: np.ndarray, s: np.ndarray, t: np.ndarray, ds: Dataset) -> list[str]:
    ds_ep, ds_len = ds.column("episode_index"), ds.column("length")
    order = np.lexsort((s, e))
    e, s, t = e[order], s[order], t[order]
    uniq = np.unique(e)
    problems = []
    if not np.array_equal(uniq, ds_ep):
        missing = np.setdiff1d(ds_ep, uniq)
        extra = np.setdiff1d(uniq, ds_ep)
        problems.append(
            f"plan covers {plural(len(uniq), 'episode')}, dataset has {len(ds_ep)} "
            f"(missing {missing[:5].tolist()}, unknown {extra[:5].tolist()})"
        )
        return problems
    length = ds_len[np.searchsorted(ds_ep, e)]
    first = np.r_[True, e[1:] != e[:-1]] if len(e) else np.zeros(0, bool)
    last = np.r_[e[1:] != e[:-1], True] if len(e) else np.zeros(0, bool)
    bad = np.flatnonzero(
        (first & (s != 0)) | (last & (t != length)) | (t < s) | ((t == s) & (length > 0))
    )
    cont = np.flatnonzero(~first[1:] & (s[1:] != t[:-1])) + 1 if len(e) else np.zeros(0, int)
    if len(bad):
        i = bad[0]
        problems.append(
            f"episode {e[i]}: item [{s[i]}, {t[i]}) does not fit its length {length[i]} "
            "(pieces must start at 0, end at the length, and be non-empty)"
        )
    if len(cont):
        i = cont[0]
        problems.append(
            f"episode {e[i]}: pieces overlap or leave a gap at frame {t[i - 1]} / {s[i]}"
        )
    return problems


def _balance_problems(doc, ds, costs, e, frames, bin_of) -> list[str]:
    from episodekit.metadata.costs import compute_costs, costs_meta, read_costs

    h = PlanHeader.of(doc)
    model = h.cost_model
    if costs is None or costs_meta(costs).get("model") != model:
        stored = read_costs(ds)
        ok = stored is not None and costs_meta(stored).get("model") == model
        costs = stored if ok and costs_meta(stored).get("fingerprint") == ds.fingerprint else None
        costs = costs if costs is not None else compute_costs(ds, model)
    ep_cost = costs["cost"].to_numpy()
    length = costs["length"].to_numpy()
    if h.costs_digest not in (None, costs_digest(ep_cost)):
        return ["plan was built from other episode costs than the current cost table"]
    pos = np.searchsorted(costs["episode_index"].to_numpy(), e)
    item_cost = ep_cost[pos] * frames / np.maximum(length[pos], 1)
    B, K = int(doc["num_bins"]), h.num_workers
    bin_cost = np.bincount(bin_of, item_cost, minlength=B)
    naive = naive_totals(ep_cost, B)
    expect = {
        "plan": balance_figures(bin_cost, item_cost),
        "plan_ranks": balance_figures(bin_cost.reshape(-1, K).sum(1), item_cost),
        "contiguous": balance_figures(naive["contiguous"], ep_cost),
        "round_robin": balance_figures(naive["round_robin"], ep_cost),
    }
    problems = []
    stored = doc.get("balance") or {}
    for name, figs in expect.items():
        got = stored.get(name) or {}
        for key, value in figs.items():
            tol = 1e-5 if key.startswith("max_over") else 0
            if key not in got or not (abs(got[key] - value) <= tol or _close(got[key], value)):
                problems.append(f"balance[{name}][{key}] is {got.get(key)}, recomputed {value}")
    if not np.allclose(np.asarray(doc["bin_cost"], dtype=np.float64), bin_cost, rtol=1e-9):
        problems.append("stored bin_cost differs from a recomputation")
    return problems
