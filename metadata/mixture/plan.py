"""Mixture plans: one shard plan over several sources, with exact per-source quotas per epoch.

How a plan is built (a pure function of the sources' costs, the spec and the parameters):

1. The epoch: ``epoch_frames`` (default: the sources' selected frames) rounded to a multiple of
   the ``W x K`` bins (``trim`` down, ``wrap`` up), so every bin yields ``samples_per_worker``.
   Quotas per source: exact integers summing to that epoch (:mod:`metadata.mixture.spec`).
2. Each source is partitioned on its own into the ``W x K`` bins:
   - cost per frame constant (the ``frames`` model), or ``rowgroup`` locality: by cost, exactly
     as a single-root plan (:func:`plans.build_plan`: LPT/KK, or ``rowgroup`` on that source's
     row groups) with ``split_long`` always on: episodes are cut into frame ranges only where
     whole ones leave a bin more than 0.1% off, so each bin holds ~``1/bins`` of every source;
   - cost per frame varying across the source's episodes (``bytes``, ``decode``; ``compute``
     only when action widths or cameras differ) with locality ``none``: the two-ended density
     split (:mod:`metadata.plans.density_split`): every bin gets exactly ``floor`` or ``ceil`` of
     the source's ``frames / bins`` (the ``ceil`` ones in the bins that draw ``ceil(quota / bins)``
     of it) at the source's mean cost per frame, within about one frame's cost, cutting at most
     two episodes per bin. Under LPT by cost a bin of cheap frames holds more of them and draws
     each less often. ``rowgroup`` keeps contiguous row groups instead: it cannot also give
     every bin equal frames and equal cost.
   Each source's header row records the algorithm its bins came from (``algo_used``).
3. Sources are laid on top of each other: density-split sources where the split put them
   (their bins carry equal work), then the others heaviest first: a source's bin with the most
   work per epoch (its draws, ~quota / bins, x its cost per frame) joins the lightest bin so
   far. Then the seeded rank/worker labels, as for single roots.
4. Draws: the epoch's slots, source after source, are dealt round-robin to the bins
   (:func:`mixture.bin_draws`): bin b draws ``floor`` or ``ceil`` of ``quota / bins`` samples
   from each source, every bin exactly ``samples_per_worker``, every source exactly its quota.

Figures: ``balance.plan`` is each bin's cost per epoch (each item's cost x how often its bin
draws its frames), max over the lower bound as for single roots (with the ``frames`` model every
bin costs ``samples_per_worker``: 1.0); ``balance.content`` is the cost of what each bin holds,
weighted by the sources' ``quota / frames``; ``draw_rate_deviation`` is the largest relative
difference between how often a bin draws each of its frames of a source and that source's
``quota / frames`` (~0 when every bin holds 1/bins of every source: only the rounding of draws
and frames to integers); ``share_deviation``
the largest difference between a bin's share of a source and the source's quota share.

A bin draws each of its frames of a source ``floor`` or ``ceil`` of (draws / its frames) times
per epoch (repeats, or a different subset each epoch when the quota is below the frames).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.atomic import atomic_write_bytes
from episodekit.core.dataset import Dataset
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.words import plural
from episodekit.metadata.costs import (
    check_model,
    compute_costs,
    costs_meta,
    ensure_costs,
    read_costs,
    verify_costs,
)
from episodekit.metadata.mixture.plan_file import (
    MIXTURE_PLAN_VERSION,
    check_mixture_doc,
    mixture_plan_name,
)
from episodekit.metadata.mixture.spec import (
    MIXTURE_FILE,
    MixtureError,
    MixtureSpec,
    ResolvedSource,
    effective_weights,
    epoch_size,
    mixture_fingerprint,
    parse_mixture,
    quotas,
    resolve_sources,
)
from episodekit.metadata.mixture.spec import bin_draws as deal_draws
from episodekit.metadata.plans.build import (
    _check_args,
    balance_figures,
    build_plan,
    costs_digest,
    naive_totals,
    relabel_bins,
    rowgroup_units,
)
from episodekit.metadata.plans.density_split import (
    build_density_plan,
    constant_density,
    equal_shares,
)
from episodekit.metadata.plans.options import BuildParams, PlanOptions
from episodekit.metadata.plans.plan_file import PlanError, PlanHeader, decode_plan, encode_plan


class SourceCosts:
    """What planning needs of one source: per selected episode its index, length and cost
    (and for ``rowgroup`` locality its file position and row-group unit)."""

    def __init__(
        self,
        name: str,
        episode_index: np.ndarray,
        length: np.ndarray,
        cost: np.ndarray,
        position: np.ndarray | None = None,
        unit: np.ndarray | None = None,
    ):
        self.name = name
        self.episode_index = np.asarray(episode_index, dtype=np.int64)
        self.length = np.asarray(length, dtype=np.int64)
        self.cost = np.asarray(cost, dtype=np.float64)
        self.position, self.unit = position, unit

    @property
    def frames(self) -> int:
        return int(self.length.sum())


def build_mixture_plan(
    spec: MixtureSpec,
    sources: list[SourceCosts],
    world_size: int,
    num_workers: int,
    params: BuildParams | None = None,
    fingerprints: list[str] | None = None,
    **overrides: Any,
) -> dict:
    """The mixture plan as a dict (see the module docstring); raises MixtureError/ValueError.
    ``params`` (keyword arguments override its fields): the ``algo``, ``split_long``,
    ``seed``, ``policy``, ``locality`` and ``cost_model`` of
    :class:`~episodekit.metadata.plans.options.BuildParams`; ``fingerprints``: the sources'."""
    p = BuildParams.of(params, overrides)
    _check_args(None, None, world_size, num_workers, p.algo, p.policy, p.locality)
    W, K = int(world_size), int(num_workers)
    B = W * K
    epoch = _epoch_quotas(spec, sources, B, p.policy)
    draws = deal_draws(epoch.quota, B)
    final = relabel_bins(np.arange(B), p.seed, W, K)  # stacked bin -> plan bin
    subs, density = [], []
    for s, src in enumerate(sources):
        sub, dense = _source_plan(src, W, K, p, draws[final, s])
        subs.append(sub)
        density.append(dense)
    label = _stack_labels(subs, epoch.quota, density, B)
    laid = _lay_items(sources, subs, final, label, B)
    figures = _mixture_figures(sources, laid, epoch, draws, W, K)
    built = _Built(subs, laid, epoch, figures, draws, W, K)
    return _mixture_document(spec, sources, built, p, fingerprints)


