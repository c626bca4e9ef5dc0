"""CLI: ``episodekit validate ROOT`` — a thin shell over :func:`episodekit.validate.runner`."""

from __future__ import annotations

import os
import sys

import click

from episodekit.cli.common import (
    RootProblem,
    check_root,
    classify,
    executor_option,
    json_option,
    quiet_option,
)
from episodekit.core import jsonout
from episodekit.core.errors import EXIT_DATA, EXIT_ENV


@click.command("validate")
@click.argument("root", required=False)
@json_option
@click.option("--strict", is_flag=True, help="Warnings (layout quality) fail too.")
@click.option(
    "--checks",
    default="all",
    show_default=True,
    help="Comma-separated groups or ids to run; '-name' excludes. Groups: info, tasks, episodes, "
    "data, layout, speed, costs, plans, quality; aliases: all, artifacts. E.g. 'all,-layout' or "
    "'data.rows,info'.",
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
    "report_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write a Markdown report (counts, worst episodes, signal sparklines) here.",
)
@click.option(
    "--plots",
    "plots_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="With --report: small PNG plots of offending signals here (needs episodekit[plots]).",
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
    strict: bool,
    checks: str,
    deep: bool,
    executor: str,
    examples: int,
    list_checks: bool,
    fail_on: str,
    quality_thresholds: str | None,
    min_length: int | None,
    report_path: str | None,
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

    Exit codes: 0 clean (warnings allowed unless --strict / --fail-on warning), 1 findings
    that fail (an unreadable info.json too), 2 could not run (bad usage, no such root, the
    environment), 130 interrupted (Ctrl-C), 143 terminated (SIGTERM).
    """
    from episodekit.validate.runner import (
        CHECKS,
        CannotValidate,
        format_annotations,
        format_report,
        select_checks,
        validate,
    )

    if list_checks:
        click.echo("\n".join(f"{k:<22} {v}" for k, v in CHECKS.items()))
        return
    if root is None:
        raise click.UsageError("missing argument ROOT")
    try:  # the shared ROOT check, here so that --json can still answer in JSON
        check_root(click.get_current_context(), None, root)
    except RootProblem as exc:
        _cannot_validate(root, exc.format_message(), as_json, EXIT_ENV)
    try:
        select_checks(checks, deep=deep)
    except ValueError as exc:
        _json_usage(root, f"--checks: {exc}", as_json)
        raise click.BadParameter(str(exc), param_hint="--checks") from exc
    _check_plots(root, report_path, plots_dir, as_json)
    scope = _scope(root, metadata_only, sample_episodes, sample_seed, as_json)
    from episodekit.validate.quality import ThresholdsError, load_thresholds

    try:
        thresholds = load_thresholds(quality_thresholds, min_length=min_length)
    except ThresholdsError as exc:
        _json_usage(root, f"--quality-thresholds: {exc}", as_json)
        raise click.BadParameter(str(exc), param_hint="--quality-thresholds") from exc
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
            scope=scope,
        )
    except CannotValidate as exc:  # info.json unreadable: the data is at fault (exit 1)
        cause = exc.__cause__
        known = classify(cause) if isinstance(cause, OSError) else None
        code = EXIT_ENV if known and known[0] == EXIT_ENV else EXIT_DATA
        _cannot_validate(root, str(exc), as_json, code)
    if report_path:
        from episodekit.validate.report import write_markdown

        note = write_markdown(report, CHECKS, report_path, plots_dir)
        if note:
            click.echo(note, err=True)
    click.echo(report.to_json() if as_json else format_report(report, examples))
    if os.environ.get("GITHUB_ACTIONS") == "true" and report.findings:
        # stdout normally; stderr with --json so the JSON stays parseable (the runner reads both).
        click.echo(format_annotations(report), err=as_json)
    sys.exit(report.exit_code())


def _check_plots(root: str, report_path: str | None, plots_dir: str | None, as_json: bool) -> None:
    """``--plots DIR``: only with ``--report``, and DIR follows the rule of every output folder
    (missing, empty or episodekit's, never in or around ROOT), checked before validating."""
    if plots_dir and not report_path:
        _json_usage(root, "--plots needs --report", as_json)
        raise click.UsageError("--plots needs --report (the plots are linked from the report)")
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
