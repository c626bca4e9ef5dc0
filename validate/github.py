"""GitHub Actions output: workflow annotations and the job's step summary.

GitHub shows at most 10 error and 10 warning annotations per step and drops the rest, so
:func:`annotations` spends those 10 + 10 on the most information: errors (what fails) first,
every check represented, each check's findings grouped into one annotation with their count,
files and episodes when they do not all fit. Findings a baseline holds are not annotated; one
notice counts them; a metadata-only or sampled run gets one notice saying what it did not
run (the step summary lists the checks and why). :func:`append_step_summary` appends the
Markdown report to the file ``$GITHUB_STEP_SUMMARY`` names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from episodekit.validate import checks as registry
from episodekit.validate.raw import Finding
from episodekit.validate.scope import FULL

if TYPE_CHECKING:
    from episodekit.validate.runner import Report

SLOTS = 10  # annotations GitHub shows per level and step
EPISODES_SHOWN = 12  # episodes named in a grouped annotation


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def annotation_path(root: str, rel: str) -> str:
    """The path an annotation names: ``rel`` under ``root``, relative to
    ``$GITHUB_WORKSPACE`` when it lies inside it (GitHub links repository paths)."""
    path = os.path.join(root, rel)
    workspace = os.environ.get("GITHUB_WORKSPACE")
    if workspace and "://" not in path:
        try:
            rel_ws = os.path.relpath(os.path.abspath(path), os.path.abspath(workspace))
        except ValueError:  # another drive
            return path
        if not rel_ws.startswith(".."):
            return rel_ws
    return path


def _command(level: str, report: Report, f: Finding, title: str, message: str) -> str:
    props = []
    if f.file:
        props.append(f"file={_escape_prop(annotation_path(report.root, f.file))}")
        line = report.line(f)
        if line is not None:
            props.append(f"line={line}")
    props.append(f"title={_escape_prop(title)}")
    return f"::{level} {','.join(props)}::{_escape_data(message)}"


def _episode_message(f: Finding) -> str:
    return f.message if f.episode is None else f"episode {f.episode}: {f.message}"


def _single(level: str, report: Report, f: Finding) -> str:
    return _command(level, report, f, f.check, _episode_message(f))


def _group(level: str, report: Report, items: list[Finding], more: bool) -> str:
    """One annotation for several findings of one check: count, files, episodes, the first
    message and the check's help."""
    check = registry.get(items[0].check)
    n = len(items)
    files = sorted({f.file for f in items if f.file})
    episodes = sorted({f.episode for f in items if f.episode is not None})
    parts = [f"{n}{' more' if more else ''} findings"]
    if len(files) > 1:
        parts.append(f"in {len(files)} files")
    if episodes:
        shown = ", ".join(str(e) for e in episodes[:EPISODES_SHOWN])
        rest = len(episodes) - EPISODES_SHOWN
        parts.append(f"episodes {shown}" + (f" (+{rest} more)" if rest > 0 else ""))
    first = items[0]
    message = f"{', '.join(parts)}. First: {_episode_message(first)}"
    if check.description:
        message += f"\n{check.title}: {check.description} ({check.help})"
    title = f"{check.id} ({n}{' more' if more else ''} findings)"
    return _command(level, report, first, title, message)


def _rest(level: str, report: Report, by_check: dict[str, list[Finding]]) -> str:
    """The last slot when there are more checks than slots: the other checks and counts."""
    n = sum(len(v) for v in by_check.values())
    counts = ", ".join(f"{c} ({len(v)})" for c, v in by_check.items())
    first = next(iter(by_check.values()))[0]
    message = f"{n} more findings of {len(by_check)} more checks: {counts}"
    return _command(level, report, first, f"{len(by_check)} more checks ({n} findings)", message)


def _level_annotations(
    level: str, report: Report, findings: list[Finding], slots: int
) -> list[str]:
    """At most ``slots`` annotations for ``findings`` (one level), in registry order."""
    if len(findings) <= slots:
        return [_single(level, report, f) for f in findings]
    by_check = registry.group_by_check(findings)
    checks = list(by_check)
    if len(checks) > slots:
        own, rest = checks[: slots - 1], checks[slots - 1 :]
        out = [_group(level, report, by_check[c], False) for c in own]
        return out + [_rest(level, report, {c: by_check[c] for c in rest})]
    alloc = dict.fromkeys(checks, 1)
    spare = slots - len(checks)
    while spare > 0:  # one more slot to each check that has findings left, in turn
        takers = [c for c in checks if alloc[c] < len(by_check[c])]
        if not takers:
            break
        for c in takers[:spare]:
            alloc[c] += 1
        spare -= min(spare, len(takers))
    out = []
    for c in checks:
        items = by_check[c]
        if alloc[c] >= len(items):
            out += [_single(level, report, f) for f in items]
        else:
            k = alloc[c] - 1
            out += [_single(level, report, f) for f in items[:k]]
            out.append(_group(level, report, items[k:], more=k > 0))
    return out


def annotations(report: Report, slots: int = SLOTS) -> list[str]:
    """GitHub workflow commands for ``report``: at most ``slots`` ``::error`` (findings that
    fail) and ``slots`` ``::warning`` (the others), errors first, plus one ``::notice`` for
    the findings a baseline holds and its entries that are gone, and one for a metadata-only
    or sampled run's scope."""
    new = [f for f in report.sorted_findings() if report.is_new(f)]
    errors = [f for f in new if report.fails(f)]
    warnings = [f for f in new if not report.fails(f)]
    out = _level_annotations("error", report, errors, slots)
    out += _level_annotations("warning", report, warnings, slots)
    if report.baseline is not None:
        b = report.baseline.to_dict(report.findings)
        if b["known"] or b["gone"]:
            msg = (
                f"{b['known']} findings are in the baseline {b['file']} and do not fail; "
                f"{len(b['gone'])} of its entries are gone"
            )
            out.append(f"::notice title=episodekit baseline::{_escape_data(msg)}")
    if report.scope != FULL:
        msg = f"{report.scope} run: {len(report.checks_skipped)} checks not run"
        if report.checks_partial:
            msg += f", {len(report.checks_partial)} run in part"
        if report.sample is not None:
            msg += f"; {len(report.sample)} episodes sampled (seed {report.seed})"
        msg += f": {', '.join(report.checks_skipped)}" if report.checks_skipped else ""
        out.append(f"::notice title=episodekit {_escape_prop(report.scope)}::{_escape_data(msg)}")
    return out


def format_annotations(report: Report) -> str:
    """GitHub Actions workflow commands (``::error file=...,title=...::message``), one a line
    (see :func:`annotations`)."""
    return "\n".join(annotations(report))


def append_step_summary(report: Report, path: str | os.PathLike) -> None:
    """Append the Markdown report to the step summary file ``path``
    (``$GITHUB_STEP_SUMMARY``; GitHub renders it on the run's page)."""
    from episodekit.validate.report import format_markdown

    with Path(path).open("a", encoding="utf-8") as fh:
        fh.write(format_markdown(report) + "\n")