class _Epoch:
    """The epoch of a mixture plan: frames requested and planned, weights, quotas, rates."""

    def __init__(self, requested: int, total: int, eff: list, quota: list, frames: list):
        self.requested, self.total, self.eff, self.quota = requested, total, eff, quota
        self.frames = frames
        self.episodes: list[int] = []
        self.rate = [q / f for q, f in zip(quota, frames)]


def _epoch_quotas(spec: MixtureSpec, sources: list[SourceCosts], B: int, policy: str) -> _Epoch:
    """The epoch rounded to the bins, the effective weights and each source's exact quota."""
    frames = [s.frames for s in sources]
    episodes = [len(s.episode_index) for s in sources]
    requested = int(spec.epoch_frames or sum(frames))
    total = epoch_size(requested, B, policy)
    eff = effective_weights([s.weight for s in spec.sources], frames, episodes, spec.balance)
    if spec.overflow == "cap" and requested <= sum(frames) < total:
        raise MixtureError(
            f"{spec.where}: epoch_frames {requested:,} rounds up to {total:,} (a multiple of the "
            f"{B:,} bins, policy {policy}), more than the sources hold ({sum(frames):,} frames) "
            "with overflow 'cap': lower epoch_frames, use overflow 'repeat' or the trim policy"
        )
    epoch = _Epoch(requested, total, eff, quotas(total, eff, frames, spec.overflow), frames)
    epoch.episodes = episodes
    return epoch


