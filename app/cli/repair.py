"""``episodekit repair``: a thin call into :func:`episodekit.writers.repair.repair`."""

from __future__ import annotations

import click

from episodekit.cli.common import executor_option, json_option, root_argument
from episodekit.core import jsonout


def _episodes(values: list[int], limit: int = 12) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", ... {len(values) - limit} more" if len(values) > limit else "")


def say_repair(d: dict) -> None:
    """The result as text: damages, what is kept, rebuilt, dropped, left behind, and done."""
    if d["status"] == "nothing to repair":
        click.echo(f"{d['root']}: nothing to repair")
        return
    if d["status"] == "unchanged":
        click.echo(f"{d['out']}: already repaired from the same {d['root']}; nothing to do")
        return
    click.echo(f"{d['root']}: {len(d['damages'])} damage(s) found")
    for x in d["damages"]:
        click.echo(f"  {x['file']}: {x['damage']}")
    rebuilt = f"; metadata rebuilt for episode(s) {_episodes(d['rebuilt'])}" if d["rebuilt"] else ""
    click.echo(f"kept {d['episodes']:,} episodes ({d['frames']:,} frames){rebuilt}")
    for x in d["dropped"]:
        on_disk = f"{x['frames']:,} frames on disk"
        click.echo(f"dropped episode {x['episode']} ({on_disk}): {x['reason']}")
    for what, n in d["left_behind"].items():
        click.echo(f"left behind: {n:,} {what} of the episode being recorded")
    if d["status"] == "planned":
        click.echo("dry run: nothing written")
        return
    for rel, how in d["files"].items():
        click.echo(f"  wrote {rel}: {how}")
    if d["backup"]:
        from episodekit.writers.repair import undo_hint

        click.echo(
            f"repaired {d['root']} in place in {d['seconds']:.1f}s (verified); the files it "
            f"replaced or removed are in {d['backup']} ({undo_hint(d['root'], d['backup'])})"
        )
    else:
        click.echo(f"wrote {d['out']} in {d['seconds']:.1f}s (verified)")


@click.command("repair")
@root_argument()
@click.option(
    "--out",
    metavar="DIR",
    help="Write the repaired dataset to this new folder (missing, empty or episodekit's); "
    "ROOT is only read.",
)
@click.option(
    "--in-place",
    is_flag=True,
    help="Repair ROOT itself: every file replaced or removed is first kept in a backup "
    "folder next to ROOT (.ROOT.episodekit-backup-..., named in the output; undo with "
    "--restore).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be done; write nothing.")
@click.option(
    "--keep-partial",
    is_flag=True,
    help="Keep the episode the recorder was saving when it died, when its rows and every "
    "camera's frames reached the disk whole (default: drop it).",
)
@click.option(
    "--restore",
    metavar="BACKUP",
    type=click.Path(exists=True, file_okay=False),
    help="Undo an --in-place repair of ROOT: put back the files from its backup folder "
    "(refused, naming them, when files it wrote were changed since).",
)
@executor_option
@json_option
def repair_command(
    root: str,
    out: str | None,
    in_place: bool,
    dry_run: bool,
    keep_partial: bool,
    restore: str | None,
    executor: str,
    as_json: bool,
) -> None:
    """Recover a LeRobot v3.0 recording killed before it finished (or otherwise damaged)
    into a dataset LeRobot loads again, every episode that reached the disk bit for bit.

    Data and meta/episodes files without a footer (their writer was never closed) get one
    for every whole row group; episodes whose metadata rows were still buffered get them
    rebuilt from their rows and mp4s the way LeRobot computes them; info.json totals, tasks
    and stats.json are fixed; the episode being recorded (rows, staged PNGs, mp4 tail) is
    dropped. The result is verified before it appears at --out DIR (or replaces files in
    ROOT with --in-place). Exit 0: repaired, or nothing to repair; 1: nothing recoverable;
    2: cannot run as asked; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM): --out as it
    was, ROOT as it was or (a signal while files were replaced) fully repaired.
    """
    from pathlib import Path

    from episodekit.writers.repair import RepairOptions, repair
    from episodekit.writers.repair import restore as restore_backup

    if restore:
        if out or in_place or dry_run or keep_partial:
            raise click.UsageError("--restore takes no other option")
        restored = restore_backup(restore, expect_root=root)
        if as_json:
            click.echo(jsonout.dumps({"restored": restored, "backup": str(Path(restore))}))
        else:
            click.echo(f"restored {restored} from {restore}")
        return
    if out and in_place:
        raise click.UsageError("give --out DIR or --in-place, not both")
    if not (out or in_place or dry_run):
        raise click.UsageError("give --out DIR (a new folder), --in-place or --dry-run")
    options = RepairOptions(out, in_place, dry_run, keep_partial, executor)
    result = repair(root, options)
    try:
        d = result.as_dict()
        if as_json:
            click.echo(jsonout.dumps(d, indent=2))
            return
        say_repair(d)
    except BaseException:
        if result.backup:  # ROOT was repaired: its way back is named on every way out
            from episodekit.writers.repair import backup_note

            click.echo(backup_note(root, result.backup), err=True)
        raise
