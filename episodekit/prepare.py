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
   scanned again.

A remote root (``hf://datasets/owner/name[@rev]``, any fsspec URL) is read remotely and prepared
into ``out``; ``push_to_hub`` then uploads the files that changed in one commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from episodekit.core.atomic import atomic_write_text
from episodekit.core.dataset import open_dataset
from episodekit.core.hub import is_remote, parse_hub_root, push_files
from episodekit.core.paths import COST_FILE, DEFAULT_TARGET_MB, PLAN_DIR, SPEED_FILE, STAMP_FILE
from episodekit.core.version import __version__

STAMP_VERSION = 1
ARTIFACT_GLOBS = (
    SPEED_FILE,
    COST_FILE,
    f"{PLAN_DIR}/*",
    "meta/stats.json",
    "meta/episodekit_stats.parquet",
)


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
    except (FileNotFoundError, ValueError):
        return None


def _timed(name: str, fn: Callable[[], tuple[str, dict, list[str]]]) -> Step:
    t0 = time.perf_counter()
    status, detail, changed = fn()
    return Step(name, status, time.perf_counter() - t0, detail, changed)


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
) -> PrepareResult:
    """Run the whole job on ``root`` (or into ``out``); see the module docstring.

    ``jobs``: processes for the per-file steps (default: cores). ``hub_api``: an object with
    huggingface_hub's ``create_commit`` (tests pass a fake). Raises ``ValueError`` for bad
    arguments and ``DatasetError`` for an unreadable root; a failed validation is reported in
    the result (``ok`` False), not raised.
    """
    from episodekit.metadata.costs import ensure_costs
    from episodekit.metadata.plans import ensure_plans
    from episodekit.metadata.speed import ensure_speed_file
    from episodekit.prep import rewrite_rowgroups
    from episodekit.validate.runner import validate

    say = progress or (lambda _msg: None)
    if not world_sizes or any(int(w) < 1 for w in world_sizes):
        raise ValueError(f"world sizes must be >= 1, got {list(world_sizes)}")
    if num_workers < 1:
        raise ValueError(f"workers must be >= 1, got {num_workers}")
    if is_remote(root) and out is None:
        raise ValueError(f"{root} is remote: pass --out DIR (it is read there, prepared locally)")
    t0 = time.perf_counter()
    result = PrepareResult(root=str(root), work_root=str(out or root))

    # 1. Row groups (also copies meta/ into --out for a remote or out-of-place run).
    def rowgroups() -> tuple[str, dict, list[str]]:
        say("row groups: rewriting data files")
        rep = rewrite_rowgroups(
            str(root),
            target_mb=target_mb,
            out=out,
            workers=jobs,
            executor=executor,
            force=force,
            copy_videos=include_videos,
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
        return ("done" if summary["counts"]["rewritten"] else "skipped"), summary, changed

    result.steps.append(_timed("rowgroups", rowgroups))
    work = Path(result.work_root).resolve()  # local: a remote root requires --out
    result.work_root = str(work)
    if result.steps[-1].status == "failed":
        result.seconds = time.perf_counter() - t0
        return result
    ds = open_dataset(str(work))

    def speed() -> tuple[str, dict, list[str]]:
        say("speed percentiles")
        rows, changed = ensure_speed_file(ds, force=force)
        sparse = sum(r.get("percentiles") is None for r in rows)
        detail = {"tasks": len(rows), "sparse_tasks": sparse}
        return (
            ("done" if changed else "skipped"),
            detail,
            ([SPEED_FILE] if changed else []),
        )

    def plans() -> tuple[str, dict, list[str]]:
        say(f"shard plans for world sizes {list(world_sizes)} x {num_workers} workers")
        results = ensure_plans(
            ds, [int(w) for w in world_sizes], num_workers, cost=cost, force=force
        )
        changed, detail = [], {"plans": []}
        for path, plan, was_changed in results:
            rel = os.path.relpath(path, work) if os.path.isabs(path) else path
            if was_changed:
                changed.append(rel)
            bal = plan.get("balance", {})
            detail["plans"].append(
                {
                    "path": rel,
                    "world_size": plan.get("world_size"),
                    "num_workers": plan.get("num_workers"),
                    "changed": was_changed,
                    "balance": bal,
                    "samples_per_rank": plan.get("samples_per_rank"),
                }
            )
        return ("done" if changed else "skipped"), detail, changed

    def costs() -> tuple[str, dict, list[str]]:
        say(f"cost table ({cost})")
        table, changed = ensure_costs(ds, cost, force=force)
        detail = {"model": cost, "episodes": table.num_rows}
        return (
            ("done" if changed else "skipped"),
            detail,
            ([COST_FILE] if changed else []),
        )

    result.steps.append(_timed("speed", speed))
    result.steps.append(_timed("costs", costs))
    result.steps.append(_timed("plans", plans))

    # 5. Normalization stats (stats.json + per-episode stats columns), skipped when fresh.
    def stats() -> tuple[str, dict, list[str]]:
        from episodekit.metadata.stats import STATS_FILE, SUMMARY_FILE, ensure_stats

        if ds.version != "v3.0":
            return "skipped", {"status": f"{ds.version}: stats are written for v3.0 only"}, []
        say("normalization stats")
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
        say("validating")
        # A copy prepared without its videos cannot have them checked (and is not meant to).
        checks = "all,-info.videos" if out is not None and not include_videos else None
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
            atomic_write_text(work / STAMP_FILE, json.dumps(stamp, indent=2, sort_keys=True))
        return ("done" if d["ok"] else "failed"), detail, []

    step = _timed("validate", validation)
    result.steps.append(step)
    result.ok = step.status != "failed"
    if push_to_hub and result.ok:
        hub = parse_hub_root(push_to_hub)
        repo = hub.repo_id if hub else push_to_hub
        say(f"pushing {len(result.changed)} changed files to {repo}")
        result.pushed = push_files(
            work, result.changed, repo, api=hub_api, revision=hub.revision if hub else None
        )
    result.seconds = time.perf_counter() - t0
    return result


def format_result(r: PrepareResult) -> str:
    """The one summary printed at the end of ``episodekit prepare``."""
    lines = [f"prepared {r.root}" + (f" -> {r.work_root}" if r.work_root != r.root else "")]
    lines.append(f"  {'step':<10} {'status':<8} {'seconds':>8}  what")
    for s in r.steps:
        lines.append(f"  {s.name:<10} {s.status:<8} {s.seconds:>8.2f}  {_what(s)}")
    plans = (r.step("plans") or Step("plans", "", 0)).detail.get("plans", [])
    if plans:
        lines.append("  balance (max bin cost / lower bound; naive contiguous, round-robin)")
        for p in plans:
            b = p.get("balance") or {}
            lines.append(
                f"    ws={p['world_size']:<5} workers={p['num_workers']:<3} "
                f"plan {_ratio(b, 'plan')}  contiguous {_ratio(b, 'contiguous')}  "
                f"round-robin {_ratio(b, 'round_robin')}  samples/rank {p['samples_per_rank']}"
            )
    v = r.step("validate")
    verdict = "PASSED" if r.ok else "FAILED"
    lines.append(f"validation {verdict}" + (f" ({_what(v)})" if v else ""))
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
    d = s.detail
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
