"""``episodekit prepare``: from "as recorded" to "ready for a many-GPU run", then prove it.

Steps, in order, each skipped when its output is already fresh:

1. row-group rewrite (``episodekit.prep``): files marked with this target, or already in the band,
   are skipped after reading their footers only;
2. speed percentiles (fingerprint in the file);
3. episode cost table (fingerprint + model in the file metadata);
4. shard plans, one per world size (fingerprint + parameters + costs digest);
5. normalization stats (fingerprint + data files' size + footers in meta/episodekit_stats.parquet);
6. validation; a passing validation leaves a stamp (``meta/episodekit_validation.json``) keyed on
   the fingerprint and the size/mtime of every data file and artifact, so an unchanged root is not
   scanned again;
7. with ``frames``: the decoded frame store for random access (``episodekit prep frames``), in
   the local cache, never in the root (so nothing of it is pushed); skipped when fresh.

Nothing is written before the arguments and the plans' feasibility are checked: a world size
whose ``world_size x num_workers`` bins cannot all get a frame is skipped with a warning (or, with
``split_long="auto"``, planned with episodes cut into frame ranges), so the defaults work on any
valid dataset. A step that finds its output fresh is reported as "skipped" and nothing else; a
rerun where everything is fresh reads footers and artifact headers only and starts no process.

A remote root (``hf://datasets/owner/name[@rev]``, any fsspec URL) is read remotely and prepared
into ``out``; ``push_to_hub`` then uploads the files that changed in one commit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from episodekit.core.atomic import atomic_write_text
from episodekit.core.dataset import Dataset, open_dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem
from episodekit.core.hub import is_remote, parse_hub_root, push_files
from episodekit.core.lock import writer_lock
from episodekit.core.paths import (
    COST_FILE,
    DEFAULT_TARGET_MB,
    INFO_FILE,
    PLAN_DIR,
    SPEED_FILE,
    STAMP_FILE,
    inside_root,
)
from episodekit.core.progress import current
from episodekit.core.version import __version__

STAMP_VERSION = 1
ARTIFACT_GLOBS = (
    SPEED_FILE,
    COST_FILE,
    f"{PLAN_DIR}/*",
    "meta/stats.json",
    "meta/episodekit_stats.parquet",
)
SPLIT_LONG = ("no", "yes", "auto")


@dataclass
class Step:
    """One step of the job: what it did and how long it took."""

    name: str
    status: str  # "done" | "skipped" | "failed"
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)  # files written, relative to the root

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "changed": self.changed,
            "detail": self.detail,
        }


@dataclass
class PrepareResult:
    """The whole job's outcome; ``ok`` is the validation verdict."""

    root: str
    work_root: str
    steps: list[Step] = field(default_factory=list)
    ok: bool = False
    seconds: float = 0.0
    pushed: Any = None
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[str]:
        return sorted({p for s in self.steps for p in s.changed})

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "work_root": self.work_root,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "changed": self.changed,
            "pushed": str(self.pushed) if self.pushed is not None else None,
            "warnings": self.warnings,
            "steps": [s.to_dict() for s in self.steps],
        }


def _state_digest(root: Path, fingerprint: str, data_files: Sequence[str]) -> str:
    """Hash of what validation looked at: fingerprint, data files' and artifacts' size/mtime."""
    h = hashlib.sha256(f"{STAMP_VERSION}\0{fingerprint}\0{__version__}\0".encode())
    paths = [root / rel for rel in data_files]
    for pattern in (
        "meta/info.json",
        "meta/tasks.parquet",
        "meta/episodes/*/*.parquet",
        "videos/*/*/*.mp4",  # video.* checks read them (v3.0 and v2.1 layouts)
        *ARTIFACT_GLOBS,
    ):
        paths += sorted(root.glob(pattern))
    for p in paths:
        try:
            st = p.stat()
        except FileNotFoundError:
            h.update(f"{p.relative_to(root)}\0missing\0".encode())
            continue
        h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def _read_stamp(root: Path) -> dict | None:
    try:
        return json.loads((root / STAMP_FILE).read_text())
    except (OSError, ValueError):  # a cache: unreadable means "validate again"
        return None


