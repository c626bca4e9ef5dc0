"""``episodekit edit``, ``split`` and ``merge``: new datasets from existing ones (never in place),
each a thin call into :mod:`episodekit.prep.surgery`."""

from __future__ import annotations

import click

from episodekit.cli.common import json_option, root_argument
from episodekit.core import jsonout
from episodekit.core.paths import DEFAULT_TARGET_MB

out_option = click.option(
    "--out",
    required=True,
    metavar="DIR",
    help="The new dataset's folder: missing, empty or written by episodekit (never a source).",
)
target_option = click.option(
    "--target-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TARGET_MB,
    show_default=True,
    help="Row-group target (uncompressed MiB), as `prep rowgroups`.",
)


def _say_written(d: dict) -> None:
    if d["status"] == "unchanged":
        click.echo(f"{d['out']}: already written from the same inputs; nothing to do")
        return
    click.echo(
        f"wrote {d['out']}: {d['episodes']:,} episodes, {d['frames']:,} frames, {d['tasks']} "
        f"tasks, {d['data_files']} data files, {d['video_files']} video files "
        f"in {d['seconds']:.1f}s (verified)"
    )


@click.command("edit")
@root_argument()
@out_option
@click.option("--drop-episodes", metavar="LIST", help="Episodes to drop, e.g. 3,7,10-12.")
@click.option("--keep-episodes", metavar="LIST", help="Keep only these episodes, e.g. 0-99.")
@click.option(
    "--drop-tasks", multiple=True, metavar="TASK", help="Drop every episode of this task."
)
@click.option(
    "--drop-flagged",
    metavar="CHECKS",
    help="Drop the episodes these checks flag, e.g. quality.frozen,quality.duplicate "
    "(from --report, else a fresh validation run of those checks).",
)
@click.option(
    "--report",
    type=click.Path(exists=True, dir_okay=False),
    help="A `validate --json` report file for --drop-flagged.",
)
@click.option("--remove-feature", multiple=True, metavar="KEY", help="Remove a feature.")
@click.option("--rename-task", multiple=True, metavar="OLD=NEW", help="Rename a task.")
@target_option
@json_option
def edit_command(
    root: str,
    out: str,
    drop_episodes: str | None,
    keep_episodes: str | None,
    drop_tasks: tuple[str, ...],
    drop_flagged: str | None,
    report: str | None,
    remove_feature: tuple[str, ...],
    rename_task: tuple[str, ...],
    target_mb: float,
    as_json: bool,
) -> None:
    """Write ROOT without some episodes, features or task names to a new dataset --out DIR.

    The output is a LeRobot v3.0 dataset with episodes, index and tasks renumbered, stats
    carried over, row groups as `prep rowgroups` writes them and videos cut without
    re-encoding; it is verified against ROOT's rows before it appears at DIR.
    """
    from episodekit.prep.surgery import select
    from episodekit.prep.surgery.edit import EditSpec, edit

    if report and not drop_flagged:
        raise click.UsageError("--report is read for --drop-flagged; give --drop-flagged CHECKS")
    if drop_episodes and keep_episodes:
        raise click.UsageError("give --drop-episodes or --keep-episodes, not both")
    flagged = tuple(c.strip() for c in (drop_flagged or "").split(",") if c.strip())
    spec = EditSpec(
        drop_episodes=tuple(select.parse_episode_list(drop_episodes)) if drop_episodes else None,
        keep_episodes=(
            tuple(select.parse_episode_list(keep_episodes, "--keep-episodes"))
            if keep_episodes
            else None
        ),
        drop_tasks=drop_tasks,
        drop_flagged=flagged,
        report=report,
        remove_features=remove_feature,
        rename_tasks=tuple(select.parse_pairs(rename_task, "--rename-task")),
        target_mb=target_mb,
    )
    d = edit(root, out, spec).as_dict()
    if as_json:
        click.echo(jsonout.dumps(d, indent=2))
        return
    if d["dropped"]:
        click.echo(f"dropped {len(d['dropped'])} episodes: {_listing(d['dropped'])}")
    _say_written(d)


def _listing(dropped: dict[str, str], limit: int = 10) -> str:
    items = [f"{e} ({why})" for e, why in list(dropped.items())[:limit]]
    more = f", ... {len(dropped) - limit} more" if len(dropped) > limit else ""
    return ", ".join(items) + more
