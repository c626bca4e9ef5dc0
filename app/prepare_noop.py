"""The no-op rerun of ``prepare``, from the validation stamp alone (standard library only).

A passing validation's stamp (``meta/episodekit_validation.json``) is keyed on the size and
mtime of every data file, episodes file and artifact; it also records what a rerun with the same
options would report (``rerun``: the options, the data files, the warnings and each step's
detail). When the stamp still matches the root's state and the options are the same, every step
is fresh: the result is that record, with every step "skipped", and nothing else is read (no
footer, no parquet or dataframe library, no process). Anything unusual (``--out``, ``--force``,
``--push-to-hub``, videos, frame store, ``--stats recompute``, another version) takes the
ordinary path, where each step checks its own output.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from episodekit.core.version import __version__

if TYPE_CHECKING:
    from collections.abc import Callable

    from episodekit.prepare_model import PrepareOptions, PrepareResult, Step

RERUN_STEPS = ("rowgroups", "speed", "costs", "plans", "stats", "validate")


def options_key(opts: PrepareOptions) -> dict[str, Any]:
    """The options that decide what a run writes (not how: jobs, executor, wait)."""
    c = opts.canonical_bins
    return {
        "version": __version__,
        "target_mb": float(opts.target_mb),
        "world_sizes": [int(w) for w in opts.world_sizes],
        "num_workers": int(opts.num_workers),
        "cost": opts.cost,
        "split_long": opts.split_long,
        "locality": opts.locality,
        "canonical_bins": c if c is None or isinstance(c, bool) else int(c),
        "stats": opts.stats,
        "plans_required": opts.plans_required,
    }


def eligible(root: str, opts: PrepareOptions, recording: bool = False) -> bool:
    """Whether a run with these options can be a stamp-only rerun at all (``recording``:
    whether it can leave the record for one; ``--force`` runs do, for the reruns without it)."""
    return (
        "://" not in root
        and opts.out is None
        and (recording or not opts.force)
        and not opts.push_to_hub
        and opts.videos_gop is None
        and not opts.frames
        and opts.stats == "keep"
        and not opts.exclude  # an exclusion's inputs (a report, a ranges file) may change
    )


def rerun_detail(step: Step) -> dict | None:
    """What ``step`` will report when rerun on the root it left (None: cannot tell)."""
    d = step.detail
    if step.name in ("speed", "costs"):
        return d
    if step.name == "rowgroups":
        n = d.get("after", {}).get("files", 0)
        counts = {"rewritten": 0, "skipped": n, "copied": 0, "planned": 0, "failed": 0}
        return {**d, "counts": counts, "before": d.get("after"), "seconds": 0.0, "mb_per_s": 0.0}
    if step.name == "plans":
        return {**d, "plans": [{**p, "changed": False} for p in d.get("plans", [])]}
    if step.name == "stats":
        if d.get("status") == "kept":  # kept again, without the one-time summary removal
            kept = {"status": "kept", "why": d["why"].split("; ")[0]}
            return {**kept, **({"quantiles": d["quantiles"]} if "quantiles" in d else {})}
        return {"status": "fresh"} if step.status == "done" else d
    return None


def rerun_record(result: PrepareResult, opts: PrepareOptions, data_files: list[str]) -> dict:
    """The stamp's ``rerun`` entry, written with a passing validation (empty: none applies)."""
    steps = {s.name: s for s in result.steps}
    if set(steps) != set(RERUN_STEPS[:-1]) or any(s.status == "failed" for s in steps.values()):
        return {}
    details = {name: rerun_detail(steps[name]) for name in RERUN_STEPS[:-1]}
    if any(d is None for d in details.values()):
        return {}
    return {
        "options": options_key(opts),
        "data_files": list(data_files),
        "warnings": list(result.warnings),
        "details": details,
    }


def noop_result(
    root: str, opts: PrepareOptions, say: Callable[[str], None]
) -> PrepareResult | None:
    """The result of a rerun where everything is fresh, or None when anything may not be."""
    from episodekit.core.progress import current
    from episodekit.prepare_model import PrepareResult, Step, read_stamp, state_digest

    t0 = time.perf_counter()
    work = Path(root).resolve()
    stamp = read_stamp(work)
    rec = (stamp or {}).get("rerun") or {}
    if not (stamp and stamp.get("ok") and rec.get("options") == options_key(opts)):
        return None
    if state_digest(work, stamp.get("fingerprint", ""), rec["data_files"]) != stamp.get("state"):
        return None
    result = PrepareResult(root=str(root), work_root=str(work), ok=True)
    result.warnings = list(rec["warnings"])
    for w in result.warnings:
        say(f"warning: {w}")
    reporter = current()
    validated = {"ok": True, "fresh_stamp": True, **stamp.get("counts", {})}
    for name in RERUN_STEPS:
        reporter.stage(name)
        detail = rec["details"].get(name, validated)
        if name == "rowgroups":
            detail = {**detail, "root": str(root)}  # as this run names it
        result.steps.append(Step(name, "skipped", 0.0, detail, []))
        reporter.step(f"{name}: skipped")
    result.seconds = time.perf_counter() - t0
    return result
