"""The mixture commands that write: ``prepare --mixture M --out DIR`` (prepare every source,
then plan the mixture), ``metadata plan --mixture`` and ``metadata stats --mixture``; each holds
the writer locks of DIR (and of the sources it writes into), as ROOT commands hold ROOT's."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from episodekit.core.errors import EnvironmentProblem
from episodekit.core.lock import LOCK_NAME, writer_lock
from episodekit.core.outdir import MARKER, check_output_dir
from episodekit.core.words import plural
from episodekit.metadata.mixture.spec import (
    MIXTURE_FILE,
    MixtureError,
    MixtureSpec,
    ResolvedSource,
    epoch_size,
    parse_mixture,
    resolve_sources,
)
from episodekit.metadata.plans.options import PlanOptions
from episodekit.prepare import PrepareOptions, PrepareResult, format_result, prepare


def _local_root(root: str) -> str | None:
    path = root[len("file://") :] if root.startswith("file://") else root
    return None if "://" in path else path


@contextlib.contextmanager
def mixture_writing(
    spec: MixtureSpec,
    out: str | os.PathLike,
    wait: bool = True,
    sources: bool = True,
    say: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the writer locks a mixture command needs, as single-root commands hold ROOT's:
    the ``out`` folder (created if missing; removed again when the command failed or wrote
    nothing into it) and, with ``sources``, every local source root (a mixture plan writes
    their cost tables). Taken in one sorted order, so two mixture commands never deadlock.
    ``wait=False`` (``--no-wait``): an :class:`EnvironmentProblem` (exit 2) at once when
    another episodekit process holds one of them. ``out`` follows the one rule of output
    folders (:func:`~episodekit.core.outdir.check_output_dir`: missing, empty or episodekit's,
    never in or around a source), checked before anything is written (the plan and stats
    writers mark it as episodekit's)."""
    out = os.fspath(out)
    check_output_dir(out, sources=[s.root for s in spec.sources])
    created = not os.path.exists(out)
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:  # read-only, permission, a file on the way: the option, not the data
        raise EnvironmentProblem(
            f"cannot create the --out folder: {exc.strerror or exc}", out
        ) from exc
    folders = {os.path.realpath(out)}
    if sources:
        local = (_local_root(s.root) for s in spec.sources)
        folders |= {os.path.realpath(p) for p in local if p is not None and os.path.isdir(p)}
    failed = True
    try:
        with contextlib.ExitStack() as stack:
            for folder in sorted(folders):
                stack.enter_context(writer_lock(folder, wait=wait, say=say))
            yield
            failed = False
    finally:
        if created:  # a folder made for nothing (or for a failed plan's spec): not left behind
            _remove_if_only(out, {LOCK_NAME, MARKER} | ({MIXTURE_FILE} if failed else set()))


def _remove_if_only(folder: str, names: set[str]) -> None:
    """Remove ``folder`` when it holds nothing but (some of) ``names``."""
    with contextlib.suppress(OSError):
        if set(os.listdir(folder)) <= names:
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(folder, name))
            os.rmdir(folder)


def plan_mixture(
    mixture: str | os.PathLike | dict,
    out: str | os.PathLike,
    world_sizes: Sequence[int],
    num_workers: int,
    wait: bool = True,
    say: Callable[[str], None] | None = None,
    **plan_kwargs: Any,
) -> list[tuple[str, dict, bool]]:
    """``metadata plan --mixture M --out DIR``: :func:`ensure_mixture_plans` under the writer
    locks of DIR and of every local source (their cost tables are written), never over a
    hand-written DIR/mixture.json (see :func:`mixture_writing`)."""
    spec = parse_mixture(mixture)
    with mixture_writing(spec, out, wait=wait, say=say):
        return mixture_plans(spec, out, list(world_sizes), num_workers, **plan_kwargs)


def stats_of_mixture(
    mixture: str | os.PathLike | dict,
    out: str | os.PathLike,
    wait: bool = True,
    say: Callable[[str], None] | None = None,
    **stats_kwargs: Any,
) -> dict[str, Any]:
    """``metadata stats --mixture M --out DIR``: :func:`ensure_mixture_stats` under DIR's
    writer lock (the sources are only read)."""
    from episodekit.metadata.mixture.stats import ensure_mixture_stats

    spec = parse_mixture(mixture)
    with mixture_writing(spec, out, wait=wait, sources=False, say=say):
        return ensure_mixture_stats(spec, out, **stats_kwargs)


