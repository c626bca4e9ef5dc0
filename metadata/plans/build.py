"""Balanced shard plans: every episode to exactly one (rank, worker) bin, equal work per rank.

Splitting episodes across ranks by count (DistributedSampler, ``split_dataset_by_node``) leaves the
busiest rank 20-80% above the mean when lengths vary 10-100x. A plan balances the episodes' costs
(``meta/episode_costs.parquet``) first across ``world_size`` ranks, then across ``num_workers``
bins inside each rank (see :mod:`partition` for the algorithms), and fixes ``samples_per_worker``
so every bin, hence every rank, yields the same number of samples per epoch.

With ``locality="rowgroup"`` the bins are instead consecutive runs of the dataset's row groups in
file order (see :func:`partition.contiguous`), still balanced by cost: a worker then decodes about
``rows / bins`` rows plus parts of its two boundary row groups (its share of a row group shared
with other bins is a run of consecutive episodes), instead of every row group of the dataset
(an LPT bin's episodes are scattered over all of them). The row groups come from the parquet
footers (:func:`rowgroup_units`).

A plan is a pure function of (costs, world size, workers, algo, split_long, seed, policy,
locality, and for ``rowgroup`` the episodes' file order and row groups). The seed
is used in one place only: which rank (and which worker inside a rank) receives which bin of the
partition, so that e.g. rank 0 does not always get the largest episode. Two seeds give the same
bins with different labels. Ties between equal costs are broken by episode_index.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset, DatasetError, as_dataset
from episodekit.core.footer import file_layout
from episodekit.core.hashing import splitmix64
from episodekit.core.words import plural
from episodekit.metadata.artifact import (
    FORMAT,
    FRESH,
    Problem,
    artifact_path,
    read_bytes,
    write_bytes,
)
from episodekit.metadata.costs import check_model, costs_for, write_costs
from episodekit.metadata.plans.exclude import Exclusion, keep_pieces
from episodekit.metadata.plans.options import PlanOptions, split_tries
from episodekit.metadata.plans.partition import (
    ALGOS,
    KK_AUTO_MAX_ITEMS,
    LOCALITIES,
    Items,
    partition,
    partition_contiguous,
)
from episodekit.metadata.plans.plan_file import (
    PLAN_DIR,
    PLAN_FORMAT,
    PLAN_VERSION,
    POLICIES,
    Plan,
    PlanError,
    decode_plan,
    encode_plan,
    plan_path,
)

__all__ = [
    "PLAN_DIR",
    "plan_path",
    "build_plan",
    "balance_figures",
    "write_plan",
    "read_plan",
    "ensure_plans",
    "verify_plan",
    "format_balance",
    "rowgroup_units",
    "LOCALITIES",
]


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


def label_permutation(seed: int, groups: int, size: int, salt: int) -> np.ndarray:
    """(groups, size) array: row g is a seeded permutation of range(size)."""
    base = splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ np.uint64(salt))[0]
    keys = splitmix64(np.arange(groups * size, dtype=np.uint64) + base).reshape(groups, size)
    return np.argsort(keys, axis=1, kind="stable")


def relabel_bins(bin_of: np.ndarray, seed: int, world_size: int, num_workers: int) -> np.ndarray:
    """Seeded labels: bin ``r * K + w`` of a partition becomes the plan's bin of rank
    ``rank_perm[r]``, worker ``worker_perm[r, w]`` (the only use of a plan's seed)."""
    W, K = int(world_size), int(num_workers)
    rank_perm = label_permutation(seed, 1, W, salt=1)[0]
    worker_perm = label_permutation(seed, W, K, salt=2)
    r, w = bin_of // K, bin_of % K
    return rank_perm[r] * K + worker_perm[r, w]


def _check_args(
    costs: np.ndarray | None,
    lengths: np.ndarray | None,
    world_size: int,
    num_workers: int,
    algo: str,
    policy: str,
    locality: str = "none",
) -> None:
    """Raise a ValueError naming the bad argument (costs/lengths None: shape checks only)."""
    if locality not in LOCALITIES:
        raise ValueError(f"unknown locality {locality!r} (choose from {', '.join(LOCALITIES)})")
    if int(world_size) < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    if int(num_workers) < 1:
        raise ValueError(f"workers must be >= 1, got {num_workers}")
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r} (choose from {', '.join(ALGOS)})")
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
    if costs is None or lengths is None:
        return
    if len(costs) != len(lengths):
        raise ValueError(f"{len(costs)} costs for {len(lengths)} episodes")
    if len(costs) and (not np.all(np.isfinite(costs)) or costs.min() < 0):
        raise ValueError("costs must be finite and >= 0")
    bins = int(world_size) * int(num_workers)
    frames = int(lengths.sum())
    if bins > frames:
        raise ValueError(
            f"{plural(bins, 'bin')} ({plural(world_size, 'rank')} x "
            f"{plural(num_workers, 'worker')}) but only {plural(frames, 'frame')}: "
            "every bin needs at least one frame"
        )


