"""CLI: ``episodekit validate ROOT`` — a thin shell over :func:`episodekit.validate.runner`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from episodekit.cli.common import (
    RootProblem,
    check_root,
    classify,
    executor_option,
    json_option,
    quiet_option,
)
from episodekit.cli.meta import META_JSON
from episodekit.core import jsonout
from episodekit.core.errors import EXIT_DATA, EXIT_ENV
from episodekit.validate.outputs import FORMATS


@click.command("validate")
@click.argument("root", required=False)
@json_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default=None,
    help="What to print: text (the default), json (same as --json), github (annotations; the "
    "Markdown report is appended to $GITHUB_STEP_SUMMARY when set), sarif, junit, markdown.",
)
@click.option("--strict", is_flag=True, help="Warnings (layout quality) fail too.")
@click.option(
    "--select",
    "--checks",
    "checks",
    default="all",
    show_default=True,
    help="Comma-separated groups or ids to run; '-name' excludes. Groups: info, tasks, episodes, "
    "data, layout, speed, costs, plans, video, quality, stats; aliases: all, artifacts. E.g. "
    "'all,-layout' or 'data.rows,info'.",
)
@click.option(
    "--ignore",
    default=None,
    help="Comma-separated groups or ids left out of the selection, e.g. 'layout,quality.drift'.",
)
@click.option("--deep", is_flag=True, help="Also check list lengths and image byte headers.")
@executor_option
@click.option(
    "--examples",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="Examples shown per check.",
)
@click.option("--list-checks", is_flag=True, help="List every check id and exit.")
@click.option(
    "--fail-on",
    type=click.Choice(["error", "warning"]),
    default="error",
    show_default=True,
    help="Lowest severity that fails (exit 1); 'warning' is --strict, e.g. for CI on quality.",
)
@click.option(
    "--baseline",
    type=click.Path(dir_okay=False),
    default=None,
    help="A baseline file (--write-baseline): its findings do not fail, new ones do, and its "
    "entries no longer found are reported as gone.",
)
@click.option(
    "--write-baseline",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write this run's findings to FILE as a baseline; they then do not fail this run.",
)
@click.option(
    "--quality-thresholds",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="JSON or TOML file overriding quality.* thresholds (names: see README).",
)
@click.option(
    "--min-length",
    type=click.IntRange(min=0),
    default=None,
    help="quality.short_episode: warn on episodes shorter than N frames (default off).",
)
@click.option(
    "--report",
    "reports",
    multiple=True,
    metavar="[FORMAT:]PATH",
    help="Also write a report to PATH (repeatable). FORMAT: text, json, github, sarif, junit, "
    "markdown (a bare PATH) or html (one self-contained page with plots).",
)
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="With a Markdown --report: small PNG plots of offending signals here (needs "
    "episodekit[plots]).",
)
@click.option(
    "--metadata-only",
    is_flag=True,
    help="Read meta/, the parquet footers and the mp4 boxes only (range reads on a hub or HTTP "
    "root; no data page, no video frame); the checks that need more are listed as not run.",
)
@click.option(
    "--sample-episodes",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="As --metadata-only, plus the data checks on N episodes whose row groups are read: the "
    "first, the last and N-2 picked by a hash seeded with --sample-seed (the same every run).",
)
@click.option(
    "--sample-seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of --sample-episodes' choice.",
)
@quiet_option
def validate_command(
    root: str | None,
    as_json: bool,
    fmt: str | None,
    strict: bool,
    checks: str,
    ignore: str | None,
    deep: bool,
    executor: str,
    examples: int,
    list_checks: bool,
    fail_on: str,
    baseline: str | None,
    write_baseline: str | None,
    quality_thresholds: str | None,
    min_length: int | None,
    reports: tuple[str, ...],
    plots_dir: str | None,
    metadata_only: bool,
    sample_episodes: int | None,
    sample_seed: int,
) -> None:
    """Validate a dataset ROOT (path or fsspec URL) and every artifact under it; never writes.

    Checks info.json against the episodes/tasks tables and the files, the episodes table itself,
    every data row (one duckdb scan: rows, index, frame_index, timestamp, task_index, nulls,
    NaN), row-group layout quality, and the speed/cost/shard-plan artifacts. Findings name the
    check, file and episode. With GITHUB_ACTIONS=true, also prints workflow annotations.

    Data-quality checks (quality.*, warnings): frozen or jumping actions/states, out-of-range
    and clipped values, dead dimensions, dropped frames, odd episode lengths, duplicates,
    placeholder or rare tasks, distribution shift.

    Settings in ROOT/episodekit.toml ([validate]: select, ignore, fail-on, baseline) apply
    unless the same option is given here.

    On a hub or HTTP root in CI, --metadata-only reads meta/, the parquet footers and the mp4
    boxes only, and --sample-episodes N adds the data checks on N episodes; the checks they do
    not run are listed as not run, in every format.

    Exit codes: 0 clean (warnings allowed unless --strict / --fail-on warning; findings in
    --baseline pass), 1 findings that fail (an unreadable info.json too), 2 could not run (bad
    usage, no such root, the environment), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """
    from episodekit.validate.runner import CannotValidate, validate

    if list_checks:
        _list_checks()
        return
    if root is None:
        raise click.UsageError("missing argument ROOT")
    ctx = click.get_current_context()
    if as_json and fmt not in (None, "json"):
        raise click.UsageError(f"--json prints JSON; it cannot go with --format {fmt}")
    as_json = as_json or fmt == "json"
    fmt = "json" if as_json else (fmt or "text")
    if as_json:
        ctx.meta[META_JSON] = True  # no progress lines (as --json)
    try:  # the shared ROOT check, here so that --json can still answer in JSON
        check_root(ctx, None, root)
    except RootProblem as exc:
        _cannot_validate(root, exc.format_message(), as_json, EXIT_ENV)
    opts = _with_config(ctx, root, checks, ignore, fail_on, baseline, as_json)
    checks, ignore, fail_on, baseline = opts
    _check_selection(root, checks, ignore, deep, as_json)
    outputs = _report_specs(root, reports, write_baseline, as_json)
    _check_plots(root, [p for f, p in outputs if f == "markdown"], plots_dir, as_json)
    scope = _scope(root, metadata_only, sample_episodes, sample_seed, as_json)
    entries = _read_baseline(root, baseline, write_baseline, as_json)
    thresholds = _thresholds(root, quality_thresholds, min_length, as_json)
    strict = strict or fail_on == "warning"

    from episodekit.core.progress import current

    def progress(msg: str) -> None:
        current().stage("validate")
        current().step(msg)

    try:
        report = validate(
            root,
            checks=checks,
            deep=deep,
            strict=strict,
            executor=executor,
            progress=progress,
            quality_thresholds=thresholds,
            ignore=ignore,
            scope=scope,
        )
    except CannotValidate as exc:  # info.json unreadable: the data is at fault (exit 1)
        cause = exc.__cause__
        known = classify(cause) if isinstance(cause, OSError) else None
        code = EXIT_ENV if known and known[0] == EXIT_ENV else EXIT_DATA
        _cannot_validate(root, str(exc), as_json, code)
    _judge_and_write(root, report, baseline, entries, write_baseline, outputs, plots_dir, as_json)
    _emit(root, report, fmt, examples, as_json)
    sys.exit(report.exit_code())


def _check_selection(root: str, checks: str, ignore: str | None, deep: bool, as_json: bool):
    """``--select`` and ``--ignore`` name known checks (else exit 2 naming the option)."""
    from episodekit.validate.runner import select_checks

    for param, names in (("--select", checks), ("--ignore", ignore)):
        try:
            select_checks(names, deep=deep)
        except ValueError as exc:
            _json_usage(root, f"{param}: {exc}", as_json)
            raise click.BadParameter(str(exc), param_hint=param) from exc


def _thresholds(root: str, path: str | None, min_length: int | None, as_json: bool):
    """The quality.* thresholds: the defaults, ``--quality-thresholds`` and ``--min-length``."""
    from episodekit.validate.quality import ThresholdsError, load_thresholds

    try:
        return load_thresholds(path, min_length=min_length)
    except ThresholdsError as exc:
        _json_usage(root, f"--quality-thresholds: {exc}", as_json)
        raise click.BadParameter(str(exc), param_hint="--quality-thresholds") from exc


def _list_checks() -> None:
    """``--list-checks``: every check of the registry, one a line."""
    from episodekit.validate.checks import REGISTRY

    for c in REGISTRY:
        deep_note = " (--deep)" if c.deep else ""
        click.echo(f"{c.id:<24} {c.severity:<7} {c.description}{deep_note}")


def _emit(root: str, report, fmt: str, examples: int, as_json: bool) -> None:
    """Print ``report`` in ``fmt``; with ``github``, append the Markdown report to
    $GITHUB_STEP_SUMMARY when set; under GitHub Actions, annotations with any other format."""
    from episodekit.validate.outputs import render

    click.echo(render(report, fmt, examples), nl=False)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if fmt == "github" and summary:
        from episodekit.validate.github import append_step_summary

        _guard_write(root, "$GITHUB_STEP_SUMMARY", as_json, append_step_summary, report, summary)
    if os.environ.get("GITHUB_ACTIONS") == "true" and fmt != "github" and report.findings:
        from episodekit.validate.github import format_annotations

        # stdout for the text table; stderr for machine formats so stdout stays parseable.
        click.echo(format_annotations(report), err=fmt != "text")


def _with_config(
    ctx: click.Context,
    root: str,
    checks: str,
    ignore: str | None,
    fail_on: str,
    baseline: str | None,
    as_json: bool,
) -> tuple[str, str | None, str, str | None]:
    """The options with ROOT/episodekit.toml's [validate] keys for those not given here."""
    from click.core import ParameterSource

    from episodekit.validate.config import ConfigError, load_config

    try:
        cfg = load_config(root)
    except ConfigError as exc:
        _cannot_validate(root, str(exc), as_json, EXIT_ENV)

    def given(name: str) -> bool:
        return ctx.get_parameter_source(name) not in (
            ParameterSource.DEFAULT,
            ParameterSource.DEFAULT_MAP,
        )

    if cfg.select is not None and not given("checks"):
        checks = ",".join(cfg.select)
    if cfg.ignore is not None and not given("ignore"):
        ignore = ",".join(cfg.ignore)
    if cfg.fail_on is not None and not given("fail_on"):
        fail_on = cfg.fail_on
    if cfg.baseline is not None and baseline is None:
        baseline = cfg.baseline
    return checks, ignore, fail_on, baseline


