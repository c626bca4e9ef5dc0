"""The passes of ``episodekit validate``: which code produces which checks, in the order a run
takes them.

Each :class:`Pass` names the check ids it reports and a function of the run's :class:`Context`;
the runner (:func:`episodekit.validate.runner.validate`) takes every pass one of whose checks is
selected, in :data:`PASSES` order, and keeps only the selected checks' findings. The checks
themselves (title, severity, description) are in :mod:`episodekit.validate.checks`; a test keeps
the ids the passes declare equal to the registry's. A new check: its line in the registry, its
id in the pass that reports it.

A run's :class:`~episodekit.validate.scope.Scope` narrows what the passes read: on metadata only
(``--metadata-only``) the data pass reads no page, the quality pass judges the tables alone and
the video pass reads each mp4's boxes; with ``--sample-episodes`` the data pass reads the row
groups of the sampled episodes. The checks a scope cannot run are not in ``want`` at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from episodekit.core import interrupt
from episodekit.core.memory import release_memory
from episodekit.core.words import plural
from episodekit.validate.checks import ids
from episodekit.validate.raw import ERROR, Finding, RawRoot
from episodekit.validate.scope import Scope


@dataclass
class Context:
    """What the passes of one run share: the raw root, the selection (less what the scope
    cannot run), the options, what the run reads (``scope``; ``sample``: the sampled episodes),
    the notes on what was not judged, and what one pass read that another needs (the data
    files' schemas, the artifacts' dataset), read once on first use."""

    raw: RawRoot
    want: set[str]
    deep: bool = False
    executor: str = "local"
    thresholds: dict[str, float] | None = None
    say: Callable[[str], None] = lambda _: None
    found: list[Finding] = field(default_factory=list)
    scope: Scope = field(default_factory=Scope)
    sample: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _schemas: dict | None = None
    _dataset: Any = None

    @cached_property
    def rels(self) -> list[str]:
        """The data files the episodes reference that stay inside the root (the others are
        ``info.paths`` errors and are never read)."""
        from episodekit.validate.meta import unsafe_reason

        return [
            r
            for r in self.raw.data_files()
            if not r.startswith("<") and unsafe_reason(self.raw, r) is None
        ]

    def schemas(self) -> dict:
        """Each readable data file's schema (relative path -> schema), read once; unreadable
        files become ``data.read`` findings of the run."""
        if self._schemas is None:
            from episodekit.validate.data import read_schemas

            self._schemas, problems = read_schemas(self.raw, self.rels)
            self.found += problems
        return self._schemas

    def dataset(self) -> Any:
        """The root as a Dataset for the artifact checks (None when its tables are broken)."""
        if self._dataset is None:
            from episodekit.validate.artifacts import dataset_from_raw

            self._dataset = (dataset_from_raw(self.raw),)
        return self._dataset[0]


@dataclass(frozen=True)
class Pass:
    """One piece of a run: the ``checks`` it reports and how (``run``); ``progress`` names
    what it does on the progress line."""

    name: str
    checks: tuple[str, ...]
    run: Callable[[Context], list[Finding]]
    progress: Callable[[Context], str | None] | None = None

    def wanted(self, want: set[str]) -> bool:
        return not want.isdisjoint(self.checks)


def _metadata(ctx: Context) -> list[Finding]:
    from episodekit.validate import meta

    raw = ctx.raw
    out: list[Finding] = []
    for check in (
        meta.check_version,
        meta.check_fps,
        meta.check_totals,
        meta.check_tasks_table,
        meta.check_episode_index,
        meta.check_ranges,
        meta.check_episode_tasks,
    ):
        out += check(raw)
    return out


def _paths(ctx: Context) -> list[Finding]:
    from episodekit.validate.meta import check_paths

    return check_paths(ctx.raw)


def _unreferenced(ctx: Context) -> list[Finding]:
    from episodekit.validate.meta import check_unreferenced

    return check_unreferenced(ctx.raw)


def _declared(ctx: Context) -> list[Finding]:
    from episodekit.validate.declared import check_declared

    return check_declared(ctx.raw)


def _features(ctx: Context) -> list[Finding]:
    from episodekit.validate.meta import check_features

    return check_features(ctx.raw, ctx.schemas())


def _data(ctx: Context) -> list[Finding]:
    """The data scan's findings: every readable file, or on a narrower scope the row groups of
    the sampled episodes (metadata only: none, nothing read)."""
    from episodekit.validate.data import compare

    schemas = ctx.schemas()
    if not ctx.scope.full:
        return _sampled_data(ctx, schemas)
    agg, problems = _scan_data(ctx.raw, schemas, ctx.deep, ctx.executor)
    out = list(problems)
    if agg is not None:
        out += compare(ctx.raw, agg, set(schemas) - {p.file for p in problems})
    del agg
    release_memory()  # the scan's per-episode frames: give them back before the next pass
    return out


def _sampled_data(ctx: Context, schemas: dict) -> list[Finding]:
    """The data checks on the row groups holding ``ctx.sample``'s episodes (their notes go to
    ``ctx.notes``)."""
    from episodekit.validate.data import compare
    from episodekit.validate.scope import scan_sample

    if not ctx.sample:
        return []
    agg, problems, notes, read = scan_sample(ctx.raw, schemas, ctx.sample, ctx.deep)
    ctx.notes += notes
    if agg is not None:
        problems += compare(ctx.raw, agg, read, only=ctx.sample)
    return problems


def _data_progress(ctx: Context) -> str | None:
    if ctx.scope.full:
        return f"scanning {plural(len(ctx.schemas()), 'data file')}"
    if ctx.sample:
        return f"scanning the row groups of {plural(len(ctx.sample), 'sampled episode')}"
    return None


def _scan_data(raw: RawRoot, schemas: dict, deep: bool, executor: str):
    """The data scan; when one file breaks the all-files query (a readable footer over corrupt
    pages), scan file by file so the others are still checked and the broken one is reported."""
    from episodekit.validate import data as checks_data

    try:
        return checks_data.scan_root(raw, schemas, deep=deep, executor=executor), []
    except Exception:  # noqa: BLE001 - narrowed below, file by file
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        if len(schemas) < 1:
            raise
    parts, problems = [], []
    for rel, schema in schemas.items():
        try:
            agg = checks_data.scan_root(raw, {rel: schema}, deep=deep, executor="local")
        except Exception as exc:  # noqa: BLE001 - any reader failure is the file's fault
            interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
            problems.append(Finding("data.read", ERROR, f"unreadable data: {exc}", rel))
            continue
        if agg is not None:
            parts.append(agg)
    if not parts:
        return None, problems
    import polars as pl

    return pl.concat(parts, how="diagonal_relaxed"), problems


def _images(ctx: Context) -> list[Finding]:
    from episodekit.validate.declared import check_images

    return check_images(ctx.raw, list(ctx.schemas()))


def _language(ctx: Context) -> list[Finding]:
    from episodekit.validate.language import check_language

    return check_language(ctx.raw, list(ctx.schemas()))


def _quality(ctx: Context) -> list[Finding]:
    """The ``quality.*`` pass over every readable data file; on a narrower scope, the checks
    the episodes and tasks tables decide (no data file read)."""
    from episodekit.validate.quality import check_quality, check_quality_metadata

    if not ctx.scope.full:
        return check_quality_metadata(ctx.raw, ctx.want, ctx.thresholds)
    return check_quality(
        ctx.raw, list(ctx.schemas()), ctx.want, ctx.thresholds, executor=ctx.executor
    )


def _quality_progress(ctx: Context) -> str | None:
    if not ctx.scope.full:
        return None
    return f"data-quality checks over {plural(len(ctx.schemas()), 'data file')}"


def _layout(ctx: Context) -> list[Finding]:
    from episodekit.validate.layout import check_layout

    raw = ctx.raw
    return check_layout(raw, [r for r in ctx.rels if raw.fs.exists(raw.join(r))])


def _videos(ctx: Context) -> list[Finding]:
    from episodekit.validate.video import check_videos

    # Narrower scopes: each mp4's boxes only (no frame); what they do not settle is a note.
    return check_videos(ctx.raw, ctx.want, deep=ctx.deep, boxes=not ctx.scope.full, notes=ctx.notes)


def _speed(ctx: Context) -> list[Finding]:
    from episodekit.validate.artifacts import check_speed

    return check_speed(ctx.raw, ctx.dataset())


def _costs(ctx: Context) -> list[Finding]:
    from episodekit.validate.artifacts import check_costs

    return check_costs(ctx.raw, ctx.dataset())


def _plans(ctx: Context) -> list[Finding]:
    from episodekit.validate.artifacts import check_plans

    return check_plans(ctx.raw, ctx.dataset())


def _stats(ctx: Context) -> list[Finding]:
    from episodekit.validate.stats import check_stats

    deep = "stats.recompute" in ctx.want
    return check_stats(ctx.raw, deep=deep, executor=ctx.executor, ds=ctx.dataset())


DATA_SCAN = (
    "data.read",
    "data.file",
    "data.rows",
    "data.frame_index",
    "data.index",
    "data.timestamp",
    "data.task_index",
    "data.nulls",
    "data.nan",
    "data.order",
    "data.shape",
    "data.image",
    "info.fps",  # the data's timestamps against fps
)

PASSES: tuple[Pass, ...] = (
    Pass(
        "metadata",
        (
            "info.version",
            "info.fps",
            "info.totals",
            "tasks.table",
            "episodes.read",
            "episodes.index",
            "episodes.ranges",
            "episodes.length",
            "episodes.tasks",
        ),
        _metadata,
    ),
    Pass("paths", ("info.paths", "info.videos"), _paths),
    Pass("unreferenced", ("info.unreferenced",), _unreferenced),
    Pass("declared", ("info.names", "info.video"), _declared),
    Pass("features", ("info.features",), _features),
    Pass("data", DATA_SCAN, _data, _data_progress),
    Pass("images", ("data.image_shape",), _images),
    Pass("language", ("data.language",), _language),
    Pass("quality", ids("quality"), _quality, _quality_progress),
    Pass("layout", ids("layout"), _layout, lambda c: f"reading {plural(len(c.rels), 'footer')}"),
    Pass("video", ids("video"), _videos, lambda c: "checking videos"),
    Pass("speed", ids("speed"), _speed, lambda c: "checking artifacts"),
    Pass("costs", ids("costs"), _costs),
    Pass("plans", ids("plans"), _plans),
    Pass("stats", ids("stats"), _stats, lambda c: "checking normalization stats"),
)


def run_passes(ctx: Context) -> list[Finding]:
    """Every pass one of whose checks is selected, in order; returns the selected checks'
    findings (``ctx.found`` holds what was found before, e.g. while reading the root)."""
    for p in PASSES:
        if not p.wanted(ctx.want):
            continue
        said = p.progress(ctx) if p.progress is not None else None
        if said:
            ctx.say(said)
        found = p.run(ctx)  # may add to ctx.found itself (the schemas' data.read findings)
        ctx.found += found
    return [f for f in ctx.found if f.check in ctx.want]


def produced() -> set[str]:
    """Every check id some pass reports (the registry must list exactly these)."""
    return {c for p in PASSES for c in p.checks}