def _partition_rowgroup(
    items: Items,
    ep: np.ndarray,
    position: np.ndarray | None,
    unit_of_episode: np.ndarray | None,
    W: int,
    K: int,
    split_long: bool,
) -> tuple[Items, np.ndarray, str, dict]:
    """One level: W x K consecutive bins along the file order; rank r holds bins rK..rK+K-1."""
    n = len(ep)
    pos = ep if position is None else np.asarray(position, dtype=np.int64)
    order = np.lexsort((ep, pos))
    u = np.arange(n) if unit_of_episode is None else unit_of_episode[order]
    u = np.maximum.accumulate(u) if n else u  # a unit never comes back in file order
    items, bin_of, used = partition_contiguous(items.take(order), u, W * K, split_long)
    return items, bin_of, used, {used: W}


def _partition_two_level(
    items: Items, W: int, K: int, algo: str, split_long: bool
) -> tuple[Items, np.ndarray, str, dict]:
    """Level 1: ranks; level 2: workers inside each rank (LPT/KK each)."""
    # "auto" tries KK next to LPT only for moderate sizes: KK costs O(items x bins) overall.
    run = "lpt" if algo == "auto" and len(items.cost) > KK_AUTO_MAX_ITEMS else algo
    items, rank, used_ranks = partition(items, W, run, split_long)
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(W + 1))
    parts, bins, used_workers = [], [], {}
    for r in range(W):
        sub = items.take(order[bounds[r] : bounds[r + 1]])
        sub, worker, used = partition(sub, K, run, split_long)
        used_workers[used] = used_workers.get(used, 0) + 1
        parts.append(sub)
        bins.append(r * K + worker)
    return Items.concat(parts), np.concatenate(bins), used_ranks, used_workers


