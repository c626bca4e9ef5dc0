"""``episodekit validate``: CI-grade validation of a dataset root and of every artifact.

:func:`validate` runs the checks (metadata, one duckdb scan of the data files, footers, artifacts)
and returns a :class:`Report` of :class:`Finding` s, each with a check id, a severity, a message
and, where relevant, the file (relative to the root) and the episode. It reads the root piece by
piece instead of through ``open_dataset`` so that a broken root yields *all* its problems, and it
never writes: files are opened read-only and duckdb runs in memory. The checks are the
registry's (:mod:`episodekit.validate.checks`); the passes that report them, in run order, are
:mod:`episodekit.validate.passes`; every output format reads the one :class:`Report`
(:mod:`episodekit.validate.outputs`). A :class:`~episodekit.validate.scope.Scope` reads less
(``--metadata-only``, ``--sample-episodes``); the report says what it left out.

Exit codes (:meth:`Report.exit_code`): 0 clean (warnings allowed unless strict, findings a
baseline holds pass), 1 findings that fail, 2 could not run (raised as :class:`CannotValidate`,
or a bad ``checks`` selection).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from episodekit.core import jsonout
from episodekit.core.paths import INFO_FILE
from episodekit.core.words import plural
from episodekit.validate import checks as registry
from episodekit.validate.baseline import BaselineDiff
from episodekit.validate.checks import ALIASES, DEEP_ONLY, GROUPS, group_by_check
from episodekit.validate.github import format_annotations
from episodekit.validate.locate import InfoLines
from episodekit.validate.raw import ERROR, WARNING, CannotValidate, Finding, RawRoot, read_raw
from episodekit.validate.scope import (
    FULL,
    Scope,
    partial_checks,
    scope_lines,
    settle,
    skipped_checks,
)

__all__ = [
    "ALIASES",
    "CHECKS",
    "DEEP_ONLY",
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

# Every check id and what it guards against (from the registry, episodekit.validate.checks).
CHECKS: dict[str, str] = {c.id: c.description for c in registry.REGISTRY}


def _names(names: Iterable[str] | str | None) -> list[str]:
    if isinstance(names, str):
        names = names.split(",")
    return [n.strip() for n in names or [] if n.strip()]


def select_checks(
    names: Iterable[str] | str | None = None,
    deep: bool = False,
    ignore: Iterable[str] | str | None = None,
) -> list[str]:
    """Check ids selected by group names, ids or aliases (``all``, ``artifacts``), minus
    ``ignore`` (the same kinds of names); a leading ``-`` in ``names`` excludes too
    (``"all,-layout"``). ``None`` selects all. Raises ValueError on unknown names."""
    names = _names(names)
    include = [n for n in names if not n.startswith("-")] or ["all"]
    exclude = [n[1:] for n in names if n.startswith("-")] + [n.lstrip("-") for n in _names(ignore)]
    chosen: set[str] = set().union(*(registry.expand(n) for n in include))
    for n in exclude:
        chosen -= registry.expand(n)
    if not deep:
        chosen -= set(DEEP_ONLY)
    return [c for c in CHECKS if c in chosen]


@dataclass
class Report:
    """Findings of one validation run (and, after :meth:`apply_baseline`, which of them a
    baseline already holds)."""

    root: str
    findings: list[Finding] = field(default_factory=list)
    checks_run: list[str] = field(default_factory=list)
    seconds: float = 0.0
    strict: bool = False
    fingerprint: str | None = None  # the episodes judged (None: unreadable episodes table)
    baseline: BaselineDiff | None = None
    info_text: str | None = field(default=None, repr=False)  # meta/info.json as read
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

    def is_new(self, f: Finding) -> bool:
        """False for a finding the baseline holds (it does not fail); True otherwise."""
        return self.baseline is None or not self.baseline.is_known(f)

    def fails(self, f: Finding, strict: bool | None = None) -> bool:
        """Whether ``f`` fails the run: new, and an error (or a warning when strict)."""
        strict = self.strict if strict is None else strict
        return self.is_new(f) and (f.severity == ERROR or strict)

    def exit_code(self, strict: bool | None = None) -> int:
        """0 when clean (warnings pass unless ``strict``, findings in the baseline pass),
        1 when something fails."""
        return 1 if any(self.fails(f, strict) for f in self.findings) else 0

    def apply_baseline(self, entries: list, path: str) -> None:
        """Judge the findings against a baseline's entries (:func:`baseline.load`). Only the
        checks run in full can tell an entry gone (not one run in part: a sample, footers)."""
        from episodekit.validate.baseline import compare

        whole = [c for c in self.checks_run if c not in self.checks_partial]
        self.baseline = compare(self.findings, whole, entries, path)

    def sorted_findings(self) -> list[Finding]:
        """Most severe first (failing, then errors, then warnings), registry order inside."""
        order = {c: i for i, c in enumerate(CHECKS)}
        return sorted(
            self.findings,
            key=lambda f: (
                not self.fails(f),
                registry.SEVERITY_RANK.get(f.severity, 2),
                order.get(f.check, len(order)),
            ),
        )

    def line(self, f: Finding) -> int | None:
        """The line of info.json ``f`` points at (None for other files)."""
        if f.file != INFO_FILE:
            return None
        if "_lines" not in self.__dict__:
            self.__dict__["_lines"] = InfoLines(self.info_text)
        return self.__dict__["_lines"].line(f)

    def to_dict(self) -> dict[str, Any]:
        findings = []
        for f in self.findings:
            d = f.to_dict()
            if self.baseline is not None:
                d["baseline"] = "new" if self.is_new(f) else "known"
            findings.append(d)
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
            "findings": findings,
        }
        if self.baseline is not None:
            out["baseline"] = self.baseline.to_dict(self.findings)
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
    ignore: Iterable[str] | str | None = None,
    scope: Scope | None = None,
) -> Report:
    """Validate ``root`` (local path or fsspec URL) and its artifacts; never modifies it.

    ``checks`` selects groups/ids and ``ignore`` leaves some out (see :func:`select_checks`);
    ``deep`` adds the image-header check (and video decoding); ``executor="ray"`` scans data
    files one ray task per file (the data scan and the ``quality.*`` pass).
    ``quality_thresholds`` overrides :data:`episodekit.validate.quality.DEFAULTS` for the
    ``quality.*`` checks (warnings). The passes that run are those reporting a selected check
    (:mod:`episodekit.validate.passes`).
    ``scope`` (:class:`~episodekit.validate.scope.Scope`): metadata only, or plus a sample's
    data pages, instead of everything; the checks it does not run are in the report.
    Raises :class:`CannotValidate` when the root or its info.json cannot be read.
    """
    from episodekit.validate.passes import Context, run_passes

    say = progress or _noop
    t0 = time.perf_counter()
    selected = select_checks(checks, deep=deep, ignore=ignore)
    scope = scope or Scope()
    skipped = skipped_checks(scope, selected)
    want = set(selected) - set(skipped)
    say(f"reading metadata of {root}")
    raw: RawRoot = read_raw(root)
    sample = settle(scope, raw, want, skipped)  # may move info.unreferenced to skipped
    ctx = Context(
        raw,
        want,
        deep=deep,
        executor=executor,
        thresholds=quality_thresholds,
        say=say,
        found=list(raw.findings),
        scope=scope,
        sample=sample,
    )
    findings = run_passes(ctx)
    ran = [c for c in selected if c in want]
    return Report(
        root=str(root),
        findings=findings,
        checks_run=ran,
        seconds=time.perf_counter() - t0,
        strict=strict,
        fingerprint=raw.fingerprint(),
        info_text=raw.info_text,
        **_scope_fields(scope, sample, selected, ran, skipped, ctx.notes),
    )


def _scope_fields(
    scope: Scope,
    sample: list[int],
    selected: list[str],
    ran: list[str],
    skipped: dict[str, str],
    notes: list[str],
) -> dict[str, Any]:
    """The :class:`Report` fields saying what a run read and left out."""
    return {
        "scope": scope.mode,
        "seed": None if scope.sample is None else scope.seed,
        "sample": None if scope.sample is None else sample,
        "checks_skipped": {c: skipped[c] for c in selected if c in skipped},
        "checks_partial": partial_checks(scope, ran, len(sample)),
        "notes": notes,
    }


def format_report(report: Report, examples: int = 5) -> str:
    """Human table grouped by check: counts, then the first ``examples`` findings of each;
    with a baseline, which findings it holds and which of its entries are gone."""
    n = plural(len(report.checks_run), "check")
    mode = "" if report.scope == FULL else f", {report.scope}"
    lines = [f"validate {report.root}  ({report.seconds:.1f}s, {n}{mode})"]
    by_check = group_by_check(report.findings)
    if by_check:
        lines.append(f"{'check':<22} {'severity':<8} {'count':>6}  description")
    for check, items in by_check.items():
        sev = ERROR if any(f.severity == ERROR for f in items) else WARNING
        known = sum(not report.is_new(f) for f in items)
        what = CHECKS.get(check, "") + (f" ({known} in the baseline)" if known else "")
        lines.append(f"{check:<22} {sev:<8} {len(items):>6}  {what}")
        for f in items[:examples]:
            where = f.file or ""
            if f.episode is not None:
                where += f" episode {f.episode}"
            mark = "" if report.is_new(f) else "(baseline) "
            lines.append(f"    {mark}{where}: {f.message}" if where else f"    {mark}{f.message}")
        if len(items) > examples:
            lines.append(f"    ... {len(items) - examples} more (use --json for all)")
    if report.baseline is not None:
        b = report.baseline.to_dict(report.findings)
        lines.append(
            f"baseline {b['file']}: {b['known']} known (do not fail), {b['new']} new, "
            f"{len(b['gone'])} gone"
        )
        for e in report.baseline.gone[:examples]:
            lines.append(f"    gone: {e.check} {e.where()}")
        if len(report.baseline.gone) > examples:
            lines.append(f"    ... {len(report.baseline.gone) - examples} more gone")
    lines += scope_lines(report)
    n_err, n_warn = len(report.errors), len(report.warnings)
    verdict = "FAILED" if report.exit_code() else "OK"
    strict = " (strict: warnings fail)" if report.strict and n_warn else ""
    lines.append(f"{verdict}: {plural(n_err, 'error')}, {plural(n_warn, 'warning')}{strict}")
    return "\n".join(lines)
