"""A Markdown report of a validation run (``validate --report report.md``) that a CI job can
attach: a summary table, then per check its count, the worst findings (episode, feature,
dimension, measured value) and a unicode sparkline of the offending signal; optional small PNG
plots (``--plots DIR``, needs matplotlib: ``pip install episodekit[plots]``). A metadata-only
or sampled run says under the verdict what it did not read and which checks it did not run.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

from episodekit.core.atomic import atomic_write_text
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.words import plural
from episodekit.validate.raw import ERROR, Finding

BARS = "▁▂▃▄▅▆▇█"
WORST = 10  # findings listed per check


def sparkline(values: Sequence[float | None]) -> str:
    """``[0, 1, 2]`` -> ``▁▄█`` (None / non-finite values become a space)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return ""
    lo, hi = min(finite), max(finite)
    scale = (len(BARS) - 1) / (hi - lo) if hi > lo else 0.0
    return "".join(
        " " if v is None or not math.isfinite(v) else BARS[int(round((v - lo) * scale))]
        for v in values
    )


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _where(f: Finding) -> str:
    parts = []
    if f.episode is not None:
        parts.append(f"episode {f.episode}")
    if f.feature:
        parts.append(f.feature if f.dimension is None else f"{f.feature}[{f.dimension}]")
    if not parts and f.file:
        parts.append(f.file)
    return ", ".join(parts) or "dataset"


def _value(v: float | None) -> str:
    if v is None:
        return ""
    return f"{v:.4g}"


def plot_name(f: Finding, k: int) -> str:
    base = f"{f.check}-{k:02d}"
    if f.episode is not None:
        base += f"-ep{f.episode}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", base) + ".png"


def format_markdown(
    report, checks: dict[str, str] | None = None, plots: dict[int, str] | None = None
) -> str:
    """The report as Markdown (``checks``: id -> description, default the registry's);
    ``plots`` maps ``id(finding)`` to an image path to link. With a baseline, the findings it
    holds are marked and its gone entries listed."""
    from episodekit.validate.checks import REGISTRY, get

    if checks is None:
        checks = {c.id: c.description for c in REGISTRY}
    plots = plots or {}
    n_err, n_warn = len(report.errors), len(report.warnings)
    verdict = "FAILED" if report.exit_code() else "OK"
    lines = [
        f"# Validation report: `{report.root}`",
        "",
        f"**{verdict}**: {plural(n_err, 'error')}, {plural(n_warn, 'warning')}; "
        f"{plural(len(report.checks_run), 'check')} "
        f"in {report.seconds:.1f} s" + (" (warnings fail)" if report.strict else "") + ".",
        "",
        *_scope_md(report),
    ]
    by_check: dict[str, list[Finding]] = {}
    for f in report.findings:
        by_check.setdefault(f.check, []).append(f)
    if not by_check:
        lines.append("No findings.")
        return "\n".join(lines + _baseline_lines(report)) + "\n"
    order = [c for c in checks if c in by_check] + [c for c in by_check if c not in checks]
    lines += ["| check | severity | count | what it guards against |", "|---|---|---:|---|"]
    for check in order:
        items = by_check[check]
        sev = ERROR if any(f.severity == ERROR for f in items) else items[0].severity
        count = len(items) + sum(
            int((f.details or {}).get("more", 0)) - 1
            for f in items
            if (f.details or {}).get("more")
        )
        known = sum(not report.is_new(f) for f in items) if hasattr(report, "is_new") else 0
        shown = f"{count} ({known} in the baseline)" if known else str(count)
        lines.append(f"| `{check}` | {sev} | {shown} | {_cell(checks.get(check, ''))} |")
    for check in order:
        items = by_check[check]
        lines += ["", f"## `{check}`", ""]
        if check in checks:
            lines += [f"{_cell(checks[check])} (help: `{get(check).help}`)", ""]
        lines += ["| where | value | message | signal |", "|---|---:|---|---|"]
        for f in items[:WORST]:
            d = f.details or {}
            spark = sparkline(d.get("signal") or [])
            cell = f"`{spark}`" if spark else ""
            if id(f) in plots:
                cell += f" [plot]({plots[id(f)]})"
            known = hasattr(report, "is_new") and not report.is_new(f)
            msg = ("(in the baseline) " if known else "") + f.message
            lines.append(f"| {_cell(_where(f))} | {_value(f.value)} | {_cell(msg)} | {cell} |")
        if len(items) > WORST:
            lines.append(f"| ... | | {len(items) - WORST} more (see `--json`) | |")
    return "\n".join(lines + _baseline_lines(report)) + "\n"


def _scope_md(report) -> list[str]:
    """What a metadata-only or sampled run read and left out (nothing for a full run)."""
    from episodekit.validate.scope import FULL, scope_lines

    mode = getattr(report, "scope", FULL)
    if mode == FULL:
        return []
    return [f"Scope: **{mode}**.", "", *[f"- {_cell(line)}" for line in scope_lines(report)], ""]


def _baseline_lines(report) -> list[str]:
    """The baseline section: counts, and the entries no longer found."""
    base = getattr(report, "baseline", None)
    if base is None:
        return []
    b = base.to_dict(report.findings)
    lines = [
        "",
        "## Baseline",
        "",
        f"`{_cell(b['file'])}`: {b['known']} findings known (they do not fail), {b['new']} new, "
        f"{len(b['gone'])} gone.",
    ]
    if base.gone:
        lines += ["", "| gone | where |", "|---|---|"]
        lines += [f"| `{e.check}` | {_cell(e.where())} |" for e in base.gone[: WORST * 5]]
        if len(base.gone) > WORST * 5:
            lines.append(f"| ... | {len(base.gone) - WORST * 5} more |")
    return lines


def write_plots(report, folder: str | Path, per_check: int = 3) -> dict[int, str]:
    """Small PNG plots of the offending signal of the worst findings per check; returns
    ``id(finding) -> path``. Raises ImportError when matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    check_output_dir(folder)  # the caller checked it against the root, before validating
    mark_output_dir(folder, "validate --plots")
    out: dict[int, str] = {}
    counts: dict[str, int] = {}
    for f in report.findings:
        signal = (f.details or {}).get("signal")
        if not signal or counts.get(f.check, 0) >= per_check:
            continue
        k = counts[f.check] = counts.get(f.check, 0) + 1
        path = folder / plot_name(f, k)
        fig, ax = plt.subplots(figsize=(4, 1.6), dpi=80)
        ax.plot(range(len(signal)), [math.nan if v is None else v for v in signal], lw=1)
        ax.set_title(f"{f.check}: {_where(f)}", fontsize=8)
        ax.tick_params(labelsize=6)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        out[id(f)] = str(path)
    return out


def write_markdown(report, checks: dict[str, str] | None, path: str | Path, plots_dir=None) -> str:
    """Write the Markdown report atomically (plots first when ``plots_dir``); returns a note
    for the user when plots were asked for but matplotlib is missing, else ''."""
    plots, note = {}, ""
    if plots_dir is not None:
        try:
            here = Path(path).resolve().parent
            plots = {
                k: os.path.relpath(Path(v).resolve(), here)
                for k, v in write_plots(report, plots_dir).items()
            }
        except ImportError:
            note = "plots skipped: matplotlib is not installed (pip install 'episodekit[plots]')"
    atomic_write_text(Path(path), format_markdown(report, checks, plots))
    return note