def _report_specs(
    root: str, reports: tuple[str, ...], write_baseline: str | None, as_json: bool
) -> list[tuple[str, str]]:
    """``--report`` values as (format, path), each path writable (its folder exists, it is not
    a folder, no two outputs share it), checked before validating."""
    from episodekit.validate.outputs import parse_report

    out, seen = [], set()
    named = [("--report", r) for r in reports]
    if write_baseline:
        named.append(("--write-baseline", f"json:{write_baseline}"))
    for option, spec in named:
        try:
            fmt, path = parse_report(spec)
        except ValueError as exc:
            _json_usage(root, f"{option}: {exc}", as_json)
            raise click.BadParameter(str(exc), param_hint=option) from exc
        p = Path(path)
        problem = None
        if p.is_dir():
            problem = f"{path} is a folder"
        elif not p.resolve().parent.is_dir():
            problem = f"{path}: no such folder {p.parent}"
        elif p.resolve() in seen:
            problem = f"{path} is named twice"
        if problem:
            _json_usage(root, f"{option}: {problem}", as_json)
            raise click.BadParameter(problem, param_hint=option)
        seen.add(p.resolve())
        if option == "--report":
            out.append((fmt, path))
    return out


def _read_baseline(
    root: str, baseline: str | None, write_baseline: str | None, as_json: bool
) -> list | None:
    """The baseline's entries (None without one); a baseline that does not exist yet is none
    when this run writes it (--write-baseline names the same file: its first write)."""
    if baseline is None:
        return None
    from episodekit.validate.baseline import BaselineError, load

    if not Path(baseline).exists() and write_baseline:
        if Path(write_baseline).resolve() == Path(baseline).resolve():
            return None
    try:
        return load(baseline)
    except BaselineError as exc:
        _cannot_validate(root, f"--baseline: {exc}", as_json, EXIT_ENV)
    return None