def _timed(name: str, fn: Callable[[], tuple[str, dict, list[str]]]) -> Step:
    """Run one step under its name (labels progress bars); one line when it ends."""
    reporter = current()
    reporter.stage(name)
    t0 = time.perf_counter()
    status, detail, changed = fn()
    step = Step(name, status, time.perf_counter() - t0, detail, changed)
    what = _what(step)
    reporter.step(f"{name}: {status}" + (f" in {step.seconds:.2f}s; {what}" if what else ""))
    return step


@dataclass(frozen=True)
class PlanShape:
    """One world size to plan, and how (``split_long``), or why it is skipped (``skip``)."""

    world_size: int
    split_long: bool = False
    skip: str | None = None


def _fresh_plan_exists(
    where: str | Dataset, ds: Dataset, w: int, k: int, split: bool, cost: str
) -> bool:
    """A plan for this shape, these episodes, cost model and splitting is already on disk."""
    from episodekit.metadata.plan_file import PlanError
    from episodekit.metadata.plans import read_plan

    try:
        old = read_plan(where, w, k)
    except (PlanError, DatasetError, OSError):
        return False
    return (
        old is not None
        and old.get("fingerprint") == ds.fingerprint
        and bool(old.get("split_long")) == split
        and old.get("cost_model") == cost
    )


def plan_shapes(
    ds: Dataset,
    world_sizes: Sequence[int],
    num_workers: int,
    cost: str,
    split_long: str,
    plans_at: str | Dataset,
) -> list[PlanShape]:
    """Which world sizes can be planned (every bin must get a frame), decided before anything
    is written, from counts: whole episodes can fill ``bins`` bins when at least ``bins`` of
    them have frames (LPT gives each bin one first); cut episodes can when there are ``bins``
    frames. A fresh plan on disk keeps its ``split_long``. (The plans step itself builds the
    plan once; a ``rowgroup`` partition that still leaves a bin empty is retried with cut
    episodes under ``auto``, else skipped with a warning.)"""
    n = int((ds.column("length") > 0).sum())
    frames, k = ds.num_frames, int(num_workers)
    out = []
    for w in world_sizes:
        w, bins = int(w), int(w) * k
        what = f"{bins} bins ({w} ranks x {k} workers)"
        if frames < bins:
            out.append(PlanShape(w, skip=f"{frames} frames cannot fill {what}"))
            continue
        tries = {"no": [False], "yes": [True], "auto": [False, True]}[split_long]
        fresh = [t for t in tries if _fresh_plan_exists(plans_at, ds, w, k, t, cost)]
        possible = [t for t in tries if t or n >= bins]
        chosen = (fresh or possible or [None])[0]
        if chosen is None:
            hint = (
                "use --split-long auto to cut episodes into frame ranges, or"
                if split_long == "no"
                else "use"
            )
            out.append(
                PlanShape(
                    w,
                    skip=f"{n} episodes cannot give each of {what} a frame; "
                    f"{hint} a smaller --world-size or --workers",
                )
            )
        else:
            out.append(PlanShape(w, split_long=chosen))
    return out


def _videos_step(
    work: Path, gop: int, force: bool, say: Callable[[str], None]
) -> tuple[str, dict, list[str]]:
    """``prep videos`` on the work root (its mp4s re-encoded in place, verified, resumable)."""
    from episodekit.prep.videos import rewrite_videos

    say(f"videos: re-encoding for random access (GOP {gop})")
    rep = rewrite_videos(str(work), gop=gop, force=force, timing_frames=0, progress=say)
    counts = {s: sum(f.status == s for f in rep.files) for s in ("rewritten", "skipped", "failed")}
    changed = [f.file for f in rep.files if f.status == "rewritten"]
    if rep.info_updated:
        changed.append(INFO_FILE)
    detail = {"counts": counts, "failed": [f"{f.file}: {f.message}" for f in rep.failed][:10]}
    if rep.failed or not rep.files:
        if not rep.files:
            detail["failed"] = ["no video files (prepared into --out without --videos?)"]
        return "failed", detail, changed
    return ("done" if changed else "skipped"), detail, changed