@dataclass
class MixturePrepareResult:
    """Per source: its prepare result (None for a hub source, read as it is); the plans."""

    sources: dict[str, PrepareResult | None] = field(default_factory=dict)
    plans: list[tuple[str, dict, bool]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # world sizes skipped, as prepare ROOT

    @property
    def ok(self) -> bool:
        return all(r is None or r.ok for r in self.sources.values())

    def to_dict(self) -> dict[str, Any]:
        skip = ("items", "item_source", "bin_offsets", "bin_cost", "bin_frames", "bin_draws")
        return {
            "ok": self.ok,
            "sources": {n: (r.to_dict() if r else None) for n, r in self.sources.items()},
            "plans": [
                {"path": p, "changed": c, **{k: v for k, v in d.items() if k not in skip}}
                for p, d, c in self.plans
            ],
            "notes": self.notes,
            "warnings": self.warnings,
        }


def prepare_mixture(
    mixture: str | dict, out: str, progress: Callable[[str], None] | None = None, **options: Any
) -> MixturePrepareResult:
    """Run :func:`episodekit.prepare.prepare` (the same steps) on every local source, each step
    skipped when fresh, then write the mixture plans into ``out``. ``options`` are
    :class:`~episodekit.prepare.PrepareOptions`' fields (``out`` excepted: here it is the plans'
    folder). Hub sources are read as they are (prepare them with ``episodekit prepare hf://...
    --out DIR`` and point the mixture at DIR). Plans are written only when every source
    validated. The writer locks of ``out`` and every local source are held for the whole run
    (``wait=False``: refused at once when one is held)."""
    opts = PrepareOptions(progress=progress, **options)
    spec = parse_mixture(mixture)
    if os.path.exists(os.path.join(os.fspath(out), "meta", "info.json")):  # before any source
        raise MixtureError(f"{out}: --out is a dataset root; give the mixture plan its own folder")
    result = MixturePrepareResult()
    # before anything is written: every source root and filter, and which world sizes can be
    # planned (a size whose bins cannot all draw is skipped with a warning, as prepare ROOT)
    resolved = resolve_sources(spec)
    sizes = []
    for w in opts.world_sizes:
        why = plan_skip_reason(spec, resolved, int(w), int(opts.num_workers))
        if why:
            result.warnings.append(f"world size {w} skipped: {why}")
        else:
            sizes.append(int(w))
    with mixture_writing(spec, out, wait=opts.wait):
        return _prepare_sources_then_plan(result, spec, out, sizes, opts)


def plan_skip_reason(
    spec: MixtureSpec, sources: list[ResolvedSource], world_size: int, num_workers: int
) -> str:
    """Why a mixture plan of this shape cannot be built ("" when it can): its ``trim`` epoch
    must give every bin a sample, and every source needs a frame for every bin (each bin draws
    from every source)."""
    bins = world_size * num_workers
    what = f"{plural(bins, 'bin')} ({plural(world_size, 'rank')} x {plural(num_workers, 'worker')})"
    small = [s for s in sources if s.frames < bins]
    if small:
        return (
            f"source {small[0].name!r} has {plural(small[0].frames, 'selected frame')}, fewer than "
            f"{what}; use a smaller --world-size or --workers"
        )
    epoch = spec.epoch_frames or sum(s.frames for s in sources)
    try:
        epoch_size(epoch, bins, "trim")
    except MixtureError:
        return (
            f"an epoch of {plural(epoch, 'frame')} cannot give each of {what} a sample; use a "
            "smaller --world-size or --workers, or raise epoch_frames"
        )
    return ""


def _prepare_sources_then_plan(
    result: MixturePrepareResult,
    spec: MixtureSpec,
    out: str,
    sizes: list[int],
    opts: PrepareOptions,
) -> MixturePrepareResult:
    """Every local source through ``prepare`` (the single-root steps), then the mixture plans."""
    per_source = {f.name: getattr(opts, f.name) for f in fields(opts) if f.name != "out"}
    per_source["plans_required"] = False  # a job loads the mixture's plans, written below
    for s in spec.sources:
        if "://" in s.root and not s.root.startswith("file://"):
            result.sources[s.name] = None
            result.notes.append(f"{s.name}: {s.root} is remote, read as it is (not prepared)")
            continue
        result.sources[s.name] = prepare(s.root, **per_source)
    if result.ok and sizes:
        from episodekit.prepare_steps import plan_options

        result.plans = mixture_plans(
            spec, out, sizes, opts.num_workers, plan_options(opts, opts.split_long == "yes")
        )
    return result


def mixture_plans(
    spec: MixtureSpec,
    out: str | os.PathLike,
    world_sizes: list[int],
    num_workers: int,
    options: PlanOptions | None = None,
    **kw: Any,
) -> list[tuple[str, dict, bool]]:
    """The one call of ``ensure_mixture_plans`` (``metadata plan --mixture``, ``prepare
    --mixture``)."""
    from episodekit.metadata.mixture.plan import ensure_mixture_plans

    return ensure_mixture_plans(spec, out, world_sizes, num_workers, options, **kw)


def format_mixture_result(r: MixturePrepareResult) -> str:
    from episodekit.metadata.mixture.plan import format_mixture_plan

    lines = []
    for name, res in r.sources.items():
        lines.append(f"== source {name}")
        lines.append(format_result(res) if res is not None else "  not prepared (remote)")
    for note in r.notes:
        lines.append(f"note: {note}")
    for warning in r.warnings:
        lines.append(f"warning: {warning}")
    for path, plan, changed in r.plans:
        lines.append(f"{path}: {'written' if changed else 'fresh, kept'}")
        lines.append(format_mixture_plan(plan))
    if not r.ok:
        lines.append("mixture plans NOT written: a source failed validation")
    elif not r.plans:
        lines.append("no mixture plan written: every --world-size was skipped (see the warnings)")
    return "\n".join(lines)
