"""The steps of ``prepare`` that write the tables under ``meta/``: speed percentiles, the
episode cost table, and the shard plans (one per world size, then the canonical plan)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from episodekit.core.paths import COST_FILE, PLAN_DIR, SPEED_FILE
from episodekit.core.words import plural
from episodekit.prepare_base import Artifact, Context, Ensured, PrepareStep, done_or_skipped

if TYPE_CHECKING:
    from episodekit.metadata.plans.exclude import Exclusion
    from episodekit.metadata.plans.options import PlanOptions
    from episodekit.prepare_model import PlanShape, PrepareOptions, Step

# ``--split-long`` as the plan writers take it
SPLIT_VALUES: dict[str, bool | str] = {"yes": True, "no": False, "auto": "auto"}


class Speed(PrepareStep):
    """Speed percentiles (fingerprint in the file)."""

    name = "speed"
    artifacts = (
        Artifact("speed percentiles", (SPEED_FILE,), "format version and episodes fingerprint"),
    )

    def ensure(self, ctx: Context) -> Ensured:
        from episodekit.metadata.speed import ensure_speed_file

        rows, changed = ensure_speed_file(ctx.ds, force=ctx.opts.force)
        sparse = sum(r.get("percentiles") is None for r in rows)
        detail = {"tasks": len(rows), "sparse_tasks": sparse}
        return done_or_skipped(detail, [SPEED_FILE] if changed else [])

    def summary(self, step: Step) -> str:
        d = step.detail
        return f"{plural(d.get('tasks') or 0, 'task')} ({d.get('sparse_tasks')} sparse)"

    def rerun_detail(self, step: Step) -> dict | None:
        return step.detail


class Costs(PrepareStep):
    """Episode cost table (fingerprint + model in the file metadata)."""

    name = "costs"
    artifacts = (
        Artifact("episode costs", (COST_FILE,), "episodes fingerprint and cost model (metadata)"),
    )

    def ensure(self, ctx: Context) -> Ensured:
        from episodekit.metadata.costs import ensure_costs

        ds = ctx.ds  # rewritten data files change every episode's data_bytes: a table is stale
        cost = ctx.opts.cost
        table, changed = ensure_costs(ds, cost, force=ctx.opts.force or ctx.rows_rewritten)
        detail = {"model": cost, "episodes": table.num_rows}
        return done_or_skipped(detail, [COST_FILE] if changed else [])

    def summary(self, step: Step) -> str:
        return f"model {step.detail.get('model')}"

    def rerun_detail(self, step: Step) -> dict | None:
        return step.detail


def _rel(path: str, work: Path) -> str:
    return os.path.relpath(path, work) if os.path.isabs(path) else path


def _plan_entry(rel: str, plan: dict, changed: bool, canonical: bool = False) -> dict:
    """One plan in the step's detail: its path, shape (world size and workers, or canonical
    bins), whether episodes were cut, whether it changed, its balance and exclusion."""
    from episodekit.metadata.plans.plan_file import PlanHeader

    h = PlanHeader.of(plan)
    shape = (
        {"canonical_bins": h.canonical_bins}
        if canonical
        else {"world_size": h.world_size, "num_workers": h.num_workers}
    )
    return {
        "path": rel,
        **shape,
        "split_long": h.split_long,
        "changed": changed,
        "balance": plan.get("balance", {}),
        "samples_per_rank": plan.get("samples_per_rank"),
        **_excluded_entry(plan),
    }


def _excluded_entry(plan: dict) -> dict:
    """A plan's exclusion for the run's detail: its counts and reasons (not the ranges)."""
    ex = plan.get("excluded")
    if not ex:
        return {}
    return {"excluded": {k: v for k, v in ex.items() if k != "ranges"}}


class Plans(PrepareStep):
    """Shard plans, one per world size (fingerprint + parameters + costs digest), then, with
    ``canonical_bins``, the world-size-free canonical plan for elastic resume."""

    name = "plans"
    artifacts = (
        Artifact(
            "shard plans",
            (f"{PLAN_DIR}/*",),  # ws{W}_nw{K}.json (and the canonical plan: the same folder)
            "episodes fingerprint, parameters, costs digest, exclusion digest (PlanHeader)",
        ),
        Artifact(
            "canonical plan",
            (f"{PLAN_DIR}/canonical_c*.json",),
            "as a shard plan's, with canonical_bins",
            stamped=False,  # the shard plans' folder glob covers it
        ),
    )
    stops_on_failure = True  # never a passing verdict without plans

    def ensure(self, ctx: Context) -> Ensured:
        changed: list[str] = []
        detail: dict[str, list] = {"plans": [], "skipped_world_sizes": []}
        for shape in ctx.shapes:
            if shape.skip:
                detail["skipped_world_sizes"].append(
                    {"world_size": shape.world_size, "reason": shape.skip}
                )
                continue
            got = self._shard_plan(ctx, shape, detail)
            if got is None:
                continue
            path, plan, was_changed = got
            rel = _rel(path, ctx.work)
            if was_changed:
                changed.append(rel)
            detail["plans"].append(_plan_entry(rel, plan, was_changed))
        if ctx.opts.canonical_bins is not False:
            path, plan, was_changed = canonical_plan(ctx)
            rel = _rel(path, ctx.work)
            if was_changed:
                changed.append(rel)
            detail["plans"].append(_plan_entry(rel, plan, was_changed, canonical=True))
        if ctx.opts.split_long == "auto":  # say where whole episodes could not fill the bins
            cut = [
                p["world_size"] for p in detail["plans"] if p.get("world_size") and p["split_long"]
            ]
            if cut:
                detail["cut_episodes"] = cut
        if ctx.opts.plans_required and not any("world_size" in p for p in detail["plans"]):
            detail["reason"] = "no shard plan: every world size was skipped (see the warnings)"
            return Ensured("failed", detail, changed)
        return done_or_skipped(detail, changed)

    @staticmethod
    def _shard_plan(ctx: Context, shape: PlanShape, detail: dict) -> tuple[str, dict, bool] | None:
        """One world size's plan (under ``split_long="auto"`` the plan writer cuts episodes
        where whole ones leave a bin empty); a size that cannot be planned
        (:class:`~episodekit.metadata.plans.options.PlanInfeasible`) is skipped with a warning.
        """
        from episodekit.metadata.plans.options import PlanInfeasible

        try:
            return shard_plan(ctx, shape.world_size)
        except PlanInfeasible as exc:
            detail["skipped_world_sizes"].append(
                {"world_size": shape.world_size, "reason": str(exc)}
            )
            ctx.result.warnings.append(f"world size {shape.world_size} skipped: {exc}")
            ctx.say(f"warning: {ctx.result.warnings[-1]}")
            return None

    def summary(self, step: Step) -> str:
        d = step.detail
        txt = f"{plural(len(d.get('plans', [])), 'plan')}, {len(step.changed)} written"
        if d.get("cut_episodes"):
            sizes = ", ".join(str(w) for w in d["cut_episodes"])
            txt += f"; world size {sizes}: episodes cut into frame ranges (whole ones cannot fill"
            txt += " the bins)"
        ex = next((p["excluded"] for p in d.get("plans", []) if p.get("excluded")), None)
        if ex:
            why = ", ".join(f"{k} {v}" for k, v in ex["reasons"].items())
            whole = plural(ex["episodes"], "whole episode")
            txt += f"; {plural(ex['frames'], 'frame')} excluded ({whole}; {why})"
        if d.get("reason"):
            txt += f"; {d['reason']}"
        return txt

    def rerun_detail(self, step: Step) -> dict | None:
        d = step.detail
        return {**d, "plans": [{**p, "changed": False} for p in d.get("plans", [])]}


def plan_options(
    o: PrepareOptions, split_long: bool | str, exclusion: Exclusion | None = None
) -> PlanOptions:
    """The plan writers' options of a prepare run (its other plan options are the defaults);
    ``split_long``: True, False or "auto"."""
    from episodekit.metadata.plans.options import PlanOptions

    return PlanOptions(
        cost=o.cost,
        split_long=split_long,  # type: ignore[arg-type]
        force=o.force,
        locality=o.locality,
        exclusion=exclusion,
    )


def shard_plan(ctx: Context, world_size: int) -> tuple[str, dict, bool]:
    """The one call of ``ensure_plans`` (one world size, the run's ``split_long``)."""
    from episodekit.metadata.plans.build import ensure_plans

    o = ctx.opts
    split = SPLIT_VALUES[str(o.split_long)]
    [one] = ensure_plans(ctx.ds, [world_size], o.num_workers, plan_options(o, split, ctx.exclusion))
    return one


def canonical_plan(ctx: Context) -> tuple[str, dict, bool]:
    """The one call of ``ensure_canonical_plan``."""
    from episodekit.metadata.plans.canonical import ensure_canonical_plan

    o = ctx.opts
    split = o.split_long == "yes"
    return ensure_canonical_plan(ctx.ds, o.canonical_bins, plan_options(o, split, ctx.exclusion))