def prepare(
    root: str,
    out: str | None = None,
    target_mb: float = DEFAULT_TARGET_MB,
    world_sizes: Sequence[int] = (8, 64),
    num_workers: int = 4,
    cost: str = "frames",
    executor: str = "local",
    jobs: int | None = None,
    push_to_hub: str | None = None,
    include_videos: bool = False,
    force: bool = False,
    hub_api: Any = None,
    progress: Callable[[str], None] | None = None,
    split_long: str | bool = "no",
    videos_gop: int | None = None,
    locality: str = "rowgroup",
    frames: bool = False,
    wait: bool = True,
    canonical_bins: int | None | bool = False,
) -> PrepareResult:
    """Run the whole job on ``root`` (or into ``out``); see the module docstring.

    ``jobs``: processes for the per-file steps (default: cores). ``hub_api``: an object with
    huggingface_hub's ``create_commit`` (tests pass a fake). ``split_long``: "no" (skip a world
    size whose bins cannot all get whole episodes), "yes" (always cut long episodes), "auto"
    (cut only where needed); skipped world sizes are in ``result.warnings``. ``progress``: an
    extra callback for the step lines (the current :mod:`episodekit.core.progress` reporter
    gets them too). Raises ``ValueError`` for bad arguments, ``EnvironmentProblem`` for a
    missing optional dependency and ``DatasetError`` for an unreadable root, all before writing
    anything; a failed validation is reported in the result (``ok`` False), not raised.
    ``locality``: the shard plans' (``rowgroup`` by default: each bin a contiguous run of row
    groups; ``none``: LPT/KK). ``videos_gop``: also re-encode the videos for random access with
    this GOP (``prep videos``, after the row groups). ``frames``: also build the frame store.
    ``canonical_bins``: also write the canonical plan for elastic resume (an int C, None for the
    default C of the episode count, False for none). The
    whole run holds the writer lock of the folder it writes (``wait=False``: EnvironmentProblem
    when another writer holds it; leftover temporaries there are removed under it).
    """
    from episodekit.metadata.costs import check_model

    reporter = current()

    def say(msg: str) -> None:
        reporter.step(msg)
        if progress is not None:
            progress(msg)

    # -- 1. arguments and feasibility: nothing is written before these pass --------------------
    if isinstance(split_long, bool):
        split_long = "yes" if split_long else "no"
    if split_long not in SPLIT_LONG:
        raise ValueError(f"split_long must be one of {SPLIT_LONG}, got {split_long!r}")
    if not world_sizes or any(int(w) < 1 for w in world_sizes):
        raise ValueError(f"world sizes must be >= 1, got {list(world_sizes)}")
    if num_workers < 1:
        raise ValueError(f"workers must be >= 1, got {num_workers}")
    if target_mb <= 0:
        raise ValueError(f"target_mb must be > 0, got {target_mb}")
    if canonical_bins is not False and canonical_bins is not None and int(canonical_bins) < 1:
        raise ValueError(f"canonical_bins must be >= 1, got {canonical_bins}")
    check_model(cost)
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise EnvironmentProblem("--executor ray needs ray: pip install 'episodekit[ray]'")
    if is_remote(root) and out is None:
        raise ValueError(f"{root} is remote: pass --out DIR (it is read there, prepared locally)")
    if out is not None:
        out = str(out)
    with writer_lock(out or root, wait=wait, say=say):
        return _prepare(
            root, out, target_mb, world_sizes, num_workers, cost, executor, jobs, push_to_hub,
            include_videos, force, hub_api, say, split_long, videos_gop, locality, frames,
            canonical_bins,
        )  # fmt: skip