def _source_plan(
    src: SourceCosts, W: int, K: int, p: BuildParams, bin_draws: np.ndarray
) -> tuple[dict, bool]:
    """One source partitioned on its own into the W x K bins; (sub-plan, density-split?).
    ``bin_draws``: how many samples each stacked bin draws from this source."""
    B = W * K
    if src.frames < B:
        raise MixtureError(
            f"source {src.name!r} has {plural(src.frames, 'frame')}, fewer than the plan's "
            f"{plural(B, 'bin')} ({plural(W, 'rank')} x {plural(K, 'worker')}): every bin draws "
            "from every source"
        )
    # "auto": LPT. With episodes cut where needed, LPT + pouring lands within a frame of the
    # mean; KK's refinement (O(items x bins) per rank) would cost 2-3x the planning time here.
    algo, policy, locality, cost_model = p.algo, p.policy, p.locality, p.cost_model
    sub_algo = "lpt" if algo == "auto" else algo
    # Cost per frame varies: equal frames (exact draws per frame) and equal cost per bin
    # need the density split; its bins are fixed to plan bins, the ceil frame shares
    # going to the bins that draw ceil(quota / bins) of this source.
    dense = locality == "none" and not constant_density(src.cost, src.length)
    try:
        if dense:
            shares = equal_shares(src.frames, B, np.argsort(-bin_draws, kind="stable"))
            sub = build_density_plan(
                src.cost, src.length, W, K, bin_frames=shares, episode_index=src.episode_index,
                policy=policy, cost_model=cost_model, relabel=False,
            )  # fmt: skip
            return sub, dense
        # A bin's frames of a source decide how often each is drawn: cut episodes
        # where whole ones leave a bin more than 0.1% off (split_long cuts only then).
        # rowgroup with a cost per frame that varies: runs cut by frames, so every
        # frame is still drawn quota / frames times; the cost per epoch then follows
        # how the cost per frame varies along the files (the plan's balance says so).
        by_frames = locality == "rowgroup" and not constant_density(src.cost, src.length)
        sub = build_plan(
            src.length.astype(np.float64) if by_frames else src.cost, src.length, W, K,
            algo=sub_algo, split_long=True, seed=0, episode_index=src.episode_index,
            policy=policy, cost_model=cost_model, locality=locality,
            position=src.position, unit=src.unit,
        )  # fmt: skip
        if by_frames:
            _recost(sub, src)
        return sub, dense
    except ValueError as exc:
        raise MixtureError(f"source {src.name!r}: {exc}") from exc


def _stack_labels(subs: list[dict], quota: list, density: list[bool], B: int) -> list:
    """Lay the sources on top of each other, heaviest first: a source's bin with the most work
    per epoch (its draws, ~quota / bins, x its cost per frame) joins the lightest bin so far.
    Density-split sources come first and stay where they are (equal work in every bin)."""
    S = len(subs)
    work = []
    for sub, q in zip(subs, quota):
        sub_frames = np.maximum(np.asarray(sub["bin_frames"], dtype=np.float64), 1)
        work.append(np.asarray(sub["bin_cost"], dtype=np.float64) / sub_frames * (q / B))
    label = [np.arange(B, dtype=np.int64) for _ in range(S)]
    acc = np.zeros(B)
    for s in (i for i in range(S) if density[i]):
        acc += work[s]
    for s in sorted((i for i in range(S) if not density[i]), key=lambda i: (-work[i].sum(), i)):
        heavy = np.argsort(-work[s], kind="stable")
        light = np.argsort(acc, kind="stable")
        label[s][heavy] = light
        acc[light] += work[s][heavy]
    return label


