"""Canonical plans: a shard plan over ``C`` canonical bins that does not depend on the world size.

A per-world-size plan (``ws{W}_nw{K}.json``) fixes which rank reads which episode, so a job that
restarts on another world size cannot continue its epoch. A *canonical* plan partitions the
episodes into ``C`` bins once (balanced by cost exactly like a shard plan, ``--locality``
honoured, bins numbered in file order for ``rowgroup``); the epoch's global order is then a pure
function of (seed, epoch, canonical plan), and any run of ``W`` ranks takes its share of it by a
fixed rule (:mod:`episodekit.loaders.elastic`).

The file is a regular plan file (``meta/shard_plans/canonical_c{C}.json``) with
``world_size = C``, ``num_workers = 1``, ``canonical_bins = C`` and the bins left unpermuted
(``relabel=False``): validation checks it like any plan. Items carry whatever columns plans
carry, so a plan with more item columns (e.g. a mixture's source) partitions the same way.

Default ``C`` (:func:`default_canonical_bins`): among the numbers ``2^a x 3^b x 5^c`` (a <= 8,
b, c <= 1) up to ``min(3840, episodes // 16)``, the one with the most divisors (ties: the larger),
so that the common world sizes divide it (3840 = 2^8 x 3 x 5: 1-6, 8, 10, 12, 15, 16, 20, 24,
32, 40, 48, 64, 80, 96, 128, 256 ranks...) while every bin keeps >= 16 episodes to balance.
Fewer than 32 episodes: 1 bin.

Only ``plan_file`` is imported at module level: the loader reads canonical plans without pulling
in the batch toolchain.
"""

from __future__ import annotations

import posixpath
from dataclasses import replace
from typing import Any

from episodekit.core.dataset import Dataset, list_files, open_dataset
from episodekit.core.paths import PLAN_DIR
from episodekit.core.words import plural
from episodekit.metadata.plans.options import BuildParams, PlanOptions, split_tries
from episodekit.metadata.plans.plan_file import (
    Plan,
    PlanError,
    PlanHeader,
    PlanNotFoundError,
    StalePlanError,
    plan_flags,
    plan_root,
    read_plan_file,
)

CANONICAL_MAX = 3840  # 2^8 x 3 x 5
MIN_EPISODES_PER_BIN = 16  # below this whole episodes balance poorly (see partition.contiguous)
CANONICAL_PREFIX = "canonical_c"


def canonical_plan_path(canonical_bins: int) -> str:
    """Relative path (from the dataset root) of the canonical plan with ``canonical_bins`` bins."""
    return f"{PLAN_DIR}/{CANONICAL_PREFIX}{int(canonical_bins)}.json"


def _divisors(n: int) -> int:
    return sum(1 for d in range(1, n + 1) if n % d == 0)


def canonical_candidates(cap: int) -> list[int]:
    """The numbers 2^a x 3^b x 5^c (a <= 8, b, c <= 1) up to ``cap``, ascending."""
    out = {2**a * 3**b * 5**c for a in range(9) for b in range(2) for c in range(2)}
    return sorted(n for n in out if n <= cap)


