"""The steps of ``episodekit prepare``, one small object each, run in order by :func:`run_steps`.

A step has a ``name``, says whether the options want it (``wanted``), whether its output is
already current from headers and footers alone (``is_fresh``: a fresh step shows no progress
bar), does its work (``run`` -> status, detail, files changed) and words its summary line
(``summary``). Every heavy import happens inside ``run``: a rerun where everything is fresh
imports only what reading headers needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from episodekit.core.memory import release_memory
from episodekit.core.paths import COST_FILE, INFO_FILE, SPEED_FILE, STAMP_FILE, inside_root
from episodekit.core.progress import Progress, current, reporting
from episodekit.core.words import plural

if TYPE_CHECKING:
    from collections.abc import Callable

    from episodekit.core.dataset import Dataset
    from episodekit.metadata.plans.exclude import Exclusion
    from episodekit.metadata.plans.options import PlanOptions
    from episodekit.prepare_model import PlanShape, PrepareOptions, PrepareResult, Step

Outcome = tuple[str, dict, list[str]]  # status ("done" | "skipped" | "failed"), detail, changed


@dataclass
class Context:
    """What the steps share: the options, the source, the work root, the result so far."""

    root: str
    opts: PrepareOptions
    say: Callable[[str], None]
    result: PrepareResult
    source: Dataset
    shapes: list[PlanShape]
    work: Path = field(default_factory=Path)
    _ds: Dataset | None = None
    rows_rewritten: bool = False
    _exclusion: Any = False  # not built yet

    @property
    def exclusion(self) -> Exclusion | None:
        """What the plans leave out (``--exclude-*``), built once from the dataset the plans
        read (after the rewrite: flagged episodes are judged on the rows that are trained on)."""
        if self._exclusion is False:
            from episodekit.exclusions import build_exclusion

            self._exclusion = (
                build_exclusion(self.ds, self.opts.exclude) if self.opts.exclude else None
            )
        return self._exclusion

    @property
    def ds(self) -> Dataset:
        """The dataset the metadata steps read: the source unless its rows were rewritten
        elsewhere (``--out``) or in place."""
        if self._ds is None:
            from episodekit.core.dataset import open_dataset

            self.rows_rewritten = any(s.changed for s in self.result.steps)
            fresh_rows = self.opts.out is None and not self.rows_rewritten
            self._ds = self.source if fresh_rows else open_dataset(str(self.work))
        return self._ds


class PrepareStep:
    """One step; subclasses set ``name`` and override what they need."""

    name = ""
    stops_on_failure = False  # a failed rewrite leaves nothing sound to plan or validate

    def wanted(self, opts: PrepareOptions) -> bool:
        return True

    def is_fresh(self, ctx: Context) -> bool:
        """True when the output is current, known from headers alone (False: ``run`` decides)."""
        return False

    def run(self, ctx: Context) -> Outcome:
        raise NotImplementedError

    def summary(self, step: Step) -> str:
        """What the step did, for the summary table; skipped steps print nothing."""
        return ""


def _done(changed: list[str]) -> str:
    return "done" if changed else "skipped"


class RowGroups(PrepareStep):
    """Row-group rewrite (also copies meta/ into ``--out`` for an out-of-place run)."""

    name = "rowgroups"
    stops_on_failure = True

    def is_fresh(self, ctx: Context) -> bool:
        if ctx.opts.out is not None or ctx.opts.force or not ctx.source.is_local:
            return False
        from episodekit.core.paths import MIB
        from episodekit.prep.rewrite import FileJob, done_already

        target = int(round(ctx.opts.target_mb * MIB))
        for rel in ctx.source.data_files:
            path = ctx.source.join(rel)
            if done_already(FileJob(rel, path, path, target)) is None:
                return False
        return True

    def run(self, ctx: Context) -> Outcome:
        from episodekit.prep import rewrite_rowgroups

        o, reporter = ctx.opts, current()

        def bytes_done(res, done: int, total: int) -> None:
            reporter.active().advance(0, nbytes=res.bytes)  # the executor counts files

        quiet = reporting(Progress()) if self.is_fresh(ctx) else contextlib.nullcontext()
        with quiet:  # progress only for work that runs
            rep = rewrite_rowgroups(
                ctx.root, target_mb=o.target_mb, out=o.out, workers=o.jobs, executor=o.executor,
                force=o.force, copy_videos=o.include_videos, progress=bytes_done,
                stage=False,  # prepare --out stages the whole run (app/prepare.py)
            )  # fmt: skip
        summary = rep.summary()
        # what this run wrote: rewritten data files, and with --out the files copied there
        # (a rerun into the same --out copies only what changed at the source)
        written = ("rewritten", "copied")
        copied = [p for p in rep.copied if p != STAMP_FILE]  # the source's: validated again
        changed = sorted([r.path for r in rep.files if r.status in written] + copied)
        if not rep.ok:
            return "failed", summary, changed
        return _done(changed), summary, changed

    def summary(self, step: Step) -> str:
        d, c = step.detail, step.detail.get("counts", {})
        txt = (
            f"{c.get('rewritten', 0)} rewritten, {c.get('skipped', 0)} skipped, "
            f"{c.get('copied', 0)} copied, {c.get('failed', 0)} failed; "
            f"row groups {d.get('before', {}).get('row_groups', '?')} -> "
            f"{d.get('after', {}).get('row_groups', '?')}; {d.get('mb_per_s', 0)} MB/s"
        )
        for f in d.get("failed", [])[:5]:
            txt += f"\n      failed: {f['path']}: {f['reason']}"
        return txt


class Videos(PrepareStep):
    """``prep videos`` on the work root: mp4s that meet the random-access target are left alone,
    the others re-encoded in place (verified, resumable)."""

    name = "videos"
    stops_on_failure = True

    def wanted(self, opts: PrepareOptions) -> bool:
        return opts.videos_gop is not None

    def run(self, ctx: Context) -> Outcome:
        from episodekit.prep.videos import rewrite_videos

        gop = ctx.opts.videos_gop
        ctx.say(f"videos: random-access target GOP {gop} (video that meets it is left alone)")
        o = ctx.opts
        rep = rewrite_videos(
            str(ctx.work), gop=gop, force=o.force, timing_frames=0, progress=ctx.say,
            executor=o.executor, jobs=o.jobs if o.executor != "local" else 1,
        )  # fmt: skip
        counts = {
            s: sum(f.status == s for f in rep.files) for s in ("rewritten", "skipped", "failed")
        }
        changed = [f.file for f in rep.files if f.status == "rewritten"]
        if rep.info_updated:
            changed.append(INFO_FILE)
        detail = {"counts": counts, "failed": [f"{f.file}: {f.message}" for f in rep.failed][:10]}
        if rep.failed or not rep.files:
            if not rep.files:
                detail["failed"] = ["no video files (prepared into --out without --videos?)"]
            return "failed", detail, changed
        return _done(changed), detail, changed

    def summary(self, step: Step) -> str:
        d, c = step.detail, step.detail.get("counts", {})
        txt = f"{c.get('rewritten', 0)} re-encoded, {c.get('skipped', 0)} skipped, "
        txt += f"{c.get('failed', 0)} failed"
        for f in d.get("failed", [])[:5]:
            txt += f"\n      failed: {f}"
        return txt


class Speed(PrepareStep):
    """Speed percentiles (fingerprint in the file)."""

    name = "speed"

    def run(self, ctx: Context) -> Outcome:
        from episodekit.metadata.speed import ensure_speed_file

        rows, changed = ensure_speed_file(ctx.ds, force=ctx.opts.force)
        sparse = sum(r.get("percentiles") is None for r in rows)
        detail = {"tasks": len(rows), "sparse_tasks": sparse}
        return ("done" if changed else "skipped"), detail, ([SPEED_FILE] if changed else [])

    def summary(self, step: Step) -> str:
        d = step.detail
        return f"{plural(d.get('tasks') or 0, 'task')} ({d.get('sparse_tasks')} sparse)"


class Costs(PrepareStep):
    """Episode cost table (fingerprint + model in the file metadata)."""

    name = "costs"

    def run(self, ctx: Context) -> Outcome:
        from episodekit.metadata.costs import ensure_costs

        ds = ctx.ds  # rewritten data files change every episode's data_bytes: a table is stale
        cost = ctx.opts.cost
        table, changed = ensure_costs(ds, cost, force=ctx.opts.force or ctx.rows_rewritten)
        detail = {"model": cost, "episodes": table.num_rows}
        return ("done" if changed else "skipped"), detail, ([COST_FILE] if changed else [])

    def summary(self, step: Step) -> str:
        return f"model {step.detail.get('model')}"


def _rel(path: str, work: Path) -> str:
    return os.path.relpath(path, work) if os.path.isabs(path) else path


def _plan_entry(rel: str, plan: dict, changed: bool, shape: dict) -> dict:
    return {
        "path": rel,
        **shape,
        "split_long": bool(plan.get("split_long")),
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
    stops_on_failure = True  # never a passing verdict without plans

    def run(self, ctx: Context) -> Outcome:
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
            keys = {"world_size": plan.get("world_size"), "num_workers": plan.get("num_workers")}
            detail["plans"].append(_plan_entry(rel, plan, was_changed, keys))
        if ctx.opts.canonical_bins is not False:
            path, plan, was_changed = canonical_plan(ctx)
            rel = _rel(path, ctx.work)
            if was_changed:
                changed.append(rel)
            keys = {"canonical_bins": plan.get("canonical_bins")}
            detail["plans"].append(_plan_entry(rel, plan, was_changed, keys))
        if ctx.opts.split_long == "auto":  # say where whole episodes could not fill the bins
            cut = [
                p["world_size"] for p in detail["plans"] if p.get("world_size") and p["split_long"]
            ]
            if cut:
                detail["cut_episodes"] = cut
        if ctx.opts.plans_required and not any("world_size" in p for p in detail["plans"]):
            detail["reason"] = "no shard plan: every world size was skipped (see the warnings)"
            return "failed", detail, changed
        return _done(changed), detail, changed

    @staticmethod
    def _shard_plan(ctx: Context, shape: PlanShape, detail: dict) -> tuple[str, dict, bool] | None:
        """One world size's plan; a bin left empty (whole episodes, rowgroup runs) is retried
        with cut episodes under ``split_long="auto"``, else the size is skipped with a warning."""
        try:
            return shard_plan(ctx, shape.world_size, shape.split_long)
        except ValueError as exc:
            if shape.split_long or ctx.opts.split_long != "auto":
                detail["skipped_world_sizes"].append(
                    {"world_size": shape.world_size, "reason": str(exc)}
                )
                ctx.result.warnings.append(f"world size {shape.world_size} skipped: {exc}")
                ctx.say(f"warning: {ctx.result.warnings[-1]}")
                return None
            return shard_plan(ctx, shape.world_size, True)

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


def plan_options(
    o: PrepareOptions, split_long: bool, exclusion: Exclusion | None = None
) -> PlanOptions:
    """The plan writers' options of a prepare run (its other plan options are the defaults)."""
    from episodekit.metadata.plans.options import PlanOptions

    return PlanOptions(
        cost=o.cost,
        split_long=split_long,
        force=o.force,
        locality=o.locality,
        exclusion=exclusion,
    )


