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

from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.core.hashing import splitmix64
from episodekit.core.words import plural
from episodekit.metadata.artifact import artifact_path, read_bytes, write_bytes
from episodekit.metadata.costs import check_model, costs_for, write_costs
from episodekit.metadata.plans.document import (
    balance_figures,
    costs_digest,
    naive_totals,
    plan_document,
    row_group_figures,
)
from episodekit.metadata.plans.exclude import Exclusion, keep_pieces
from episodekit.metadata.plans.options import (
    BuildParams,
    PlanInfeasible,
    PlanOptions,
    split_tries,
)
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
    POLICIES,
    PlanError,
    PlanHeader,
    decode_plan,
    encode_plan,
    plan_path,
)
from episodekit.metadata.plans.rowgroup_units import rowgroup_units
from episodekit.metadata.plans.verify import excluded_ranges, verify_plan

__all__ = [
    "PLAN_DIR",
    "BuildParams",
    "PlanInfeasible",
    "plan_path",
    "build_plan",
    "balance_figures",
    "costs_digest",
    "excluded_ranges",
    "naive_totals",
    "plan_document",
    "row_group_figures",
    "write_plan",
    "read_plan",
    "ensure_plans",
    "verify_plan",
    "format_balance",
    "rowgroup_units",
    "LOCALITIES",
]


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
    params: BuildParams | None = None,
    **overrides: Any,
) -> dict:
    """Partition episodes (cost, length) over ``world_size x num_workers`` bins; a pure function.

    ``params`` (:class:`BuildParams`; keyword arguments override its fields): the algorithm,
    ``split_long``, label ``seed``, ``policy``, the recorded ``cost_model`` and
    ``fingerprint``, ``episode_index`` per episode. ``locality="rowgroup"`` builds bins from
    consecutive runs of episodes in file order (``position`` per episode, e.g. its first global
    frame; default episode order), cut between or inside row groups (``unit`` per episode: its
    row-group id in file order, default one unit per episode); ranks get ``num_workers``
    consecutive bins. ``unit`` also gives the plan's ``row_groups`` figures (row groups per
    bin). ``relabel=False`` keeps the partition's bin numbers (file order for ``rowgroup``)
    instead of seeded labels (canonical plans). ``exclusion`` leaves frames out: the items are
    the pieces of each episode between its excluded ranges (costs pro rata), and the plan
    records the exclusion (``excluded``).

    Returns the plan as a dict: the parameters, ``items`` (n, 3) int64 rows (episode_index,
    start_frame, end_frame) sorted by bin, ``bin_offsets``, ``bin_cost``, ``bin_frames``,
    ``samples_per_worker``/``samples_per_rank`` with the frames dropped or repeated by the policy,
    and the ``balance`` figures next to the naive splits'. Raises ValueError for bad arguments,
    :class:`PlanInfeasible` (a ValueError) when a bin gets no frame.
    """
    p = BuildParams.of(params, overrides)
    algo, split_long, seed, policy, locality = p.algo, p.split_long, p.seed, p.policy, p.locality
    position, unit, exclusion = p.position, p.unit, p.exclusion
    costs = np.asarray(costs, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    _check_args(costs, lengths, world_size, num_workers, algo, policy, locality)
    W, K = int(world_size), int(num_workers)
    B = W * K
    n = len(costs)
    ep = np.arange(n, dtype=np.int64) if p.episode_index is None else np.asarray(p.episode_index)
    ep = ep.astype(np.int64)
    items = Items(ep, np.zeros(n, np.int64), lengths.copy(), costs.copy())
    unit_of_episode = None if unit is None else np.asarray(unit, dtype=np.int64)
    item_ep, item_pos, item_unit = ep, position, unit_of_episode
    if exclusion:
        items, item_ep, item_pos, item_unit = _pieces(items, exclusion, position, unit)
        if not len(items):
            raise PlanInfeasible("the exclusion leaves no frame to plan")

    if locality == "rowgroup":
        items, bin_of, used_ranks, used_workers = _partition_rowgroup(
            items, item_ep, item_pos, item_unit, W, K, split_long
        )
    else:
        items, bin_of, used_ranks, used_workers = _partition_two_level(
            items, W, K, algo, split_long
        )

    if p.relabel:  # seeded labels: permute ranks, and workers inside each rank
        bin_of = relabel_bins(bin_of, seed, W, K)

    order = np.lexsort((items.start, items.episode, bin_of))
    items, bin_of = items.take(order), bin_of[order]
    bin_frames = np.bincount(bin_of, items.end - items.start, minlength=B)
    empty = np.flatnonzero(bin_frames == 0)
    if len(empty):
        raise _empty_bins(len(empty), W, K, len(items) if exclusion else n, exclusion, split_long)
    header = PlanHeader(
        W, K, algo, p.cost_model, seed, split_long, policy, locality, fingerprint=p.fingerprint
    )
    plan = plan_document(
        np.stack([items.episode, items.start, items.end], axis=1),
        bin_of,
        items.cost,
        (costs, lengths),
        header,
        algo_used={"ranks": used_ranks, "workers": dict(sorted(used_workers.items()))},
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
) -> PlanInfeasible:
    """The error for a partition that left ``empty`` bins without a frame (``have``: episodes,
    or the pieces left after the exclusion)."""
    hint = "" if split_long else " (use --split-long auto to cut long episodes)"
    left = plural(have, "piece") + " left after the exclusion" if exclusion else ""
    return PlanInfeasible(
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


def _split_count(items: Items) -> int:
    """How many episodes were cut into more than one piece."""
    counts = np.unique(items.episode, return_counts=True)[1]
    return int((counts > 1).sum())


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
    options: PlanOptions | None = None,
    **overrides: Any,
) -> dict:
    """:func:`build_plan` on a dataset's cost table (recording its model and fingerprint), with
    the plan options ``options`` (keyword arguments override its fields; ``split_long`` as a
    bool here); for ``locality="rowgroup"`` the episodes' row groups come from the data files'
    footers."""
    params = dataset_params(ds, costs, PlanOptions.of(options, overrides))
    return build_plan(costs["cost"].to_numpy(), costs["length"].to_numpy(), world_size,
                      num_workers, params)  # fmt: skip


def dataset_params(ds: Dataset, costs: pa.Table, o: PlanOptions) -> BuildParams:
    """:func:`build_plan`'s parameters for the episodes of ``costs`` (a dataset's cost table):
    the plan options, the table's cost model, the dataset's fingerprint and, for
    ``locality="rowgroup"``, each episode's file position and row-group unit (footers only)."""
    from episodekit.metadata.costs import costs_meta

    ep = costs["episode_index"].to_numpy()
    position = unit = None
    if o.locality == "rowgroup":
        position, unit = rowgroup_units(ds, ep)
    return BuildParams(
        algo=o.algo,
        split_long=o.split_long,  # type: ignore[arg-type]
        seed=o.seed,
        policy=o.policy,
        cost_model=costs_meta(costs).get("model", "frames"),
        fingerprint=ds.fingerprint,
        locality=o.locality,
        episode_index=ep,
        position=position,
        unit=unit,
        exclusion=o.exclusion,
    )


def plan_header(
    ds: Dataset, world_size: int, num_workers: int, o: PlanOptions, digest: str
) -> PlanHeader:
    """The header a fresh plan of these options has on ``ds`` with the cost column of
    ``digest`` (its ``split_long`` is decided by :func:`split_tries`)."""
    return PlanHeader(
        world_size=int(world_size),
        num_workers=int(num_workers),
        algo=o.algo,
        cost_model=o.cost,
        seed=int(o.seed),
        policy=o.policy,
        locality=o.locality,
        fingerprint=ds.fingerprint,
        costs_digest=digest,
        excluded_digest=o.exclusion.digest if o.exclusion else None,
    )


def fresh_plan(ds: Dataset, rel: str, wanted: PlanHeader, splits: list[bool]) -> dict | None:
    """The plan stored at ``rel`` when it answers ``wanted`` (:meth:`PlanHeader.fresh_for`),
    else None (absent, unreadable, or made otherwise): the one freshness check of shard and
    canonical plans."""
    try:
        raw = read_bytes(ds, rel)
        old = None if raw is None else decode_plan(raw, rel, max_items=ds.num_frames)
    except PlanError:
        return None
    if old is None or not PlanHeader.of(old).fresh_for(wanted, splits):
        return None
    return old


def ensure_plans(
    root: str | Dataset,
    world_sizes: list[int],
    num_workers: int,
    options: PlanOptions | None = None,
    **overrides: Any,
) -> list[tuple[str, dict, bool]]:
    """Build one plan per world size, then write the cost table (when it was computed) and the
    plans: a shape that cannot be planned raises (ValueError; :class:`PlanInfeasible` when a
    bin gets no frame) before any file is written.

    A plan that exists with the same fingerprint, parameters and costs is kept (``changed`` is
    False). ``locality`` is ``none`` (LPT/KK over all episodes) or ``rowgroup`` (consecutive
    runs of row groups, see :func:`build_plan`). ``split_long="auto"``: whole episodes where
    they fill every bin, else cut (:func:`~episodekit.metadata.plans.options.split_tries`; a
    fresh plan of either kind is kept). Returns ``[(path, plan, changed), ...]`` in the order
    of ``world_sizes``.
    """
    o = PlanOptions.of(options, overrides)
    check_model(o.cost)
    ds = as_dataset(root)
    for w in world_sizes:  # fail on a bad shape before computing anything
        _check_args(None, None, w, num_workers, o.algo, o.policy, o.locality)
    costs, computed = costs_for(ds, o.cost)
    digest = costs_digest(costs["cost"].to_numpy())
    episodes = int((costs["length"].to_numpy() > 0).sum())
    out = []
    for w in world_sizes:
        rel = plan_path(w, num_workers)
        tries = split_tries(o.split_long, episodes, int(w) * int(num_workers))
        old = None
        if not o.force:
            old = fresh_plan(ds, rel, plan_header(ds, w, num_workers, o, digest), tries)
        if old is not None:
            out.append((ds.join(rel), old, False))
            continue
        plan = _first_plan(tries, ds, costs, w, num_workers, o)
        out.append((ds.join(rel), plan, True))
    if computed:  # every plan was built: only now is anything written
        write_costs(ds, o.cost, costs)
    return [(write_plan(ds, p) if changed else path, p, changed) for path, p, changed in out]


def _first_plan(
    tries: list[bool], ds: Dataset, costs: pa.Table, w: int, k: int, o: PlanOptions
) -> dict:
    """The plan of the first ``split_long`` value in ``tries`` that gives every bin a frame
    (the last one's :class:`PlanInfeasible` when none does)."""
    for i, split in enumerate(tries):
        try:
            return plan_for_dataset(ds, costs, w, k, replace(o, split_long=split))
        except PlanInfeasible:
            if i == len(tries) - 1:
                raise
    raise ValueError("no split_long value to try")  # pragma: no cover - tries is never empty


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