class _Laid:
    """Every source's items in plan-bin order: (episode, start, stop), bin, source, cost."""

    def __init__(self, items, bin_of, item_source, item_cost):
        self.items, self.bin_of, self.item_source, self.item_cost = (
            items, bin_of, item_source, item_cost
        )  # fmt: skip


def _lay_items(sources: list[SourceCosts], subs: list[dict], final, label, B: int) -> _Laid:
    """The sources' items with their plan bins, sorted by bin then source (each (bin, source)
    run is already in (episode, start) order); an item's cost is its cost drawn once."""
    S = len(sources)
    parts_items, parts_bin, parts_src, parts_cost = [], [], [], []
    for s, (src, sub) in enumerate(zip(sources, subs)):
        offsets = np.asarray(sub["bin_offsets"], dtype=np.int64)
        items = np.asarray(sub["items"], dtype=np.int64).reshape(-1, 3)
        b = final[label[s][np.repeat(np.arange(B), np.diff(offsets))]]
        pos = np.searchsorted(src.episode_index, items[:, 0])
        per_frame = src.cost[pos] / np.maximum(src.length[pos], 1)
        parts_items.append(items)
        parts_bin.append(b)
        parts_src.append(np.full(len(items), s, np.int64))
        parts_cost.append(per_frame * (items[:, 2] - items[:, 1]))
    items = np.concatenate(parts_items)
    bin_of = np.concatenate(parts_bin)
    item_source = np.concatenate(parts_src)
    item_cost = np.concatenate(parts_cost)
    order = np.argsort(bin_of * S + item_source, kind="stable")
    return _Laid(items[order], bin_of[order], item_source[order], item_cost[order])


def _mixture_figures(
    sources: list[SourceCosts], laid: _Laid, epoch: _Epoch, draws: np.ndarray, W: int, K: int
) -> dict:
    """Per-bin frames and cost per epoch, the balance figures and the draw/share deviations."""
    B, S = W * K, len(sources)
    item_frames = laid.items[:, 2] - laid.items[:, 1]
    per_worker = epoch.total // B
    # frames of each source per bin, and how often the bin draws each of them per epoch
    cell = laid.bin_of * S + laid.item_source
    cell_frames = np.bincount(cell, item_frames, minlength=B * S).reshape(B, S)
    cell_rate = draws / np.maximum(cell_frames, 1)
    item_work = laid.item_cost * cell_rate.ravel()[cell]  # the item's cost per epoch
    bin_cost = np.bincount(laid.bin_of, item_work, minlength=B)
    item_content = laid.item_cost * np.asarray(epoch.rate)[laid.item_source]
    content = np.bincount(laid.bin_of, item_content, minlength=B)
    all_cost = np.concatenate([s.cost * r for s, r in zip(sources, epoch.rate)])
    naive = naive_totals(all_cost, B)
    rates = np.asarray(epoch.rate)[None, :]
    drawn = draws > 0
    rate_dev = np.abs(cell_rate / rates - 1)[drawn] if drawn.any() else np.zeros(1)
    share = np.asarray(epoch.quota, dtype=np.float64) / epoch.total
    bin_share = draws / per_worker
    return {
        "bin_frames": np.bincount(laid.bin_of, item_frames, minlength=B).astype(np.int64),
        "bin_cost": bin_cost,
        "all_cost": all_cost,
        "per_worker": per_worker,
        "balance": {
            "plan": balance_figures(bin_cost, item_work),
            "plan_ranks": balance_figures(bin_cost.reshape(W, K).sum(1), item_work),
            "content": balance_figures(content, item_content),
            "contiguous": balance_figures(naive["contiguous"], all_cost),
            "round_robin": balance_figures(naive["round_robin"], all_cost),
        },
        "draw_rate_deviation": round(float(rate_dev.max()), 8),
        "share_deviation": {
            "max_abs": round(float(np.abs(bin_share - share).max()), 8),
            "max_rel": round(
                float((np.abs(bin_share - share) / np.maximum(share, 1e-300)).max()), 8
            ),
        },
    }


