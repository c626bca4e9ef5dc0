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

    from episodekit.prepare_model import PrepareOptions, PrepareResult


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


def rerun_record(
    result: PrepareResult, opts: PrepareOptions, data_files: list[str], upto: str
) -> dict:
    """The stamp's ``rerun`` entry, written by the step ``upto`` (validation) with a passing
    verdict: each earlier step's :meth:`~episodekit.prepare_base.PrepareStep.rerun_detail`
    (empty: a step failed, is missing, or cannot tell what its rerun reports)."""
    from episodekit.prepare_steps import wanted_steps

    names = [s.name for s in wanted_steps(opts)]
    before = wanted_steps(opts)[: names.index(upto)] if upto in names else []
    ran = {s.name: s for s in result.steps}
    if set(ran) != {s.name for s in before} or any(s.status == "failed" for s in ran.values()):
        return {}
    details = {s.name: s.rerun_detail(ran[s.name]) for s in before}
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
    from episodekit.prepare_steps import wanted_steps

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
    for step in wanted_steps(opts):  # every step fresh: what each recorded, replayed
        reporter.stage(step.name)
        detail = step.replayed(rec["details"].get(step.name), str(root), stamp)
        result.steps.append(Step(step.name, "skipped", 0.0, detail, []))
        reporter.step(f"{step.name}: skipped")
    result.seconds = time.perf_counter() - t0
    return result
