"""The plan document every partitioner returns (single root, canonical, density split): the
items sorted by bin with their bins and costs, the typed header (:class:`PlanHeader`) and the
figures every plan carries (samples per worker under the policy, balance against the naive
count-based splits, dropped/repeated frames, row groups read per bin)."""

from __future__ import annotations

import hashlib

import numpy as np

from episodekit.metadata.plans.plan_file import PLAN_FORMAT, PLAN_VERSION, PlanHeader


def balance_figures(bin_totals: np.ndarray, items_costs: np.ndarray) -> dict:
    """min/mean/max of the bin totals and max / lower_bound, lower_bound = max(total / bins,
    largest item): 1.0 is a perfect plan."""
    t = np.asarray(bin_totals, dtype=np.float64)
    total = float(t.sum())
    largest = float(np.max(items_costs)) if len(items_costs) else 0.0
    lower = max(total / len(t), largest) if len(t) else 0.0
    return {
        "min": float(t.min()),
        "mean": total / len(t),
        "max": float(t.max()),
        "lower_bound": lower,
        "max_over_lower_bound": round(float(t.max()) / lower, 6) if lower > 0 else 1.0,
        "max_over_mean": round(float(t.max()) / (total / len(t)), 6) if total > 0 else 1.0,
    }


def naive_totals(costs: np.ndarray, num_bins: int) -> dict[str, np.ndarray]:
    """Bin totals of the count-based splits, for comparison: ``contiguous`` (equal-count runs of
    episodes in index order, like ``split_dataset_by_node``) and ``round_robin`` (episode i to bin
    i mod bins, like DistributedSampler)."""
    n = len(costs)
    contiguous_bin = (np.arange(n) * num_bins) // max(n, 1)
    return {
        "contiguous": np.bincount(contiguous_bin, costs, minlength=num_bins),
        "round_robin": np.bincount(np.arange(n) % num_bins, costs, minlength=num_bins),
    }


def plan_document(
    items: np.ndarray,
    bin_of: np.ndarray,
    item_cost: np.ndarray,
    episodes: tuple[np.ndarray, np.ndarray],
    header: PlanHeader,
    algo_used: dict,
    split_episodes: int,
) -> dict:
    """The plan dict of a partition: ``items`` (episode, start, end) sorted by bin, their bins
    and costs, with the figures every plan carries (samples per worker under ``policy``,
    balance against the naive splits, dropped/repeated frames). ``episodes``: every episode's
    (cost, length); ``header``: the parameters the plan records. One shape for every
    partitioner (:func:`~episodekit.metadata.plans.build.build_plan`, the density split)."""
    costs, lengths = episodes
    h = header
    world_size, num_workers, policy = h.world_size, h.num_workers, h.policy
    W, K = int(world_size), int(num_workers)
    B = W * K
    frames = items[:, 2] - items[:, 1]
    bin_cost = np.bincount(bin_of, item_cost, minlength=B)
    bin_frames = np.bincount(bin_of, frames, minlength=B).astype(np.int64)
    per_worker = int(bin_frames.min() if policy == "trim" else bin_frames.max())
    naive = naive_totals(costs, B)
    return {
        "format": PLAN_FORMAT,
        "version": PLAN_VERSION,
        "fingerprint": h.fingerprint,
        "locality": h.locality,
        "world_size": W,
        "num_workers": K,
        "num_bins": B,
        "algo": h.algo,
        "algo_used": algo_used,
        "cost_model": h.cost_model,
        "seed": int(h.seed),
        "split_long": bool(h.split_long),
        "policy": policy,
        "num_episodes": len(costs),
        "num_items": len(items),
        "split_episodes": int(split_episodes),
        "costs_digest": costs_digest(costs),
        "total_frames": int(lengths.sum()),
        "total_cost": float(costs.sum()),
        "samples_per_worker": per_worker,
        "samples_per_rank": per_worker * K,
        "dropped_frames": int(np.clip(bin_frames - per_worker, 0, None).sum()),
        "repeated_frames": int(np.clip(per_worker - bin_frames, 0, None).sum()),
        "balance": {
            "plan": balance_figures(bin_cost, item_cost),
            "plan_ranks": balance_figures(bin_cost.reshape(W, K).sum(1), item_cost),
            "contiguous": balance_figures(naive["contiguous"], costs),
            "round_robin": balance_figures(naive["round_robin"], costs),
        },
        "bin_offsets": np.searchsorted(bin_of, np.arange(B + 1)).astype(np.int64),
        "bin_cost": bin_cost,
        "bin_frames": bin_frames,
        "items": np.asarray(items, dtype=np.int64),
    }


def row_group_figures(item_unit: np.ndarray, bin_of: np.ndarray, num_bins: int) -> dict:
    """How many row groups (units) each bin reads: min/mean/max, and bins per row group."""
    pairs = np.unique(np.stack([bin_of, item_unit], axis=1), axis=0)
    per_bin = np.bincount(pairs[:, 0], minlength=num_bins)
    per_unit = np.bincount(pairs[:, 1])
    per_unit = per_unit[per_unit > 0]
    return {
        "total": int(len(per_unit)),
        "per_bin_min": int(per_bin.min()),
        "per_bin_mean": round(float(per_bin.mean()), 4),
        "per_bin_max": int(per_bin.max()),
        "bins_per_row_group_max": int(per_unit.max()) if len(per_unit) else 0,
    }


def costs_digest(costs: np.ndarray) -> str:
    """Short hash of the cost column a plan was built from (a changed cost table -> new plan)."""
    data = np.ascontiguousarray(costs, dtype="<f8").tobytes()
    return hashlib.sha256(data).hexdigest()[:16]
