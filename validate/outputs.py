"""Every output format of a validation run, from one :class:`~episodekit.validate.runner.Report`.

``--format FORMAT`` prints one on stdout; ``--report FORMAT:PATH`` (repeatable) writes them to
files, atomically. A bare ``--report PATH`` is a Markdown report (what it always was).

| format | what | module |
|---|---|---|
| text | the table grouped by check | :func:`episodekit.validate.runner.format_report` |
| json | the findings as JSON | :meth:`episodekit.validate.runner.Report.to_json` |
| github | workflow annotations (+ the step summary) | :mod:`episodekit.validate.github` |
| sarif | SARIF 2.1.0 | :mod:`episodekit.validate.sarif` |
| junit | JUnit XML | :mod:`episodekit.validate.junit` |
| markdown | the Markdown report | :mod:`episodekit.validate.report` |
| html | a self-contained page with plots (files only) | :mod:`episodekit.validate.html` |
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from episodekit.core.atomic import atomic_write_text

if TYPE_CHECKING:
    from episodekit.validate.runner import Report

FORMATS = ("text", "json", "github", "sarif", "junit", "markdown")
REPORT_FORMATS = (*FORMATS, "html")


def parse_report(spec: str) -> tuple[str, str]:
    """``FORMAT:PATH`` -> (format, path); a path without a known format prefix is Markdown.
    Raises ValueError on an empty path."""
    fmt, sep, path = spec.partition(":")
    if not sep or fmt not in REPORT_FORMATS:
        fmt, path = "markdown", spec
    if not path:
        raise ValueError(f"{spec!r}: no path after '{fmt}:'")
    return fmt, path


def render(report: Report, fmt: str, examples: int = 5) -> str:
    """``report`` in ``fmt`` (one of :data:`FORMATS`) as text."""
    if fmt == "text":
        from episodekit.validate.runner import format_report

        return format_report(report, examples) + "\n"
    if fmt == "json":
        return report.to_json() + "\n"
    if fmt == "github":
        from episodekit.validate.github import format_annotations
        from episodekit.validate.runner import format_report

        lines = format_annotations(report)
        return (lines + "\n" if lines else "") + format_report(report, examples) + "\n"
    if fmt == "sarif":
        from episodekit.validate.sarif import format_sarif

        return format_sarif(report)
    if fmt == "junit":
        from episodekit.validate.junit import format_junit

        return format_junit(report)
    if fmt == "markdown":
        from episodekit.validate.report import format_markdown

        return format_markdown(report)
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def write_report(
    report: Report, fmt: str, path: str | Path, plots_dir: str | None = None, examples: int = 5
) -> str:
    """Write ``report`` in ``fmt`` to ``path`` atomically; returns a note for the user ('' or
    why plots are missing). ``plots_dir``: PNG plots linked from a Markdown report."""
    if fmt == "html":
        from episodekit.validate.html import write_html

        return write_html(report, path)
    if fmt == "markdown":
        from episodekit.validate.report import write_markdown

        return write_markdown(report, None, path, plots_dir)
    atomic_write_text(Path(path), render(report, fmt, examples))
    return ""