def default_canonical_bins(num_episodes: int) -> int:
    """The default ``C`` for ``num_episodes`` episodes (see the module docstring)."""
    cap = min(CANONICAL_MAX, int(num_episodes) // MIN_EPISODES_PER_BIN)
    cands = canonical_candidates(max(cap, 1))
    return max(cands, key=lambda n: (_divisors(n), n))


def is_canonical(plan: Plan | dict) -> bool:
    """Whether a plan (or plan dict) is a canonical plan."""
    doc = plan.doc if isinstance(plan, Plan) else plan
    return PlanHeader.of(doc).canonical_bins is not None


def build_canonical_plan(
    costs: Any,
    lengths: Any,
    canonical_bins: int,
    params: BuildParams | None = None,
    **overrides: Any,
) -> dict:
    """:func:`episodekit.metadata.plans.build.build_plan` over ``canonical_bins`` bins (one worker
    each), bins in partition order (file order for ``locality="rowgroup"``), marked canonical.
    ``params``/``overrides`` are build_plan's (algo, split_long, seed, episode_index, policy,
    locality...)."""
    from episodekit.metadata.plans.build import build_plan

    c = int(canonical_bins)
    if c < 1:
        raise ValueError(f"canonical bins must be >= 1, got {canonical_bins}")
    p = replace(BuildParams.of(params, overrides), relabel=False)
    plan = build_plan(costs, lengths, c, 1, p)
    plan["canonical_bins"] = c
    return plan


def check_canonical_bins(
    root: str | Dataset, canonical_bins: int | None, split_long: bool = False
) -> None:
    """Refuse (ValueError: a bad option, exit 2) a C that cannot give every bin an episode (with
    ``split_long`` True or "auto": a frame), before any plan is written; None (auto) always
    fits."""
    from episodekit.core.dataset import as_dataset

    if canonical_bins is None:
        return
    ds = as_dataset(root)
    have, what = (ds.num_frames, "frame") if split_long else (ds.num_episodes, "episode")
    if int(canonical_bins) > have:
        fix = "auto" if split_long else "auto, or --split-long auto"
        raise ValueError(
            f"--canonical-bins {canonical_bins}: {plural(have, what)} "
            f"{'is' if have == 1 else 'are'} too few for "
            f"{plural(int(canonical_bins), 'bin')} (use at most {have}, {fix})"
        )


def ensure_canonical_plan(
    root: str | Dataset,
    canonical_bins: int | None = None,
    options: PlanOptions | None = None,
    **overrides: Any,
) -> tuple[str, dict, bool]:
    """Build and write the canonical plan (``canonical_bins`` None: the default for the dataset's
    episode count); a fresh one with the same parameters is kept. Returns (path, plan, changed)."""
    o = PlanOptions.of(options, overrides)
    from episodekit.core.dataset import as_dataset
    from episodekit.metadata.artifact import write_bytes
    from episodekit.metadata.costs import check_model, ensure_costs
    from episodekit.metadata.plans.build import (
        _check_args,
        costs_digest,
        dataset_params,
        fresh_plan,
        plan_header,
    )
    from episodekit.metadata.plans.plan_file import encode_plan

    check_model(o.cost)
    ds = as_dataset(root)
    check_canonical_bins(ds, canonical_bins, o.split_long)
    c = default_canonical_bins(ds.num_episodes) if canonical_bins is None else int(canonical_bins)
    split = split_tries(o.split_long, ds.num_episodes, c)[0]  # "auto": cut when C > episodes
    _check_args(None, None, c, 1, o.algo, o.policy, o.locality)
    costs, _ = ensure_costs(ds, o.cost)
    rel = canonical_plan_path(c)
    wanted = replace(
        plan_header(ds, c, 1, o, costs_digest(costs["cost"].to_numpy())), canonical_bins=c
    )
    old = None if o.force else fresh_plan(ds, rel, wanted, [split])
    if old is not None:
        return ds.join(rel), old, False
    params = dataset_params(ds, costs, replace(o, split_long=split))
    plan = build_canonical_plan(costs["cost"].to_numpy(), costs["length"].to_numpy(), c, params)
    return write_bytes(ds, rel, encode_plan(plan)), plan, True


def load_canonical_plan(
    root: str | Any, canonical_bins: int | None = None, check_fresh: bool = True
) -> Plan:
    """The canonical plan under a dataset root (``canonical_bins`` None: the only one there).

    Raises :class:`PlanNotFoundError` when there is none (or several and no choice),
    :class:`StalePlanError` when its episodes fingerprint differs from the dataset's, and
    :class:`PlanError` when the file is not a canonical plan."""
    ds, fs, base, label = plan_root(root)
    folder = posixpath.join(base.rstrip("/") or "/", PLAN_DIR)
    hint = f"create it with: episodekit metadata plan {label} --canonical-bins auto"
    if canonical_bins is None:
        found = list_files(fs, folder, 1, ".json", prefix=CANONICAL_PREFIX)
        if not found:
            raise PlanNotFoundError(f"{folder}: no canonical plan; {hint}")
        if len(found) > 1:
            names = ", ".join(posixpath.basename(f) for f in found)
            raise PlanNotFoundError(
                f"{folder}: several canonical plans ({names}); pass canonical_bins"
            )
        path = found[0]
    else:
        path = posixpath.join(base.rstrip("/") or "/", canonical_plan_path(canonical_bins))
        if not fs.exists(path):
            raise PlanNotFoundError(
                f"{path}: no canonical plan with {plural(canonical_bins, 'bin')}; {hint}"
            )
    if check_fresh and ds is None:
        ds = open_dataset(str(root), check_files=False, check_totals=False)
    plan = read_plan_file(fs, path, max_items=ds.num_frames if ds is not None else None)
    if (
        not is_canonical(plan)
        or plan.num_workers != 1
        or plan.doc["canonical_bins"] != plan.num_bins
    ):
        raise PlanError(f"{path}: not a canonical plan (no canonical_bins matching its bins)")
    if check_fresh and plan.fingerprint != ds.fingerprint:
        raise StalePlanError(
            f"{path}: stale canonical plan: computed for episodes fingerprint {plan.fingerprint}, "
            f"the dataset now has {ds.fingerprint}; recompute it with: episodekit metadata plan "
            f"{label} --canonical-bins {plan.num_bins}{plan_flags(plan.doc)} --force"
        )
    return plan