def shard_plan(ctx: Context, world_size: int, split: bool) -> tuple[str, dict, bool]:
    """The one call of ``ensure_plans`` (one world size)."""
    from episodekit.metadata.plans.build import ensure_plans

    o = ctx.opts
    [one] = ensure_plans(ctx.ds, [world_size], o.num_workers, plan_options(o, split, ctx.exclusion))
    return one


def canonical_plan(ctx: Context) -> tuple[str, dict, bool]:
    """The one call of ``ensure_canonical_plan``."""
    from episodekit.metadata.plans.canonical import ensure_canonical_plan

    o = ctx.opts
    split = o.split_long == "yes"
    return ensure_canonical_plan(ctx.ds, o.canonical_bins, plan_options(o, split, ctx.exclusion))


class Stats(PrepareStep):
    """Normalization stats (stats.json + per-episode stats columns). Stats episodekit wrote are
    recomputed when stale; the dataset's own (another tool's, e.g. LeRobot's) are kept when they
    pass the ``stats.*`` checks and replaced only when they fail them, are missing, or with
    ``stats="recompute"``. The detail says which (``status``: fresh, kept, written,
    recomputed) and why."""

    name = "stats"

    def run(self, ctx: Context) -> Outcome:
        ds, o = ctx.ds, ctx.opts
        if ds.version != "v3.0":
            return "skipped", {"status": f"{ds.version}: stats are written for v3.0 only"}, []
        if o.force or o.stats == "recompute":
            why = "--stats recompute" if o.stats == "recompute" else ""  # --force: as before
            return self._write(ctx, force=True, why=why)
        foreign = self._foreign(ctx)
        if foreign is None:  # ours (or none): recomputed where stale, as ``metadata stats``
            return self._write(ctx, force=False, why="")
        problem = self._problem(ctx) if foreign else "no meta/stats.json"
        if not problem:
            return self._keep(ctx)
        return self._write(ctx, force=True, why=problem)

    @staticmethod
    def _keep(ctx: Context) -> Outcome:
        """Keep the dataset's own stats; a summary of ours left from earlier stats describes
        other numbers: removed, so that no check holds the kept stats to it."""
        from episodekit.metadata.stats import SUMMARY_FILE
        from episodekit.metadata.stats.rank import kept_quantiles

        detail = {"status": "kept", "why": "the dataset's own stats pass the stats checks"}
        detail.update(kept_quantiles(str(ctx.work)))  # how far its quantiles are, if far
        summary = ctx.work / SUMMARY_FILE
        if not summary.exists():
            return "skipped", detail, []
        summary.unlink()
        detail["why"] += f"; {SUMMARY_FILE} of earlier stats removed"
        return "done", detail, [SUMMARY_FILE]

    @staticmethod
    def _foreign(ctx: Context) -> bool | None:
        """None when episodekit wrote the stats there now (its summary records this very
        stats.json) or there are none and no summary; True for another writer's stats.json;
        False when stats.json is missing."""
        import hashlib

        from episodekit.metadata.stats import STATS_FILE, read_summary_meta

        path = ctx.work / STATS_FILE
        if not path.is_file():
            return False
        meta = read_summary_meta(str(ctx.work)) or {}
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        return None if (meta.get("outputs") or {}).get("stats_sha256") == sha else True

    @staticmethod
    def _problem(ctx: Context) -> str:
        """The first error of the ``stats.*`` checks on the work root ("" when none)."""
        from episodekit.validate.raw import ERROR, read_raw
        from episodekit.validate.stats import check_stats

        for f in check_stats(read_raw(str(ctx.work))):
            if f.severity == ERROR and f.check != "stats.fresh":  # freshness: of our summary
                return f"{f.check}: {f.file or ''} {f.message}".replace("  ", " ")
        return ""

    @staticmethod
    def _write(ctx: Context, force: bool, why: str) -> Outcome:
        from episodekit.metadata.stats import STATS_FILE, SUMMARY_FILE, ensure_stats

        work, o = ctx.work, ctx.opts
        res, status = ensure_stats(str(work), force=force, executor=o.executor, jobs=o.jobs)
        if res is None:
            return "skipped", {"status": status}, []
        changed = []
        if status == "written":
            changed = [STATS_FILE, SUMMARY_FILE]
            changed += [str(p.relative_to(work)) for p in work.glob("meta/episodes/*/*.parquet")]
            if o.stats == "recompute":
                status = "recomputed"
        detail = {"status": status, "features": len(res.features), "quantiles": res.mode}
        if why:
            detail["why"] = why
        return ("done" if changed else "skipped"), detail, changed

    def summary(self, step: Step) -> str:
        d = step.detail
        why = f" ({d['why']})" if d.get("why") else ""
        if "features" not in d:
            status = d.get("status", "")
            if status == "kept" and d.get("quantiles"):  # far from the data: say so
                q, n = d["quantiles"], round(100 * d["quantiles"]["rank"])
                th = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
                return (
                    f"kept; {q['key']} is the data's {n}{th} percentile ({q['feature']}, dimension "
                    f"{q['dimension']}); `--stats recompute` writes exact ones"
                )
            return ("fresh" if status == "fresh" else str(status)) + why
        modes = sorted(set((d.get("quantiles") or {}).values()))
        feats = plural(d["features"], "feature")
        return f"{feats}, quantiles {'/'.join(modes)}, {d.get('status')}{why}"