@dataclass
class _Built:
    """What the steps of :func:`build_mixture_plan` made: the sources' sub-plans, the laid
    items, the epoch, the figures, the draws and the shape."""

    subs: list[dict]
    laid: _Laid
    epoch: _Epoch
    figures: dict
    draws: np.ndarray
    W: int
    K: int


def _mixture_document(
    spec: MixtureSpec,
    sources: list[SourceCosts],
    built: _Built,
    p: BuildParams,
    fingerprints: list[str] | None,
) -> dict:
    """The plan dict, keys in the order the plan format has always written them."""
    subs, laid, epoch, figures, draws = (
        built.subs, built.laid, built.epoch, built.figures, built.draws
    )  # fmt: skip
    W, K = built.W, built.K
    B, S = W * K, len(sources)
    frames, quota = epoch.frames, epoch.quota
    fps = fingerprints or [""] * S
    all_cost = figures["all_cost"]
    per_worker = figures["per_worker"]
    return {
        "format": "episodekit.shard_plan",
        "version": 1,
        "mixture_version": MIXTURE_PLAN_VERSION,
        "mixture": spec.to_dict(),
        "fingerprint": mixture_fingerprint(spec, fps),
        "locality": p.locality,
        "world_size": W,
        "num_workers": K,
        "num_bins": B,
        "algo": p.algo,
        "algo_used": {
            "ranks": ",".join(sorted({sub["algo_used"]["ranks"] for sub in subs})),
            "workers": {},
        },
        "cost_model": p.cost_model,
        "seed": int(p.seed),
        "split_long": bool(p.split_long),
        "policy": p.policy,
        "num_episodes": int(sum(epoch.episodes)),
        "num_items": len(laid.items),
        "split_episodes": int(sum(sub["split_episodes"] for sub in subs)),
        "costs_digest": costs_digest(all_cost),
        "total_frames": int(sum(frames)),
        "total_cost": float(all_cost.sum()),
        "epoch_frames_requested": epoch.requested,
        "epoch_frames": epoch.total,
        "samples_per_worker": per_worker,
        "samples_per_rank": per_worker * K,
        "dropped_frames": int(sum(max(f - q, 0) for f, q in zip(frames, quota))),
        "repeated_frames": int(sum(max(q - f, 0) for f, q in zip(frames, quota))),
        "balance": figures["balance"],
        "quotas": [int(q) for q in quota],
        "bin_draws": draws,
        "draw_rate_deviation": figures["draw_rate_deviation"],
        "share_deviation": figures["share_deviation"],
        "sources": [
            _source_row(spec, i, s, subs[i], laid, epoch, fps) for i, s in enumerate(sources)
        ],
        "bin_offsets": np.searchsorted(laid.bin_of, np.arange(B + 1)).astype(np.int64),
        "bin_cost": figures["bin_cost"],
        "bin_frames": figures["bin_frames"],
        "items": laid.items,
        "item_source": laid.item_source,
    }


def _source_row(
    spec: MixtureSpec, i: int, s: SourceCosts, sub: dict, laid: _Laid, epoch: _Epoch, fps: list
) -> dict:
    """One source's header row in the plan."""
    return {
        "name": s.name,
        "root": spec.sources[i].root,
        "fingerprint": fps[i],
        "episodes": epoch.episodes[i],
        "frames": epoch.frames[i],
        "weight": spec.to_dict()["sources"][i]["weight"],
        "effective_weight": float(epoch.eff[i]),
        "effective_weight_exact": str(epoch.eff[i]),
        "quota": int(epoch.quota[i]),
        "repeats": round(epoch.rate[i], 8),
        "split_long": sub["split_episodes"] > 0,
        "algo_used": sub["algo_used"]["ranks"],
        "split_episodes": int(sub["split_episodes"]),
        "items": int((laid.item_source == i).sum()),
        "costs_digest": costs_digest(s.cost),
        "balance": sub["balance"]["plan"]["max_over_lower_bound"],
        **({"row_groups": sub["row_groups"]} if "row_groups" in sub else {}),
    }