def _judge_and_write(
    root: str,
    report,
    baseline: str | None,
    entries: list | None,
    write_baseline: str | None,
    outputs: list[tuple[str, str]],
    plots_dir: str | None,
    as_json: bool,
) -> None:
    """Judge the findings against the baseline, write the new baseline (whose findings then
    pass, unless --baseline judges them), then every --report."""
    from episodekit.validate import baseline as bl
    from episodekit.validate.outputs import write_report

    if entries is not None and baseline is not None:
        report.apply_baseline(entries, baseline)
    if write_baseline:
        _guard_write(root, write_baseline, as_json, bl.write, write_baseline, report.findings)
        if entries is None:
            report.apply_baseline(sorted({bl.entry(f) for f in report.findings}), write_baseline)
    for fmt, path in outputs:
        note = _guard_write(root, path, as_json, write_report, report, fmt, path, plots_dir)
        if note:
            click.echo(note, err=True)


def _guard_write(root: str, what: str, as_json: bool, fn, *args):
    """``fn(*args)``; a write that fails (disk full, no permission) is one line, exit 2."""
    try:
        return fn(*args)
    except OSError as exc:
        _cannot_validate(root, f"cannot write {what}: {exc.strerror or exc}", as_json, EXIT_ENV)


def _check_plots(root: str, markdown: list[str], plots_dir: str | None, as_json: bool) -> None:
    """``--plots DIR``: only with a Markdown ``--report``, and DIR follows the rule of every
    output folder (missing, empty or episodekit's, never in or around ROOT), checked before
    validating."""
    if plots_dir and not markdown:
        _json_usage(root, "--plots needs --report", as_json)
        raise click.UsageError(
            "--plots needs --report (a Markdown report: the plots are linked from it)"
        )
    if plots_dir:
        from episodekit.core.outdir import UnsafeOutputError, check_output_dir

        try:
            check_output_dir(plots_dir, sources=[root])
        except UnsafeOutputError as exc:
            _cannot_validate(root, str(exc), as_json, EXIT_ENV)


def _scope(root: str, metadata_only: bool, sample: int | None, seed: int, as_json: bool):
    """What the run reads (:class:`~episodekit.validate.scope.Scope`); ``--sample-seed`` only
    with ``--sample-episodes``."""
    from episodekit.validate.scope import Scope

    if seed != 0 and sample is None:
        _json_usage(root, "--sample-seed needs --sample-episodes", as_json)
        raise click.UsageError("--sample-seed needs --sample-episodes (it seeds their choice)")
    return Scope(metadata_only=metadata_only, sample=sample, seed=seed)


def _json_usage(root: str, message: str, as_json: bool, code: int = EXIT_ENV) -> None:
    """With --json, the JSON document of an error that stops validation (before its line)."""
    if as_json:
        doc = {"version": 1, "root": root, "ok": False, "exit_code": code, "error": message}
        click.echo(jsonout.dumps(doc, indent=2))


def _cannot_validate(root: str, message: str, as_json: bool, code: int) -> None:
    """Nothing could be validated: one line on stderr, exit ``code`` (2: no such root or the
    environment; 1: its info.json is broken); with --json also a JSON document on stdout
    (--json always prints JSON)."""
    _json_usage(root, message, as_json, code)
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)