def build_plan(
    costs: np.ndarray,
    lengths: np.ndarray,
    world_size: int,
    num_workers: int,
    algo: str = "auto",
    split_long: bool = False,
    seed: int = 0,
    episode_index: np.ndarray | None = None,
    policy: str = "trim",
    cost_model: str = "frames",
    fingerprint: str = "",
    locality: str = "none",
    position: np.ndarray | None = None,
    unit: np.ndarray | None = None,
    relabel: bool = True,
    exclusion: Exclusion | None = None,
) -> dict:
    """Partition episodes (cost, length) over ``world_size x num_workers`` bins; a pure function.

    ``locality="rowgroup"`` builds bins from consecutive runs of episodes in file order
    (``position`` per episode, e.g. its first global frame; default episode order), cut between
    or inside row groups (``unit`` per episode: its row-group id in file order, default one unit
    per episode); ranks get ``num_workers`` consecutive bins. ``unit`` also gives the plan's
    ``row_groups`` figures (row groups per bin). ``relabel=False`` keeps the partition's bin
    numbers (file order for ``rowgroup``) instead of seeded labels (canonical plans).
    ``exclusion`` leaves frames out: the items are the pieces of each episode between its
    excluded ranges (costs pro rata), and the plan records the exclusion (``excluded``).

    Returns the plan as a dict: the parameters, ``items`` (n, 3) int64 rows (episode_index,
    start_frame, end_frame) sorted by bin, ``bin_offsets``, ``bin_cost``, ``bin_frames``,
    ``samples_per_worker``/``samples_per_rank`` with the frames dropped or repeated by the policy,
    and the ``balance`` figures next to the naive splits'. Raises ValueError for bad arguments.
    """
    costs = np.asarray(costs, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    _check_args(costs, lengths, world_size, num_workers, algo, policy, locality)
    W, K = int(world_size), int(num_workers)
    B = W * K
    n = len(costs)
    ep = np.arange(n, dtype=np.int64) if episode_index is None else np.asarray(episode_index)
    ep = ep.astype(np.int64)
    items = Items(ep, np.zeros(n, np.int64), lengths.copy(), costs.copy())
    unit_of_episode = None if unit is None else np.asarray(unit, dtype=np.int64)
    item_ep, item_pos, item_unit = ep, position, unit_of_episode
    if exclusion:
        items, item_ep, item_pos, item_unit = _pieces(items, exclusion, position, unit)
        if not len(items):
            raise ValueError("the exclusion leaves no frame to plan")

    if locality == "rowgroup":
        items, bin_of, used_ranks, used_workers = _partition_rowgroup(
            items, item_ep, item_pos, item_unit, W, K, split_long
        )
    else:
        items, bin_of, used_ranks, used_workers = _partition_two_level(
            items, W, K, algo, split_long
        )

    if relabel:  # seeded labels: permute ranks, and workers inside each rank
        bin_of = relabel_bins(bin_of, seed, W, K)

    order = np.lexsort((items.start, items.episode, bin_of))
    items, bin_of = items.take(order), bin_of[order]
    bin_frames = np.bincount(bin_of, items.end - items.start, minlength=B)
    empty = np.flatnonzero(bin_frames == 0)
    if len(empty):
        raise _empty_bins(len(empty), W, K, len(items) if exclusion else n, exclusion, split_long)
    plan = plan_document(
        np.stack([items.episode, items.start, items.end], axis=1),
        bin_of,
        items.cost,
        costs,
        lengths,
        W,
        K,
        fingerprint=fingerprint,
        locality=locality,
        algo=algo,
        algo_used={"ranks": used_ranks, "workers": dict(sorted(used_workers.items()))},
        cost_model=cost_model,
        seed=seed,
        split_long=split_long,
        policy=policy,
        split_episodes=_split_count(items),
    )
    if exclusion:
        plan["excluded"] = exclusion_record(exclusion, len(np.unique(items.episode)), n)
    if unit_of_episode is not None:
        pos_of = np.searchsorted(np.sort(ep), items.episode)
        unit_sorted = unit_of_episode[np.argsort(ep, kind="stable")]
        plan["row_groups"] = row_group_figures(unit_sorted[pos_of], bin_of, B)
    return plan


def _empty_bins(
    empty: int, W: int, K: int, have: int, exclusion: Exclusion | None, split_long: bool
) -> ValueError:
    """The error for a partition that left ``empty`` bins without a frame (``have``: episodes,
    or the pieces left after the exclusion)."""
    hint = "" if split_long else " (use --split-long auto to cut long episodes)"
    left = plural(have, "piece") + " left after the exclusion" if exclusion else ""
    return ValueError(
        f"{empty} of {plural(W * K, 'bin')} got no frames: {left or plural(have, 'episode')} "
        f"{'is' if have == 1 else 'are'} too few for {plural(W, 'rank')} x "
        f"{plural(K, 'worker')}{hint}"
    )


def _pieces(
    items: Items, exclusion: Exclusion, position: np.ndarray | None, unit: np.ndarray | None
) -> tuple[Items, np.ndarray, np.ndarray, np.ndarray | None]:
    """The items left by ``exclusion`` (one per kept piece of an episode, cost pro rata) with
    each piece's episode, file position (its episode's plus its start) and row-group unit."""
    e, s, t, p = keep_pieces(items.episode, items.end, exclusion.ranges)
    length = np.maximum(items.end[p], 1)
    cost = items.cost[p] * (t - s) / length
    base = items.episode if position is None else np.asarray(position, dtype=np.int64)
    pos = base[p] + s
    unit_of = None if unit is None else np.asarray(unit, dtype=np.int64)[p]
    return Items(e, s, t, cost), e, pos, unit_of


def exclusion_record(exclusion: Exclusion, episodes_left: int, episodes: int) -> dict:
    """What a plan records of its exclusion: frames and whole episodes left out, frames per
    reason, the digest that decides freshness, and the ranges themselves."""
    r = exclusion.ranges
    return {
        "frames": exclusion.frames,
        "episodes": int(episodes - episodes_left),
        "reasons": dict(sorted(exclusion.reasons.items())),
        "digest": exclusion.digest,
        "ranges": r.tolist(),
    }


def plan_document(
    items: np.ndarray,
    bin_of: np.ndarray,
    item_cost: np.ndarray,
    costs: np.ndarray,
    lengths: np.ndarray,
    world_size: int,
    num_workers: int,
    *,
    fingerprint: str | None,
    locality: str,
    algo: str,
    algo_used: dict,
    cost_model: str,
    seed: int,
    split_long: bool,
    policy: str,
    split_episodes: int,
) -> dict:
    """The plan dict of a partition: ``items`` (episode, start, end) sorted by bin, their bins
    and costs, with the figures every plan carries (samples per worker under ``policy``,
    balance against the naive splits, dropped/repeated frames). One shape for every
    partitioner (:func:`build_plan`, the density split)."""
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
        "fingerprint": fingerprint,
        "locality": locality,
        "world_size": W,
        "num_workers": K,
        "num_bins": B,
        "algo": algo,
        "algo_used": algo_used,
        "cost_model": cost_model,
        "seed": int(seed),
        "split_long": bool(split_long),
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


def rowgroup_units(ds: Dataset, episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per episode (in ``episode_index`` order): its file-order position (first global frame)
    and its row-group unit (row groups numbered in file order, from the parquet footers; row
    groups joined by an episode that spans them share one unit). Reads footers only."""
    frm_all = ds.column("dataset_from_index").astype(np.int64)
    to_all = ds.column("dataset_to_index").astype(np.int64)
    fid_all = ds.column("file_id").astype(np.int64)
    files = np.unique(fid_all)
    first = np.array([frm_all[fid_all == f].min() for f in files], dtype=np.int64)
    files = files[np.argsort(first, kind="stable")]
    rg_start, offset = [], 0
    base = np.zeros(int(fid_all.max()) + 1 if len(fid_all) else 0, dtype=np.int64)
    starts_of: dict[int, np.ndarray] = {}
    for f in files.tolist():
        path = ds.data_path(f)
        try:
            rows = file_layout(path, ds.fs).row_group_rows
        except (OSError, ValueError) as exc:
            raise DatasetError(f"cannot read the parquet footer ({exc})", path) from exc
        starts_of[f] = np.cumsum(rows) - rows + frm_all[fid_all == f].min()
        base[f] = offset
        offset += max(len(rows), 1)
        rg_start.append(starts_of[f])
    rows_idx = ds.episode_rows(np.asarray(episode_index))
    frm, to, fid = frm_all[rows_idx], to_all[rows_idx], fid_all[rows_idx]
    rg_first = np.zeros(len(frm), np.int64)
    rg_last = np.zeros(len(frm), np.int64)
    for f in np.unique(fid).tolist():
        sel = fid == f
        s = starts_of[f]
        rg_first[sel] = base[f] + np.maximum(np.searchsorted(s, frm[sel], side="right") - 1, 0)
        last = np.maximum(to[sel] - 1, frm[sel])
        rg_last[sel] = base[f] + np.maximum(np.searchsorted(s, last, side="right") - 1, 0)
    order = np.lexsort((np.asarray(episode_index), frm))
    a, b = rg_first[order], rg_last[order]
    reach = np.maximum.accumulate(b) if len(b) else b
    new = np.r_[True, a[1:] > reach[:-1]] if len(a) else np.zeros(0, bool)
    unit = np.empty(len(order), np.int64)
    unit[order] = np.cumsum(new) - 1
    return frm, unit


def _split_count(items: Items) -> int:
    """How many episodes were cut into more than one piece."""
    counts = np.unique(items.episode, return_counts=True)[1]
    return int((counts > 1).sum())


def costs_digest(costs: np.ndarray) -> str:
    """Short hash of the cost column a plan was built from (a changed cost table -> new plan)."""
    data = np.ascontiguousarray(costs, dtype="<f8").tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def write_plan(ds: Dataset | str, plan: dict) -> str:
    """Write ``plan`` atomically to its path under the dataset root; return that path."""
    return write_bytes(ds, plan_path(plan["world_size"], plan["num_workers"]), encode_plan(plan))


def read_plan(ds: Dataset | str, world_size: int, num_workers: int) -> dict | None:
    """The stored plan for one shape as a dict (no freshness check), or None when absent."""
    rel = plan_path(world_size, num_workers)
    data = read_bytes(ds, rel)
    if data is None:
        return None
    limit = ds.num_frames if isinstance(ds, Dataset) else None
    return decode_plan(data, artifact_path(ds, rel), max_items=limit)


def plan_for_dataset(
    ds: Dataset,
    costs: pa.Table,
    world_size: int,
    num_workers: int,
    algo: str = "auto",
    split_long: bool = False,
    seed: int = 0,
    policy: str = "trim",
    locality: str = "none",
    exclusion: Exclusion | None = None,
) -> dict:
    """:func:`build_plan` on a dataset's cost table (recording its model and fingerprint); for
    ``locality="rowgroup"`` the episodes' row groups come from the data files' footers."""
    from episodekit.metadata.costs import costs_meta

    position = unit = None
    if locality == "rowgroup":
        position, unit = rowgroup_units(ds, costs["episode_index"].to_numpy())
    return build_plan(
        costs["cost"].to_numpy(),
        costs["length"].to_numpy(),
        world_size,
        num_workers,
        algo=algo,
        split_long=split_long,
        seed=seed,
        episode_index=costs["episode_index"].to_numpy(),
        policy=policy,
        cost_model=costs_meta(costs).get("model", "frames"),
        fingerprint=ds.fingerprint,
        locality=locality,
        position=position,
        unit=unit,
        exclusion=exclusion,
    )


def ensure_plans(
    root: str | Dataset,
    world_sizes: list[int],
    num_workers: int,
    options: PlanOptions | None = None,
    **overrides: Any,
) -> list[tuple[str, dict, bool]]:
    """Build one plan per world size, then write the cost table (when it was computed) and the
    plans: a shape that cannot be planned raises (ValueError) before any file is written.

    A plan that exists with the same fingerprint, parameters and costs is kept (``changed`` is
    False). ``locality`` is ``none`` (LPT/KK over all episodes) or ``rowgroup`` (consecutive
    runs of row groups, see :func:`build_plan`). ``split_long="auto"``: whole episodes where
    they fill every bin, else cut (:func:`~episodekit.metadata.plans.options.split_tries`; a
    fresh plan of either kind is kept). Returns ``[(path, plan, changed), ...]`` in the order
    of ``world_sizes``.
    """
    o = PlanOptions.of(options, overrides)
    cost, algo, seed = o.cost, o.algo, o.seed
    force, policy, locality = o.force, o.policy, o.locality
    check_model(cost)
    ds = as_dataset(root)
    for w in world_sizes:  # fail on a bad shape before computing anything
        _check_args(None, None, w, num_workers, algo, policy, locality)
    costs, computed = costs_for(ds, cost)
    digest = costs_digest(costs["cost"].to_numpy())
    wanted = {
        "num_workers": int(num_workers),
        "algo": algo,
        "seed": int(seed),
        "policy": policy,
        "cost_model": cost,
        "locality": locality,
    }
    excluded_digest = o.exclusion.digest if o.exclusion else None
    episodes = int((costs["length"].to_numpy() > 0).sum())
    out = []
    for w in world_sizes:
        path = ds.join(plan_path(w, num_workers))
        tries = split_tries(o.split_long, episodes, int(w) * int(num_workers))
        if not force:
            try:
                old = read_plan(ds, w, num_workers)
            except PlanError:
                old = None
            if (
                old is not None
                and old.get("fingerprint") == ds.fingerprint
                and old.get("costs_digest") == digest
                and all(
                    old.get(k, "none" if k == "locality" else None) == v
                    for k, v in {**wanted, "world_size": int(w)}.items()
                )
                and bool(old.get("split_long")) in tries
                and (old.get("excluded") or {}).get("digest") == excluded_digest
            ):
                out.append((path, old, False))
                continue
        plan = _first_plan(tries, ds, costs, w, num_workers, o)
        out.append((path, plan, True))
    if computed:  # every plan was built: only now is anything written
        write_costs(ds, cost, costs)
    return [(write_plan(ds, p) if changed else path, p, changed) for path, p, changed in out]


def _first_plan(
    tries: list[bool], ds: Dataset, costs: pa.Table, w: int, k: int, o: PlanOptions
) -> dict:
    """The plan of the first ``split_long`` value in ``tries`` that gives every bin a frame
    (the last one's ValueError when none does)."""
    for i, split in enumerate(tries):
        try:
            return plan_for_dataset(
                ds, costs, w, k, o.algo, split, o.seed, o.policy, o.locality, o.exclusion
            )
        except ValueError:
            if i == len(tries) - 1:
                raise
    raise ValueError("no split_long value to try")  # pragma: no cover - tries is never empty


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def verify_plan(plan: dict | Plan, ds: Dataset, costs: pa.Table | None = None) -> list[Problem]:
    """Problems with a plan against ``ds`` (empty when OK): freshness, every episode covered
    exactly once by non-overlapping frame ranges, per-bin totals, samples per rank, and the stored
    balance figures against a recomputation from the cost table (``costs``, else the stored one
    when its model matches, else computed)."""
    doc = plan.doc if isinstance(plan, Plan) else plan
    problems: list[Problem] = []
    if doc.get("fingerprint") != ds.fingerprint:
        problems.append(
            Problem(
                f"stale plan: fingerprint {doc.get('fingerprint')!r}, dataset has "
                f"{ds.fingerprint!r}",
                FRESH,
            )
        )
        return problems
    W, K, B = int(doc["world_size"]), int(doc["num_workers"]), int(doc["num_bins"])
    if doc.get("locality", "none") not in LOCALITIES:
        problems.append(Problem(f"unknown locality {doc.get('locality')!r}", FORMAT))
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
    expect = bin_frames.min() if doc["policy"] == "trim" else bin_frames.max()
    if per_worker != expect:
        problems.append(
            f"samples_per_worker {per_worker} but policy {doc['policy']} gives {expect}"
        )
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

    model = doc["cost_model"]
    if costs is None or costs_meta(costs).get("model") != model:
        stored = read_costs(ds)
        ok = stored is not None and costs_meta(stored).get("model") == model
        costs = stored if ok and costs_meta(stored).get("fingerprint") == ds.fingerprint else None
        costs = costs if costs is not None else compute_costs(ds, model)
    ep_cost = costs["cost"].to_numpy()
    length = costs["length"].to_numpy()
    if doc.get("costs_digest") not in (None, costs_digest(ep_cost)):
        return ["plan was built from other episode costs than the current cost table"]
    pos = np.searchsorted(costs["episode_index"].to_numpy(), e)
    item_cost = ep_cost[pos] * frames / np.maximum(length[pos], 1)
    B, K = int(doc["num_bins"]), int(doc["num_workers"])
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


def format_balance(plan: dict) -> str:
    """A few lines comparing the plan's balance with the naive splits (for the CLI)."""
    b = plan["balance"]
    lines = [
        f"ws={plan['world_size']} x nw={plan['num_workers']}: {plural(plan['num_items'], 'item')} "
        f"({plural(plan['split_episodes'], 'episode')} split), algo {plan['algo']} -> "
        f"{plan['algo_used']['ranks']}/{','.join(plan['algo_used']['workers'])}, "
        f"cost {plan['cost_model']}, locality {plan.get('locality', 'none')}",
        f"  {'split':<12}{'min':>14}{'mean':>14}{'max':>14}{'max/lower_bound':>17}",
    ]
    for name in ("plan", "plan_ranks", "contiguous", "round_robin"):
        f = b[name]
        label = {"plan_ranks": "plan (ranks)"}.get(name, name)
        lines.append(
            f"  {label:<12}{f['min']:>14,.0f}{f['mean']:>14,.1f}{f['max']:>14,.0f}"
            f"{f['max_over_lower_bound']:>17.4f}"
        )
    rg = plan.get("row_groups")
    if rg:
        lines.append(
            f"  row groups read per bin: min {rg['per_bin_min']}, mean {rg['per_bin_mean']:g}, "
            f"max {rg['per_bin_max']} (of {rg['total']}); at most "
            f"{plural(rg['bins_per_row_group_max'], 'bin')} share one"
        )
    lines.append(
        f"  samples_per_rank {plan['samples_per_rank']:,} (= {plan['samples_per_worker']:,} per "
        f"worker, policy {plan['policy']}): drops {plan['dropped_frames']:,} and repeats "
        f"{plan['repeated_frames']:,} of {plural(plan['total_frames'], 'frame')} per epoch"
    )
    return "\n".join(lines)