def _prepare(
    root: str,
    out: str | None,
    target_mb: float,
    world_sizes: Sequence[int],
    num_workers: int,
    cost: str,
    executor: str,
    jobs: int | None,
    push_to_hub: str | None,
    include_videos: bool,
    force: bool,
    hub_api: Any,
    say: Callable[[str], None],
    split_long: str,
    videos_gop: int | None,
    locality: str,
    frames: bool,
    canonical_bins: int | None | bool = False,
) -> PrepareResult:
    """The steps of :func:`prepare`, under the writer lock (arguments already checked)."""
    from episodekit.metadata.costs import ensure_costs
    from episodekit.metadata.plans import ensure_plans
    from episodekit.metadata.speed import ensure_speed_file
    from episodekit.prep import rewrite_rowgroups
    from episodekit.validate.runner import validate

    reporter = current()
    t0 = time.perf_counter()
    result = PrepareResult(root=str(root), work_root=str(out or root))
    source = open_dataset(str(root))
    plans_at: str | Dataset = source if out is None else str(out)
    shapes = plan_shapes(source, world_sizes, num_workers, cost, split_long, plans_at)
    for shape in shapes:
        if shape.skip:
            result.warnings.append(f"world size {shape.world_size} skipped: {shape.skip}")
    for w in result.warnings:
        say(f"warning: {w}")

    # -- 2. row groups (also copies meta/ into --out for a remote or out-of-place run) --------
    def rowgroups() -> tuple[str, dict, list[str]]:
        def bytes_done(res, done: int, total: int) -> None:
            reporter.active().advance(0, nbytes=res.bytes)  # the executor counts files

        rep = rewrite_rowgroups(
            str(root),
            target_mb=target_mb,
            out=out,
            workers=jobs,
            executor=executor,
            force=force,
            copy_videos=include_videos,
            progress=bytes_done,
        )
        summary = rep.summary()
        changed = [r.path for r in rep.files if r.status == "rewritten"]
        if out is not None:
            changed = sorted(
                str(p.relative_to(out))
                for p in Path(out).rglob("*")
                if p.is_file()
                and not p.name.startswith(".")
                and str(p.relative_to(out)) != STAMP_FILE
            )
        if not rep.ok:
            return "failed", summary, changed
        counts = summary["counts"]
        busy = counts.get("rewritten", 0) or counts.get("copied", 0)
        return ("done" if busy else "skipped"), summary, changed

    result.steps.append(_timed("rowgroups", rowgroups))
    work = Path(result.work_root).resolve()  # local: a remote root requires --out
    result.work_root = str(work)
    if result.steps[-1].status == "failed":
        result.seconds = time.perf_counter() - t0
        return result
    if videos_gop is not None:
        result.steps.append(_timed("videos", lambda: _videos_step(work, videos_gop, force, say)))
        if result.steps[-1].status == "failed":
            result.seconds = time.perf_counter() - t0
            return result
    fresh_rows = out is None and not any(s.changed for s in result.steps)
    ds = source if fresh_rows else open_dataset(str(work))

    def speed() -> tuple[str, dict, list[str]]:
        rows, changed = ensure_speed_file(ds, force=force)
        sparse = sum(r.get("percentiles") is None for r in rows)
        detail = {"tasks": len(rows), "sparse_tasks": sparse}
        return (
            ("done" if changed else "skipped"),
            detail,
            ([SPEED_FILE] if changed else []),
        )

    rows_rewritten = any(s.changed for s in result.steps)

    def costs() -> tuple[str, dict, list[str]]:
        # rewritten data files change every episode's data_bytes: a table from before is stale
        table, changed = ensure_costs(ds, cost, force=force or rows_rewritten)
        detail = {"model": cost, "episodes": table.num_rows}
        return (
            ("done" if changed else "skipped"),
            detail,
            ([COST_FILE] if changed else []),
        )

    def plans() -> tuple[str, dict, list[str]]:
        def plan_one(w: int, split: bool) -> tuple[str, dict, bool]:
            [one] = ensure_plans(
                ds, [w], num_workers, cost=cost, split_long=split, force=force, locality=locality
            )
            return one

        changed, detail = [], {"plans": [], "skipped_world_sizes": []}
        for shape in shapes:
            if shape.skip:
                detail["skipped_world_sizes"].append(
                    {"world_size": shape.world_size, "reason": shape.skip}
                )
                continue
            try:
                path, plan, was_changed = plan_one(shape.world_size, shape.split_long)
            except ValueError as exc:  # a bin left empty (whole episodes, rowgroup runs)
                if shape.split_long or split_long != "auto":
                    detail["skipped_world_sizes"].append(
                        {"world_size": shape.world_size, "reason": str(exc)}
                    )
                    result.warnings.append(f"world size {shape.world_size} skipped: {exc}")
                    say(f"warning: {result.warnings[-1]}")
                    continue
                path, plan, was_changed = plan_one(shape.world_size, True)
            rel = os.path.relpath(path, work) if os.path.isabs(path) else path
            if was_changed:
                changed.append(rel)
            detail["plans"].append(
                {
                    "path": rel,
                    "world_size": plan.get("world_size"),
                    "num_workers": plan.get("num_workers"),
                    "split_long": bool(plan.get("split_long")),
                    "changed": was_changed,
                    "balance": plan.get("balance", {}),
                    "samples_per_rank": plan.get("samples_per_rank"),
                }
            )
        if canonical_bins is not False:  # world-size-free plan for elastic resume
            from episodekit.metadata.canonical import ensure_canonical_plan

            path, plan, was_changed = ensure_canonical_plan(
                ds, canonical_bins, cost=cost, split_long=split_long == "yes", force=force,
                locality=locality,
            )  # fmt: skip
            rel = os.path.relpath(path, work) if os.path.isabs(path) else path
            if was_changed:
                changed.append(rel)
            detail["plans"].append(
                {
                    "path": rel,
                    "canonical_bins": plan.get("canonical_bins"),
                    "split_long": bool(plan.get("split_long")),
                    "changed": was_changed,
                    "balance": plan.get("balance", {}),
                    "samples_per_rank": plan.get("samples_per_rank"),
                }
            )
        return ("done" if changed else "skipped"), detail, changed

    result.steps.append(_timed("speed", speed))
    result.steps.append(_timed("costs", costs))
    result.steps.append(_timed("plans", plans))

    # 5. Normalization stats (stats.json + per-episode stats columns), skipped when fresh.
    def stats() -> tuple[str, dict, list[str]]:
        from episodekit.metadata.stats import STATS_FILE, SUMMARY_FILE, ensure_stats

        if ds.version != "v3.0":
            return "skipped", {"status": f"{ds.version}: stats are written for v3.0 only"}, []
        res, status = ensure_stats(str(work), force=force, executor=executor, jobs=jobs)
        if res is None:
            return "skipped", {"status": status}, []
        changed = [STATS_FILE, SUMMARY_FILE] if status == "written" else []
        changed += [str(p.relative_to(work)) for p in work.glob("meta/episodes/*/*.parquet")] * (
            status == "written"
        )
        detail = {"status": status, "features": len(res.features), "quantiles": res.mode}
        return ("done" if status == "written" else "skipped"), detail, changed

    result.steps.append(_timed("stats", stats))

    def validation() -> tuple[str, dict, list[str]]:
        digest = _state_digest(work, ds.fingerprint, ds.data_files)
        stamp = _read_stamp(work)
        if not force and stamp and stamp.get("state") == digest and stamp.get("ok"):
            return "skipped", {"ok": True, "fresh_stamp": True, **stamp.get("counts", {})}, []
        # A copy prepared without its videos cannot have them checked (and is not meant to).
        checks = "all,-info.videos,-video" if out is not None and not include_videos else None
        report = validate(str(work), checks=checks, executor=executor)
        d = report.to_dict()
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
            stamp_path = inside_root(work, STAMP_FILE)
            atomic_write_text(stamp_path, json.dumps(stamp, indent=2, sort_keys=True))
        return ("done" if d["ok"] else "failed"), detail, []

    step = _timed("validate", validation)
    result.steps.append(step)
    result.ok = step.status != "failed"
    if frames:
        result.steps.append(_timed("frames", lambda: _frames_step(work, result.ok, jobs, force)))
        result.ok = result.ok and result.steps[-1].status != "failed"
    if push_to_hub and result.ok:
        hub = parse_hub_root(push_to_hub)
        repo = hub.repo_id if hub else push_to_hub
        reporter.stage("push")
        say(f"push: uploading {len(result.changed)} changed files to {repo}")
        result.pushed = push_files(
            work, result.changed, repo, api=hub_api, revision=hub.revision if hub else None
        )
    result.seconds = time.perf_counter() - t0
    return result


