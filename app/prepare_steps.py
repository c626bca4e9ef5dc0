"""The registry of ``episodekit prepare``'s steps and their artifacts, and the runner.

:data:`STEPS` lists every step in the order a run takes them (each one object declaring its
artifacts, ``ensure`` and its typed result: :mod:`episodekit.prepare_base`). The runner
(:func:`run_steps`), the stamp-only rerun (:mod:`episodekit.prepare_noop`), the validation
stamp (:func:`stamped_globs`) and the summary (:func:`summarize`) read from it; no step is
named anywhere else. A new artifact: one module with its step (paths, input key, ``ensure``,
``summary``, ``rerun_detail``), its line here, and its CLI command.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from episodekit.core.memory import release_memory
from episodekit.core.progress import current
from episodekit.prepare_base import Artifact, Context, Ensured, PrepareStep
from episodekit.prepare_base import stamped_globs as _stamped_globs
from episodekit.prepare_checks import Frames, Validate
from episodekit.prepare_rewrites import RowGroups, Videos
from episodekit.prepare_stats import Stats
from episodekit.prepare_tables import Costs, Plans, Speed, plan_options

if TYPE_CHECKING:
    from episodekit.prepare_model import PrepareOptions, Step

__all__ = [
    "STEPS",
    "Artifact",
    "Context",
    "Ensured",
    "PrepareStep",
    "plan_options",
    "run_steps",
    "stamped_globs",
    "summarize",
    "verdict_steps",
    "wanted_steps",
]

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


def wanted_steps(opts: PrepareOptions) -> list[PrepareStep]:
    """The steps a run with ``opts`` takes, in order."""
    return [s for s in STEPS if s.wanted(opts)]


def verdict_steps() -> tuple[str, ...]:
    """Names of the steps whose failure is a verdict on a complete output (published)."""
    return tuple(s.name for s in STEPS if s.verdict)


def stamped_globs() -> tuple[str, ...]:
    """What the validation stamp keys on (size and mtime), besides the data files: the files
    validation reads and every stamped artifact's paths, in registry order."""
    return _stamped_globs(STEPS)


def timed(step: PrepareStep, ctx: Context) -> Step:
    """Run one step under its name (labels progress bars); one line when it ends."""
    from episodekit.prepare_model import Step

    reporter = current()
    reporter.stage(step.name)
    t0 = time.perf_counter()
    status, detail, changed = step.ensure(ctx)
    release_memory()  # what the step freed goes back: the next one starts from the base
    done = Step(step.name, status, time.perf_counter() - t0, detail, changed)
    what = step.summary(done) if status != "skipped" else ""  # a kept stats: in the table
    line = f"{step.name}: {status}" + (f" in {done.seconds:.2f}s; {what}" if what else "")
    reporter.step(line)
    return done


def run_steps(ctx: Context, steps: tuple[PrepareStep, ...] | None = None) -> None:
    """Run the wanted steps (default: the registry's) in order into ``ctx.result``: a failed
    rewrite stops the run; the verdict is the verdict steps' (validation's, and the frame
    store's when built)."""
    verdicts: list[bool] = []
    ctx.steps = STEPS if steps is None else steps
    for step in ctx.steps:
        if not step.wanted(ctx.opts):
            continue
        done = timed(step, ctx)
        ctx.result.steps.append(done)
        if done.status == "failed" and step.stops_on_failure:
            return
        if step.verdict:
            verdicts.append(done.status != "failed")
            ctx.result.ok = all(verdicts)


def summarize(step: Step) -> str:
    """A finished step's summary line text (nothing for a skipped one)."""
    owner = next((s for s in STEPS if s.name == step.name), None)
    if owner is None:
        return ""
    if step.status == "skipped" and step.detail.get("status") != "kept":  # kept: say so
        return ""
    return owner.summary(step)
