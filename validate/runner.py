"""``episodekit validate``: CI-grade validation of a dataset root and of every artifact.

:func:`validate` runs the checks (metadata, one duckdb scan of the data files, footers, artifacts)
and returns a :class:`Report` of :class:`Finding` s, each with a check id, a severity, a message
and, where relevant, the file (relative to the root) and the episode. It reads the root piece by
piece instead of through ``open_dataset`` so that a broken root yields *all* its problems, and it
never writes: files are opened read-only and duckdb runs in memory.

Exit codes (:meth:`Report.exit_code`): 0 clean (warnings allowed unless strict), 1 findings that
fail, 2 could not run (raised as :class:`CannotValidate`, or a bad ``checks`` selection).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from episodekit.core import interrupt, jsonout
from episodekit.core.memory import release_memory
from episodekit.core.words import plural
from episodekit.validate.declared import CHECKS as DECLARED_CHECKS
from episodekit.validate.declared import DEEP_ONLY as DECLARED_DEEP_ONLY
from episodekit.validate.language import CHECKS as LANGUAGE_CHECKS
from episodekit.validate.quality import CHECKS as QUALITY_CHECKS
from episodekit.validate.raw import ERROR, WARNING, CannotValidate, Finding, RawRoot, read_raw
from episodekit.validate.scope import (
    FULL,
    Scope,
    partial_checks,
    scan_sample,
    settle,
    skipped_checks,
)
from episodekit.validate.video import CHECKS as VIDEO_CHECKS
from episodekit.validate.video import DEEP_ONLY as VIDEO_DEEP_ONLY

__all__ = [
    "CHECKS",
    "GROUPS",
    "CannotValidate",
    "Finding",
    "Report",
    "select_checks",
    "validate",
    "format_report",
    "format_annotations",
]

JSON_VERSION = 1


def _declared(prefix: str) -> dict[str, str]:
    """The checks of :mod:`episodekit.validate.declared` in group ``prefix`` (listed with it)."""
    return {k: v for k, v in DECLARED_CHECKS.items() if k.startswith(prefix)}


# Every check id and what it guards against (the ids findings carry).
CHECKS: dict[str, str] = {
    "info.version": "codebase_version is one episodekit reads",
    "info.fps": "fps is positive, matches video fps and the data's timestamps",
    "info.totals": "total_episodes / total_frames / total_tasks match the tables",
    "info.features": "declared features exist in every data file with matching dtype/shape",
    "info.paths": "path templates are plain and stay inside the root; referenced data files exist",
    "info.videos": "every video file the episodes reference exists",
    "info.unreferenced": "no data file is left unreferenced",
    **_declared("info."),
    "tasks.table": "tasks table readable, task_index 0..T-1, distinct task strings",
    "episodes.read": "episodes files readable with the required columns",
    "episodes.index": "episode_index is 0..N-1 in order",
    "episodes.ranges": "dataset_from_index / dataset_to_index contiguous from 0",
    "episodes.length": "length == dataset_to_index - dataset_from_index > 0",
    "episodes.tasks": "every episode's task strings are in the tasks table",
    "data.read": "data files are readable parquet",
    "data.file": "every data row belongs to an episode placed in that file",
    "data.rows": "rows per episode == length",
    "data.frame_index": "frame_index is 0..length-1",
    "data.index": "index is contiguous and equals the episode's range",
    "data.timestamp": "timestamp == frame_index / fps within tolerance",
    "data.task_index": "task_index valid and equal to the episode's task",
    "data.nulls": "no nulls in feature columns (nor inside their lists)",
    "data.nan": "no NaN/inf in float feature columns",
    "data.order": "rows in each file are in index order (index = the row's place in its range)",
    "data.shape": "list lengths match the declared shape",
    "data.image": "(--deep) image bytes start with a known image header",
    **_declared("data."),
    **LANGUAGE_CHECKS,
    "layout.row_groups": "row groups inside the target band (warning)",
    "layout.split_episode": "no episode split across row groups (warning)",
    "layout.page_index": "page index written (warning)",
    "speed.format": "speed_percentiles.jsonl parses, has version, one row per task",
    "speed.fresh": "speed_percentiles.jsonl fingerprint matches the episodes",
    "speed.content": "ascending boundaries, null exactly for sparse tasks, matches recomputation",
    "costs.format": "episode_costs.parquet readable with the documented columns",
    "costs.fresh": "episode_costs.parquet fingerprint matches the episodes",
    "costs.content": "one row per episode, figures match a recomputation",
    "plans.format": "shard plans readable",
    "plans.fresh": "shard plan fingerprints match the episodes",
    "plans.content": "every episode assigned exactly once, balance figures match",
    **VIDEO_CHECKS,
    **_declared("video."),
    **QUALITY_CHECKS,
    "stats.present": "meta/stats.json and per-episode stats/<feature>/<key> columns present",
    "stats.finite": "every stats value finite",
    "stats.shape": "stats shapes match the features (count: [1])",
    "stats.order": "min <= q01 <= q10 <= q50 <= q90 <= q99 <= max, min <= mean <= max",
    "stats.count": "count equals the frames (dataset and per episode)",
    "stats.consistent": "dataset min/max/mean/std/count match the merged per-episode stats "
    "(|a-b| <= 1e-6*|b| + 1e-9*(1+scale))",
    "stats.fresh": "stats summary fingerprint and data-file state match the root",
    "stats.recompute": "(--deep) every stat matches a recomputation from the data "
    "(|a-b| <= 1e-6*|b| + 1e-9*(1+scale))",
    "stats.quantile_rank": "(--deep, warning) stats.json's quantiles are within 0.01 in rank of "
    "the data's",
}
GROUPS = (
    "info",
    "tasks",
    "episodes",
    "data",
    "layout",
    "speed",
    "costs",
    "plans",
    "stats",
    "video",
    "quality",
)
ALIASES = {"all": GROUPS, "artifacts": ("speed", "costs", "plans")}
DEEP_ONLY = (
    "data.image",
    "stats.recompute",
    "stats.quantile_rank",
    *VIDEO_DEEP_ONLY,
    *DECLARED_DEEP_ONLY,
)


def select_checks(names: Iterable[str] | str | None = None, deep: bool = False) -> list[str]:
    """Check ids selected by group names, ids or aliases (``all``, ``artifacts``); a leading
    ``-`` excludes (``"all,-layout"``). ``None`` selects all. Raises ValueError on unknown names."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    names = list(names or [])
    include = [n for n in names if not n.startswith("-")]
    exclude = [n[1:] for n in names if n.startswith("-")]
    if not include:
        include = ["all"]

    def expand(name: str) -> set[str]:
        groups = ALIASES.get(name, (name,))
        ids = {c for c in CHECKS if c in groups or c.split(".", 1)[0] in groups}
        if not ids:
            raise ValueError(
                f"unknown check {name!r}; use a group ({', '.join(GROUPS)}), "
                f"'all', 'artifacts' or an id like data.rows"
            )
        return ids

    chosen: set[str] = set().union(*(expand(n) for n in include))
    for n in exclude:
        chosen -= expand(n)
    if not deep:
        chosen -= set(DEEP_ONLY)
    return [c for c in CHECKS if c in chosen]