def _recost(sub: dict, src: SourceCosts) -> None:
    """A sub-plan partitioned by frames, its bin costs and balance in the source's real costs."""
    items = np.asarray(sub["items"], dtype=np.int64).reshape(-1, 3)
    pos = np.searchsorted(src.episode_index, items[:, 0])
    cost = src.cost[pos] / np.maximum(src.length[pos], 1) * (items[:, 2] - items[:, 1])
    bins = np.repeat(np.arange(len(sub["bin_offsets"]) - 1), np.diff(sub["bin_offsets"]))
    sub["bin_cost"] = np.bincount(bins, cost, minlength=len(sub["bin_offsets"]) - 1)
    sub["balance"]["plan"] = balance_figures(sub["bin_cost"], cost)
    sub["algo_used"]["ranks"] += "-frames"


def source_costs(ds: Dataset, model: str) -> pa.Table:
    """A source's cost table: the stored one when fresh, else computed (and written when the
    root is local and writable: a read-only source, e.g. on shared storage, is only read)."""
    if ds.is_local:
        try:
            return ensure_costs(ds, model)[0]
        except EnvironmentProblem:  # read-only, permission, disk full: computed in memory
            pass
    table = read_costs(ds)
    if table is not None and not verify_costs(table, ds, model):
        return table
    return compute_costs(ds, model)


def plan_inputs(src: ResolvedSource, model: str, locality: str) -> SourceCosts:
    """:class:`SourceCosts` of a resolved source (its selected episodes only)."""
    table = source_costs(src.ds, model)
    ep = table["episode_index"].to_numpy()
    pos = np.searchsorted(ep, src.episode_index)
    cost = table["cost"].to_numpy()[pos]
    position = unit = None
    if locality == "rowgroup":
        position, unit = rowgroup_units(src.ds, src.episode_index)
    if costs_meta(table).get("model", model) != model:  # pragma: no cover - ensure_costs' job
        raise MixtureError(f"source {src.name!r}: cost table is not of model {model!r}")
    return SourceCosts(src.name, src.episode_index, src.length, cost, position, unit)


def read_mixture_plan(folder: str, world_size: int, num_workers: int) -> dict | None:
    """The stored mixture plan for one shape as a dict (no freshness check), or None."""
    path = os.path.join(folder, mixture_plan_name(world_size, num_workers))
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None
    doc = decode_plan(raw, path)
    check_mixture_doc(doc, path)
    return doc