class Validate(PrepareStep):
    """Validation; a pass leaves a stamp keyed on the fingerprint and the size/mtime of every
    data file and artifact, so an unchanged root is not scanned again."""

    name = "validate"

    def is_fresh(self, ctx: Context) -> bool:
        from episodekit.prepare_model import read_stamp, state_digest

        stamp = read_stamp(ctx.work)
        digest = state_digest(ctx.work, ctx.ds.fingerprint, ctx.ds.data_files)
        return not ctx.opts.force and bool(
            stamp and stamp.get("state") == digest and stamp.get("ok")
        )

    def run(self, ctx: Context) -> Outcome:
        if self.is_fresh(ctx):
            stamp = json.loads((ctx.work / STAMP_FILE).read_text())
            self._record_rerun(ctx, stamp)
            return "skipped", {"ok": True, "fresh_stamp": True, **stamp.get("counts", {})}, []
        from episodekit.prepare_model import STAMP_VERSION, state_digest
        from episodekit.prepare_noop import eligible, rerun_record
        from episodekit.validate.runner import validate

        o, work, ds = ctx.opts, ctx.work, ctx.ds
        digest = state_digest(work, ds.fingerprint, ds.data_files)
        # A copy prepared without its videos cannot have them checked (and is not meant to).
        checks = "all,-info.videos,-video" if o.out is not None and not o.include_videos else None
        d = validate(str(work), checks=checks, executor=o.executor).to_dict()
        detail = {
            "ok": d["ok"],
            "errors": d["counts"]["error"],
            "warnings": d["counts"]["warning"],
            "first_errors": [f for f in d["findings"] if f["severity"] == "error"][:10],
        }
        if d["ok"]:
            stamp = {
                "version": STAMP_VERSION,
                "fingerprint": ds.fingerprint,
                "state": digest,
                "ok": True,
                "counts": {"errors": detail["errors"], "warnings": detail["warnings"]},
            }
            if eligible(ctx.root, o, recording=True):  # what a rerun reports: prepare_noop
                stamp["rerun"] = rerun_record(ctx.result, o, list(ds.data_files))
            from episodekit.core.atomic import atomic_write_text

            text = json.dumps(stamp, indent=2, sort_keys=True)
            atomic_write_text(inside_root(work, STAMP_FILE), text)
        return ("done" if d["ok"] else "failed"), detail, []

    @staticmethod
    def _record_rerun(ctx: Context, stamp: dict) -> None:
        """A fresh root rerun with options its stamp has no record for (e.g. `prepare ROOT`
        after `prepare ROOT --frames`) leaves that record, so the next such rerun answers from the
        stamp alone (prepare_noop); the stamp is otherwise unchanged."""
        from episodekit.prepare_noop import eligible, options_key, rerun_record

        o = ctx.opts
        if not eligible(ctx.root, o, recording=True):
            return
        if (stamp.get("rerun") or {}).get("options") == options_key(o):
            return
        rec = rerun_record(ctx.result, o, list(ctx.ds.data_files))
        if not rec:
            return
        from episodekit.core.atomic import atomic_write_text

        stamp["rerun"] = rec
        text = json.dumps(stamp, indent=2, sort_keys=True)
        atomic_write_text(inside_root(ctx.work, STAMP_FILE), text)

    def summary(self, step: Step) -> str:
        d = step.detail
        txt = f"{plural(d.get('errors', 0), 'error')}, {plural(d.get('warnings', 0), 'warning')}"
        if d.get("fresh_stamp"):
            txt += "; unchanged since last passing validation"
        for f in d.get("first_errors", [])[:5]:
            txt += f"\n      {f.get('check')}: {f.get('file') or ''} {f.get('message')}"
        return txt