def _frames_step(work: Path, valid: bool, jobs: int | None, force: bool):
    """The frame store of the prepared root (outside it: ``changed`` stays empty)."""
    from episodekit.core.errors import DatasetError, EnvironmentProblem
    from episodekit.prep.frames import build_frame_store

    if not valid:
        return "skipped", {"reason": "validation failed"}, []
    try:
        rep = build_frame_store(str(work), jobs=jobs, force=force)
    except (DatasetError, EnvironmentProblem) as exc:
        return "failed", {"error": str(exc)}, []
    return ("done" if rep.status == "built" else "skipped"), rep.summary(), []


def format_result(r: PrepareResult) -> str:
    """The one summary printed at the end of ``episodekit prepare``."""
    lines = [f"prepared {r.root}" + (f" -> {r.work_root}" if r.work_root != r.root else "")]
    lines.append(f"  {'step':<10} {'status':<8} {'seconds':>8}  what")
    for s in r.steps:
        lines.append(f"  {s.name:<10} {s.status:<8} {s.seconds:>8.2f}  {_what(s)}".rstrip())
    plans = (r.step("plans") or Step("plans", "", 0)).detail.get("plans", [])
    if plans:
        lines.append("  balance (max bin cost / lower bound; naive contiguous, round-robin)")
        for p in plans:
            b = p.get("balance") or {}
            shape = (
                f"ws={p['world_size']:<5} workers={p['num_workers']:<3}"
                if "world_size" in p
                else f"canonical C={p['canonical_bins']:<6}"
            )
            lines.append(
                f"    {shape} "
                f"plan {_ratio(b, 'plan')}  contiguous {_ratio(b, 'contiguous')}  "
                f"round-robin {_ratio(b, 'round_robin')}  samples/rank {p['samples_per_rank']}"
            )
    for w in r.warnings:
        lines.append(f"  warning: {w}")
    v = r.step("validate")
    failed = next((s for s in r.steps if s.status == "failed"), None)
    if failed is not None and failed.name != "validate":
        lines.append(f"prepare FAILED at step {failed.name} (validation did not run)")
    else:
        verdict = "PASSED" if r.ok else "FAILED"
        what = _what(v) if v else ""
        if v and v.status == "skipped":
            what = "unchanged since the last passing validation"
        lines.append(f"validation {verdict}" + (f" ({what})" if what else ""))
    lines.append(f"{len(r.changed)} files changed in {r.seconds:.1f}s")
    if r.pushed is not None:
        lines.append(f"pushed: {r.pushed}")
    return "\n".join(lines)


