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
    from collections.abc import Callable, Sequence

    from episodekit.prepare_base import PrepareStep
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
    result: PrepareResult, opts: PrepareOptions, data_files: list[str], before: list[PrepareStep]
) -> dict:
    """The stamp's ``rerun`` entry, written by validation with a passing verdict: the
    :meth:`~episodekit.prepare_base.PrepareStep.rerun_detail` of each step run ``before`` it
    (empty: a step failed, is missing, or cannot tell what its rerun reports)."""
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
    root: str, opts: PrepareOptions, say: Callable[[str], None], steps: Sequence[PrepareStep]
) -> PrepareResult | None:
    """The result of a rerun where everything is fresh, or None when anything may not be;
    ``steps``: the registry (:data:`episodekit.prepare_steps.STEPS`)."""
    from episodekit.core.progress import current
    from episodekit.prepare_base import stamped_globs
    from episodekit.prepare_model import PrepareResult, Step, read_stamp, state_digest

    t0 = time.perf_counter()
    work = Path(root).resolve()
    stamp = read_stamp(work)
    rec = (stamp or {}).get("rerun") or {}
    if not (stamp and stamp.get("ok") and rec.get("options") == options_key(opts)):
        return None
    fingerprint, globs = stamp.get("fingerprint", ""), stamped_globs(steps)
    state = state_digest(work, fingerprint, rec["data_files"], globs)
    if state != stamp.get("state"):
        return None
    result = PrepareResult(root=str(root), work_root=str(work), ok=True)
    result.warnings = list(rec["warnings"])
    for w in result.warnings:
        say(f"warning: {w}")
    reporter = current()
    for step in [s for s in steps if s.wanted(opts)]:  # every step fresh: each one's record
        reporter.stage(step.name)
        detail = step.replayed(rec["details"].get(step.name), str(root), stamp)
        result.steps.append(Step(step.name, "skipped", 0.0, detail, []))
        reporter.step(f"{step.name}: skipped")
    result.seconds = time.perf_counter() - t0
    return result