class Frames(PrepareStep):
    """The frame store of the prepared root (in the local cache, outside it: nothing changed)."""

    name = "frames"

    def wanted(self, opts: PrepareOptions) -> bool:
        return opts.frames

    def run(self, ctx: Context) -> Outcome:
        from episodekit.core.errors import DatasetError, EnvironmentProblem
        from episodekit.prep.frames import build_frame_store

        if not ctx.result.ok:
            return "skipped", {"reason": "validation failed"}, []
        try:
            rep = build_frame_store(
                str(ctx.work), jobs=ctx.opts.jobs, force=ctx.opts.force, executor=ctx.opts.executor
            )
        except (DatasetError, EnvironmentProblem) as exc:
            return "failed", {"error": str(exc)}, []
        return ("done" if rep.status == "built" else "skipped"), rep.summary(), []

    def summary(self, step: Step) -> str:
        d = step.detail
        if "error" in d or "reason" in d:
            return str(d.get("error") or d.get("reason"))
        mib = d.get("bytes", 0) / 2**20
        return f"{plural(d.get('frames', 0), 'frame')}, {mib:,.0f} MiB in {d.get('store')}"


STEPS: tuple[PrepareStep, ...] = (
    RowGroups(),
    Videos(),
    Speed(),
    Costs(),
    Plans(),
    Stats(),
    Validate(),
    Frames(),
)
BY_NAME = {s.name: s for s in STEPS}