@dataclass
class Report:
    """Findings of one validation run."""

    root: str
    findings: list[Finding] = field(default_factory=list)
    checks_run: list[str] = field(default_factory=list)
    seconds: float = 0.0
    strict: bool = False
    fingerprint: str | None = None  # the episodes judged (None: unreadable episodes table)
    # What was read (:mod:`episodekit.validate.scope`): the mode, the sampled episodes, the
    # checks not run and the ones run in part (id -> why), and notes on what was not judged.
    scope: str = FULL
    seed: int | None = None
    sample: list[int] | None = None
    checks_skipped: dict[str, str] = field(default_factory=dict)
    checks_partial: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    def exit_code(self, strict: bool | None = None) -> int:
        """0 when clean (warnings pass unless ``strict``), 1 when something fails."""
        strict = self.strict if strict is None else strict
        return 1 if self.errors or (strict and self.warnings) else 0

    def to_dict(self) -> dict[str, Any]:
        out = {
            "version": JSON_VERSION,
            "root": self.root,
            "fingerprint": self.fingerprint,
            "ok": self.exit_code() == 0,
            "exit_code": self.exit_code(),
            "strict": self.strict,
            "seconds": round(self.seconds, 3),
            "counts": {ERROR: len(self.errors), WARNING: len(self.warnings)},
            "checks_run": list(self.checks_run),
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.scope != FULL:  # a full run's document is unchanged
            out["scope"] = {"mode": self.scope, "seed": self.seed, "sample_episodes": self.sample}
        for key in ("checks_skipped", "checks_partial", "notes"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    def to_json(self) -> str:
        """The report as JSON (schema: see :meth:`to_dict`)."""
        return jsonout.dumps(self.to_dict(), indent=2)


def _noop(_: str) -> None:
    pass


def validate(
    root: str,
    checks: Iterable[str] | str | None = None,
    deep: bool = False,
    strict: bool = False,
    executor: str = "local",
    progress: Callable[[str], None] | None = None,
    quality_thresholds: dict[str, float] | None = None,
    scope: Scope | None = None,
) -> Report:
    """Validate ``root`` (local path or fsspec URL) and its artifacts; never modifies it.

    ``checks`` selects groups/ids (see :func:`select_checks`); ``deep`` adds the image-header
    check (and video decoding); ``executor="ray"`` scans data files one ray task per file
    (the data scan and the ``quality.*`` pass).
    ``quality_thresholds`` overrides :data:`episodekit.validate.quality.DEFAULTS` for the
    ``quality.*`` checks (warnings).
    ``scope`` (:class:`~episodekit.validate.scope.Scope`): metadata only, or plus a sample's
    data pages, instead of everything; the checks it does not run are in the report.
    Raises :class:`CannotValidate` when the root or its info.json cannot be read.
    """
    from episodekit.validate import artifacts as checks_artifacts
    from episodekit.validate import data as checks_data
    from episodekit.validate import declared as checks_declared
    from episodekit.validate import language as checks_language
    from episodekit.validate import layout as checks_layout
    from episodekit.validate import meta as checks_meta
    from episodekit.validate import stats as checks_stats
    from episodekit.validate import video as checks_video

    say = progress or _noop
    t0 = time.perf_counter()
    selected = select_checks(checks, deep=deep)
    scope = scope or Scope()
    skipped = skipped_checks(scope, selected)
    want = set(selected) - set(skipped)
    notes: list[str] = []

    def wants(*prefixes: str) -> bool:
        return any(c.startswith(prefixes) for c in want)

    say(f"reading metadata of {root}")
    raw: RawRoot = read_raw(root)
    sample = settle(scope, raw, want, skipped)
    found: list[Finding] = list(raw.findings)
    found += checks_meta.check_version(raw)
    found += checks_meta.check_fps(raw)
    found += checks_meta.check_totals(raw)
    found += checks_meta.check_tasks_table(raw)
    found += checks_meta.check_episode_index(raw)
    found += checks_meta.check_ranges(raw)
    found += checks_meta.check_episode_tasks(raw)
    if wants("info.paths", "info.videos"):
        found += checks_meta.check_paths(raw)
    if wants("info.unreferenced"):
        found += checks_meta.check_unreferenced(raw)
    found += checks_declared.check_declared(raw)
    # Only files that stay inside the root are read (the others are info.paths errors).
    rels = [
        r
        for r in raw.data_files()
        if not r.startswith("<") and checks_meta.unsafe_reason(raw, r) is None
    ]
    schemas: dict = {}
    if wants("info.features", "data", "info.fps", "quality"):
        schemas, problems = checks_data.read_schemas(raw, rels)
        found += problems
        found += checks_meta.check_features(raw, schemas)
        if wants("data", "info.fps"):
            found += _data_findings(raw, schemas, sample if not scope.full else None, deep,
                                    executor, say, notes)  # fmt: skip
        if "data.image_shape" in want:
            found += checks_declared.check_images(raw, list(schemas))
        found += checks_language.check_language(raw, list(schemas)) if wants("data.lang") else []
    if wants("quality"):
        found += _quality_findings(raw, schemas, want, scope, quality_thresholds, executor, say)
    if wants("layout"):
        say(f"reading {plural(len(rels), 'footer')}")
        found += checks_layout.check_layout(raw, [r for r in rels if raw.fs.exists(raw.join(r))])
    if wants("video"):
        say("checking videos")
        found += checks_video.check_videos(raw, want, deep=deep, boxes=not scope.full, notes=notes)
    if wants("speed", "costs", "plans"):
        say("checking artifacts")
        found += checks_artifacts.check_artifacts(raw, want)
    if wants("stats"):
        say("checking normalization stats")
        found += checks_stats.check_stats(raw, deep="stats.recompute" in want, executor=executor)
    ran = [c for c in selected if c in want]
    return Report(
        root=str(root),
        findings=[f for f in found if f.check in want],
        checks_run=ran,
        seconds=time.perf_counter() - t0,
        strict=strict,
        fingerprint=raw.fingerprint(),
        **_scope_fields(scope, sample, selected, ran, skipped, notes),
    )


def _scope_fields(scope: Scope, sample: list[int], selected: list[str], ran: list[str],
                  skipped: dict[str, str], notes: list[str]) -> dict[str, Any]:  # fmt: skip
    """The :class:`Report` fields saying what a run read and left out."""
    return {
        "scope": scope.mode,
        "seed": None if scope.sample is None else scope.seed,
        "sample": None if scope.sample is None else sample,
        "checks_skipped": {c: skipped[c] for c in selected if c in skipped},
        "checks_partial": partial_checks(scope, ran, len(sample)),
        "notes": notes,
    }


def _quality_findings(
    raw: RawRoot,
    schemas: dict,
    want: set[str],
    scope: Scope,
    thresholds: dict[str, float] | None,
    executor: str,
    say: Callable[[str], None],
) -> list[Finding]:
    """The ``quality.*`` findings: the pass over every readable data file, or on metadata only
    the checks the episodes and tasks tables decide."""
    from episodekit.validate import quality as checks_quality

    if not scope.full:
        return checks_quality.check_quality_metadata(raw, want, thresholds)
    say(f"data-quality checks over {plural(len(schemas), 'data file')}")
    return checks_quality.check_quality(raw, list(schemas), want, thresholds, executor=executor)


def _data_findings(
    raw: RawRoot,
    schemas: dict,
    sample: list[int] | None,
    deep: bool,
    executor: str,
    say: Callable[[str], None],
    notes: list[str],
) -> list[Finding]:
    """The data scan's findings: every readable file (``sample`` None), else the row groups of
    the ``sample`` episodes (none: nothing read); its notes go to ``notes``."""
    from episodekit.validate import data as checks_data

    if sample is None:
        say(f"scanning {plural(len(schemas), 'data file')}")
        agg, problems = _scan_data(raw, schemas, deep, executor)
        if agg is not None:
            problems += checks_data.compare(raw, agg, set(schemas) - {p.file for p in problems})
        del agg
        release_memory()  # the scan's per-episode frames: give them back before the next
        return problems
    if not sample:
        return []
    say(f"scanning the row groups of {plural(len(sample), 'sampled episode')}")
    agg, problems, more, read = scan_sample(raw, schemas, sample, deep)
    notes += more
    if agg is not None:
        problems += checks_data.compare(raw, agg, read, only=sample)
    return problems


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


def format_report(report: Report, examples: int = 5) -> str:
    """Human table grouped by check: counts, then the first ``examples`` findings of each."""
    n = plural(len(report.checks_run), "check")
    mode = "" if report.scope == FULL else f", {report.scope}"
    lines = [f"validate {report.root}  ({report.seconds:.1f}s, {n}{mode})"]
    by_check: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_check.setdefault(f.check, []).append(f)
    if by_check:
        lines.append(f"{'check':<22} {'severity':<8} {'count':>6}  description")
    for check in [c for c in CHECKS if c in by_check]:
        items = by_check[check]
        sev = ERROR if any(f.severity == ERROR for f in items) else WARNING
        lines.append(f"{check:<22} {sev:<8} {len(items):>6}  {CHECKS[check]}")
        for f in items[:examples]:
            where = f.file or ""
            if f.episode is not None:
                where += f" episode {f.episode}"
            lines.append(f"    {where}: {f.message}" if where else f"    {f.message}")
        if len(items) > examples:
            lines.append(f"    ... {len(items) - examples} more (use --json for all)")
    lines += _scope_lines(report)
    n_err, n_warn = len(report.errors), len(report.warnings)
    verdict = "FAILED" if report.exit_code() else "OK"
    strict = " (strict: warnings fail)" if report.strict and n_warn else ""
    lines.append(f"{verdict}: {plural(n_err, 'error')}, {plural(n_warn, 'warning')}{strict}")
    return "\n".join(lines)


def _scope_lines(report: Report) -> list[str]:
    """What a metadata-only or sampled run read and left out (nothing for a full run)."""
    out = []
    if report.sample is not None:
        more = ", ..." if len(report.sample) > 20 else ""
        shown = ", ".join(map(str, report.sample[:20])) + more
        out.append(f"sampled {plural(len(report.sample), 'episode')} (seed {report.seed}): {shown}")
    for label, checks in (("not run", report.checks_skipped), ("run on", report.checks_partial)):
        by_reason: dict[str, list[str]] = {}
        for check, why in checks.items():
            by_reason.setdefault(why, []).append(check)
        out += [f"{label} {why}: {', '.join(ids)}" for why, ids in by_reason.items()]
    return out + [f"note: {note}" for note in report.notes]


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def format_annotations(report: Report) -> str:
    """GitHub Actions workflow commands (``::error file=...,title=...::message``), one a line."""
    lines = []
    for f in report.findings:
        level = "error" if f.severity == ERROR or report.strict else "warning"
        props = []
        if f.file:
            props.append(f"file={_escape_prop(os.path.join(report.root, f.file))}")
        props.append(f"title={_escape_prop(f.check)}")
        msg = f.message if f.episode is None else f"episode {f.episode}: {f.message}"
        lines.append(f"::{level} {','.join(props)}::{_escape_data(msg)}")
    return "\n".join(lines)