def ensure_mixture_plans(
    mixture: str | os.PathLike | dict | MixtureSpec,
    out: str | os.PathLike,
    world_sizes: list[int],
    num_workers: int,
    options: PlanOptions | None = None,
    **overrides: Any,
) -> list[tuple[str, dict, bool]]:
    """Write ``out/mixture.json`` and one mixture plan per world size into ``out``; a plan with
    the same mixture fingerprint (spec + every source's episodes), parameters and costs is kept.
    Every plan is built before any file is written. Returns ``[(path, plan, changed), ...]``."""
    o = PlanOptions.of(options, overrides)
    # each source's bins cut episodes where needed whatever the option ("auto" is recorded as
    # False, as prepare --mixture records it)
    cost, algo, split_long, seed = o.cost, o.algo, o.split_long is True, o.seed
    force, policy, locality = o.force, o.policy, o.locality
    check_model(cost)
    spec = mixture if isinstance(mixture, MixtureSpec) else parse_mixture(mixture)
    for w in world_sizes:
        _check_args(None, None, w, num_workers, algo, policy, locality)
    out = os.fspath(out)
    if os.path.exists(os.path.join(out, "meta", "info.json")):
        raise MixtureError(f"{out}: --out is a dataset root; give the mixture plan its own folder")
    check_output_dir(out, sources=[s.root for s in spec.sources])  # never a user's folder
    resolved = resolve_sources(spec)
    fps = [s.ds.fingerprint for s in resolved]
    inputs = [plan_inputs(s, cost, locality) for s in resolved]
    digests = [costs_digest(s.cost) for s in inputs]
    fingerprint = mixture_fingerprint(spec, fps)
    results = []
    for w in world_sizes:
        path = os.path.join(out, mixture_plan_name(w, num_workers))
        # the sources' cost digests decide instead of the header's one (of all costs at once)
        wanted = PlanHeader(
            int(w), int(num_workers), algo, cost, int(seed), split_long, policy, locality,
            fingerprint=fingerprint,
        )  # fmt: skip
        if not force:
            try:
                old = read_mixture_plan(out, w, num_workers)
            except PlanError:
                old = None
            if (
                old is not None
                and replace(PlanHeader.of(old), costs_digest=None).fresh_for(wanted, [split_long])
                and [s.get("costs_digest") for s in old["sources"]] == digests
            ):
                results.append((path, old, False))
                continue
        params = BuildParams(algo, split_long, seed, policy, cost, locality=locality)
        plan = build_mixture_plan(spec, inputs, w, num_workers, params, fps)
        results.append((path, plan, True))
    # every plan was built: only now is anything written (a shape that fails leaves no file)
    os.makedirs(out, exist_ok=True)
    spec_bytes = (json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n").encode()
    spec_path = os.path.join(out, MIXTURE_FILE)
    try:
        with open(spec_path, "rb") as fh:
            same_spec = fh.read() == spec_bytes
    except FileNotFoundError:
        same_spec = False
    if not same_spec:
        atomic_write_bytes(spec_path, spec_bytes)
    for path, plan, changed in results:
        if changed:
            atomic_write_bytes(path, encode_plan(plan))
    mark_output_dir(out, "a mixture plan folder")
    return results


def format_mixture_plan(plan: dict) -> str:
    """Lines for the CLI: sources with quotas and repeats, balance, share deviation."""
    lines = [
        f"ws={plan['world_size']} x nw={plan['num_workers']}: "
        f"{plural(len(plan['sources']), 'source')}, {plural(plan['num_items'], 'item')}, "
        f"cost {plan['cost_model']}, locality {plan['locality']}; "
        f"epoch {plural(plan['epoch_frames'], 'frame')} "
        f"(requested {plan['epoch_frames_requested']:,})",
        f"  {'source':<16}{'episodes':>10}{'frames':>13}{'eff. weight':>12}{'quota':>13}"
        f"{'repeats':>9}{'max/LB':>9}  split",
    ]
    for s in plan["sources"]:
        algo = s.get("algo_used", "")  # older plans do not record it
        cut = f", {s['split_episodes']:,} cut" if "split_episodes" in s else ""
        lines.append(
            f"  {s['name'][:16]:<16}{s['episodes']:>10,}{s['frames']:>13,}"
            f"{s['effective_weight']:>12.4f}{s['quota']:>13,}{s['repeats']:>9.3f}"
            f"{s['balance']:>9.4f}  {algo}{cut}"
        )
    b = plan["balance"]
    dev = plan["share_deviation"]
    lines.append(
        f"  cost per epoch, max/lower bound {b['plan']['max_over_lower_bound']:.4f}; content "
        f"{b['content']['max_over_lower_bound']:.4f} (contiguous "
        f"{b['contiguous']['max_over_lower_bound']:.4f}, round-robin "
        f"{b['round_robin']['max_over_lower_bound']:.4f})"
    )
    lines.append(
        f"  per-bin source share within {dev['max_abs']:.2e} of the quota share; each frame "
        f"drawn within {plan['draw_rate_deviation']:.2%} of its source's quota / frames"
    )
    lines.append(
        f"  samples_per_rank {plan['samples_per_rank']:,} (= {plan['samples_per_worker']:,} per "
        f"worker, policy {plan['policy']})"
    )
    return "\n".join(lines)