def timed(step: PrepareStep, ctx: Context) -> Step:
    """Run one step under its name (labels progress bars); one line when it ends."""
    from episodekit.prepare_model import Step

    reporter = current()
    reporter.stage(step.name)
    t0 = time.perf_counter()
    status, detail, changed = step.run(ctx)
    release_memory()  # what the step freed goes back: the next one starts from the base
    done = Step(step.name, status, time.perf_counter() - t0, detail, changed)
    what = step.summary(done) if status != "skipped" else ""  # a kept stats: in the table
    line = f"{step.name}: {status}" + (f" in {done.seconds:.2f}s; {what}" if what else "")
    reporter.step(line)
    return done


def run_steps(ctx: Context, steps: tuple[PrepareStep, ...] = STEPS) -> None:
    """Run the wanted steps in order into ``ctx.result``: a failed rewrite stops the run; the
    verdict is validation's (and the frame store's, when built)."""
    for step in steps:
        if not step.wanted(ctx.opts):
            continue
        done = timed(step, ctx)
        ctx.result.steps.append(done)
        if step.name == "rowgroups":
            ctx.work = Path(ctx.result.work_root).resolve()  # local: a remote root needs --out
            ctx.result.work_root = str(ctx.work)
        if done.status == "failed" and step.stops_on_failure:
            return
        if step.name == "validate":
            ctx.result.ok = done.status != "failed"
        elif step.name == "frames":
            ctx.result.ok = ctx.result.ok and done.status != "failed"


def summarize(step: Step) -> str:
    """A finished step's summary line text (nothing for a skipped one)."""
    if step.name not in BY_NAME:
        return ""
    if step.status == "skipped" and step.detail.get("status") != "kept":  # kept: say so
        return ""
    return BY_NAME[step.name].summary(step)
