"""CLI: `episodekit prep rowgroups`, a thin shell over episodekit.prep.rewrite_rowgroups."""

from __future__ import annotations

import json
import sys

import click

from episodekit.cli.common import (
    EpisodekitGroup,
    deprecated_alias,
    executor_option,
    force_option,
    jobs_option,
    json_option,
    pick,
    quiet_option,
    root_argument,
    target_mb_option,
)
from episodekit.core.paths import COMPRESSIONS


@click.group("prep", cls=EpisodekitGroup)
def prep_group() -> None:
    """Rewrite the dataset's own files for streaming readers (data parquet row groups)."""


@prep_group.command("rowgroups")
@root_argument()
@target_mb_option
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Write a complete copy of the dataset (meta/ too) here instead of rewriting in place. "
    "Required when ROOT is remote (hf://..., any fsspec URL).",
)
@jobs_option
@deprecated_alias("--workers", "--jobs", "workers", type=click.IntRange(min=1), default=None)
@executor_option
@click.option(
    "--compression",
    type=click.Choice(COMPRESSIONS),
    default="keep",
    show_default=True,
    help="Output codec; keep = the source file's codec.",
)
@click.option("--dry-run", is_flag=True, help="Report what would be rewritten; change nothing.")
@force_option
@click.option("--copy-videos", is_flag=True, help="With --out: copy videos/ too.")
@json_option
@quiet_option
def rowgroups_command(
    root: str,
    target_mb: float,
    out: str | None,
    jobs: int | None,
    workers: int | None,
    executor: str,
    compression: str,
    dry_run: bool,
    force: bool,
    copy_videos: bool,
    as_json: bool,
) -> None:
    """Rewrite ROOT's data parquet into episode-aligned row groups with a page index.

    Same rows, order, schema (and its `huggingface` metadata) and file paths; row groups of about
    --target-mb MiB uncompressed that never split an episode; column + offset page index and
    statistics; `index` declared as the sorting column. Each rewritten file is verified against
    its source (row count, schema, per-column value checksums) before it atomically replaces
    anything; a file that fails is reported and left untouched, and the exit code is 1. Files
    already done (same target, or already within the band) are skipped, so reruns are cheap.

    ROOT is a local path or an fsspec URL (then use --out DIR).
    """
    from episodekit.core.progress import current
    from episodekit.prep import format_report, rewrite_rowgroups

    def progress(result, done: int, total: int) -> None:
        current().active().advance(0, nbytes=result.bytes)  # the executor counts the files

    current().stage("prep rowgroups")
    report = rewrite_rowgroups(
        root,
        target_mb=target_mb,
        out=out,
        workers=pick(jobs, workers),
        compression=compression,
        dry_run=dry_run,
        force=force,
        executor=executor,
        copy_videos=copy_videos,
        progress=progress,
    )
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2))
    else:
        if dry_run:
            for r in report.files:
                if r.status == "planned":
                    click.echo(f"would rewrite {r.path}: {r.reason}")
        click.echo(format_report(report))
    if not report.ok:
        sys.exit(1)