def _ratio(balance: dict, key: str) -> str:
    part = balance.get(key)
    if isinstance(part, dict) and "max_over_lower_bound" in part:
        return f"{part['max_over_lower_bound']:.4f}"
    if key == "plan" and "max_over_lower_bound" in balance:
        return f"{balance['max_over_lower_bound']:.4f}"
    return "?"


def _what(s: Step) -> str:
    """What a step did; nothing for a skipped step (its status says it all)."""
    d = s.detail
    if s.status == "skipped":
        return ""
    if s.name == "videos":
        c = d.get("counts", {})
        txt = f"{c.get('rewritten', 0)} re-encoded, {c.get('skipped', 0)} skipped, "
        txt += f"{c.get('failed', 0)} failed"
        for f in d.get("failed", [])[:5]:
            txt += f"\n      failed: {f}"
        return txt
    if s.name == "frames":
        if "error" in d or "reason" in d:
            return str(d.get("error") or d.get("reason"))
        mib = d.get("bytes", 0) / 2**20
        return f"{d.get('frames', 0):,} frames, {mib:,.0f} MiB in {d.get('store')}"
    if s.name == "rowgroups":
        c = d.get("counts", {})
        txt = (
            f"{c.get('rewritten', 0)} rewritten, {c.get('skipped', 0)} skipped, "
            f"{c.get('copied', 0)} copied, {c.get('failed', 0)} failed; "
            f"row groups {d.get('before', {}).get('row_groups', '?')} -> "
            f"{d.get('after', {}).get('row_groups', '?')}; {d.get('mb_per_s', 0)} MB/s"
        )
        for f in d.get("failed", [])[:5]:
            txt += f"\n      failed: {f['path']}: {f['reason']}"
        return txt
    if s.name == "speed":
        return f"{d.get('tasks')} tasks ({d.get('sparse_tasks')} sparse)"
    if s.name == "costs":
        return f"model {d.get('model')}"
    if s.name == "stats":
        if "features" not in d:
            return "fresh" if d.get("status") == "fresh" else str(d.get("status", ""))
        modes = sorted(set((d.get("quantiles") or {}).values()))
        return f"{d['features']} features, quantiles {'/'.join(modes)}, {d.get('status')}"
    if s.name == "plans":
        return f"{len(d.get('plans', []))} plans, {len(s.changed)} written"
    if s.name == "validate":
        txt = f"{d.get('errors', 0)} errors, {d.get('warnings', 0)} warnings"
        if d.get("fresh_stamp"):
            txt += "; unchanged since last passing validation"
        for f in d.get("first_errors", [])[:5]:
            txt += f"\n      {f.get('check')}: {f.get('file') or ''} {f.get('message')}"
        return txt
    return ""
