"""``episodekit edit``, ``split`` and ``merge``: new datasets from existing ones (never in place),
each a thin call into :mod:`episodekit.writers`."""

from __future__ import annotations

import click

from episodekit.cli.common import executor_option, json_option, root_argument, target_mb_option
from episodekit.core import jsonout
from episodekit.core.paths import DEFAULT_IDLE_THRESHOLD
from episodekit.core.words import plural

out_option = click.option(
    "--out",
    required=True,
    metavar="DIR",
    help="The new dataset's folder: missing, empty or written by episodekit (never a source).",
)
target_option = target_mb_option  # the row-group target, as `prep rowgroups`


def say_written(d: dict) -> None:
    if d["status"] == "unchanged":
        click.echo(f"{d['out']}: already written from the same inputs; nothing to do")
        return
    click.echo(
        f"wrote {d['out']}: {plural(d['episodes'], 'episode')}, {plural(d['frames'], 'frame')}, "
        f"{plural(d['tasks'], 'task')}, {plural(d['data_files'], 'data file')}, "
        f"{plural(d['video_files'], 'video file')} "
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
    help="Drop what these checks flag, e.g. quality.frozen,quality.duplicate (from "
    "--flags-from REPORT, else a fresh validation run of those checks): the frames a "
    "frame-level finding names (frozen, frozen_run, jump, out_of_range), else the episode.",
)
@click.option(
    "--flags-from",
    "--report",
    "report",
    type=click.Path(exists=True, dir_okay=False),
    metavar="REPORT",
    help="A `validate --json` report file for --drop-flagged (as `metadata plan --flags-from`).",
)
@click.option("--remove-feature", multiple=True, metavar="KEY", help="Remove a feature.")
@click.option("--rename-task", multiple=True, metavar="OLD=NEW", help="Rename a task.")
@click.option(
    "--drop-frames",
    metavar="SPEC|FILE",
    help="Frames to drop inside episodes: EPISODE:FIRST-LAST,... (inclusive, e.g. 3:11-20,7:0-4) "
    "or a JSON/jsonl file of {episode, start, end} ranges (end exclusive, as --exclude-frames).",
)
@click.option(
    "--keep-frames",
    metavar="SPEC|FILE",
    help="Keep only these frames of the episodes named (same forms as --drop-frames); "
    "other episodes stay whole.",
)
@click.option(
    "--trim-idle",
    is_flag=True,
    help="Drop each episode's still head and tail (action and observation.state not moving).",
)
@click.option(
    "--idle-threshold",
    type=float,
    default=DEFAULT_IDLE_THRESHOLD,
    show_default=True,
    metavar="F",
    help="--trim-idle: a frame moves when a dimension changes by more than F times its std.",
)
@click.option(
    "--add-feature",
    "add_feature",
    multiple=True,
    metavar="NAME",
    help="Add a feature NAME with the values of --from FILE (repeatable, one --from each).",
)
@click.option(
    "--from",
    "from_files",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    metavar="FILE",
    help="--add-feature's values: parquet, jsonl or npy keyed by episode_index, frame_index.",
)
@click.option(
    "--allow-nan",
    is_flag=True,
    help="--add-feature: write NaN and inf values as given (refused otherwise; `validate` "
    "then reports data.nan and stats.finite).",
)
@click.option(
    "--rename-feature", multiple=True, metavar="OLD=NEW", help="Rename a (non-video) feature."
)
@click.option(
    "--lossless-only",
    is_flag=True,
    help="Cut videos by packet copy only: a cut off a keyframe is an error instead of a "
    "re-encoded group of pictures.",
)
@click.option(
    "--images-to-video",
    multiple=True,
    is_flag=False,
    flag_value="all",
    metavar="[KEY]",
    help="Encode image features stored in the data files as video (LeRobot's AV1 defaults, "
    "verified frame by frame): every one, or KEY (repeatable).",
)
@target_option
@executor_option
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
    drop_frames: str | None,
    keep_frames: str | None,
    trim_idle: bool,
    idle_threshold: float,
    add_feature: tuple[str, ...],
    from_files: tuple[str, ...],
    allow_nan: bool,
    rename_feature: tuple[str, ...],
    lossless_only: bool,
    images_to_video: tuple[str, ...],
    target_mb: float,
    executor: str,
    as_json: bool,
) -> None:
    """Write ROOT without some episodes, frames, features or task names to a new dataset
    --out DIR.

    The output is a LeRobot v3.0 dataset with episodes, index and tasks renumbered, stats
    carried over, row groups as `prep rowgroups` writes them and videos cut without
    re-encoding; it is verified against ROOT's rows before it appears at DIR. Episodes cut
    inside (--drop-frames, --keep-frames, --trim-idle) keep their place, get frame_index and
    timestamp renumbered and their stats recomputed; their video is re-encoded only in the
    groups of pictures a cut falls in.
    """
    from episodekit.writers import select
    from episodekit.writers.edit import EditSpec, edit
    from episodekit.writers.frames import parse_frame_spec

    if report and not drop_flagged:
        raise click.UsageError(
            "--flags-from is read for --drop-flagged; give --drop-flagged CHECKS"
        )
    if drop_episodes is not None and keep_episodes is not None:
        raise click.UsageError("give --drop-episodes or --keep-episodes, not both")
    if len(add_feature) != len(from_files):
        raise click.UsageError("give one --from FILE for each --add-feature NAME")
    if allow_nan and not add_feature:
        raise click.UsageError("--allow-nan is read for --add-feature; give --add-feature NAME")
    flagged = tuple(c.strip() for c in (drop_flagged or "").split(",") if c.strip())
    if drop_flagged is not None and not flagged:
        raise click.UsageError("--drop-flagged: no checks given (e.g. quality.frozen)")
    # an empty list is a mistake, never "nothing dropped" or "keep everything": the parser
    # refuses it (exit 2)
    spec = EditSpec(
        drop_episodes=(
            tuple(select.parse_episode_list(drop_episodes)) if drop_episodes is not None else None
        ),
        keep_episodes=(
            tuple(select.parse_episode_list(keep_episodes, "--keep-episodes"))
            if keep_episodes is not None
            else None
        ),
        drop_tasks=drop_tasks,
        drop_flagged=flagged,
        report=report,
        remove_features=remove_feature,
        rename_tasks=tuple(select.parse_pairs(rename_task, "--rename-task")),
        target_mb=target_mb,
        executor=executor,
        drop_frames=parse_frame_spec(drop_frames) if drop_frames is not None else None,
        keep_frames=(
            parse_frame_spec(keep_frames, "--keep-frames") if keep_frames is not None else None
        ),
        trim_idle=trim_idle,
        idle_threshold=idle_threshold,
        lossless_only=lossless_only,
        add_features=tuple(zip(add_feature, from_files)),
        rename_features=tuple(select.parse_pairs(rename_feature, "--rename-feature")),
        images_to_video=images_to_video,
        allow_nan=allow_nan,
    )
    d = edit(root, out, spec).as_dict()
    if as_json:
        click.echo(jsonout.dumps(d, indent=2))
        return
    if d["dropped"]:
        click.echo(f"dropped {plural(len(d['dropped']), 'episode')}: {_listing(d['dropped'])}")
    for e, info in d.get("frames_dropped", {}).items():
        click.echo(f"episode {e}: {_frames_line(info)}")
    say_written(d)
    for line in _video_lines(d):
        click.echo(line)
    for note in d.get("notes", []):
        click.echo(note)


def _video_lines(d: dict) -> list[str]:
    """Per camera, what became of its frames when any was encoded (a cut re-encoded a group of
    pictures, or images were encoded as video), with the worst PSNR measured; nothing when
    the videos were copied as packets."""
    lines = []
    for key, c in (d.get("video_cut") or {}).get("cameras", {}).items():
        if c["frames_reencoded"]:
            lines.append(
                f"{key}: {plural(c['frames_reencoded'], 'frame')} re-encoded "
                f"({plural(c['gops_reencoded'], 'group')} of pictures a cut fell in, worst "
                f"frame {c['min_psnr_db']:.1f} dB PSNR), {plural(c['frames_copied'], 'frame')} "
                "copied as packets"
            )
        else:
            lines.append(f"{key}: {plural(c['frames_copied'], 'frame')} copied as packets")
    for key, c in (d.get("images_to_video") or {}).get("cameras", {}).items():
        lines.append(
            f"{key}: {plural(c['frames'], 'frame')} encoded from images (AV1, LeRobot's "
            f"defaults), worst frame {c['min_psnr_db']:.1f} dB PSNR against the encoder's "
            f"input, {c['min_rgb_psnr_db']:.1f} dB in RGB against the image"
        )
    return lines


def _frames_line(info: dict) -> str:
    """What went of one episode cut inside, e.g. ``dropped 12 frames (0-4, 90-96) by
    --trim-idle: head 5, tail 7``."""
    if info.get("still"):
        return info["still"]
    ranges = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in info["ranges"][:8])
    more = ", ..." if len(info["ranges"]) > 8 else ""
    line = f"dropped {plural(info['dropped'], 'frame')} ({ranges}{more}) by {', '.join(info['by'])}"
    if "head" in info:
        line += f": head {info['head']}, tail {info['tail']}"
    if "flagged_by" in info:
        line += f" ({', '.join(info['flagged_by'])})"
    return line


def _listing(dropped: dict[str, str], limit: int = 10) -> str:
    items = [f"{e} ({why})" for e, why in list(dropped.items())[:limit]]
    more = f", ... {len(dropped) - limit} more" if len(dropped) > limit else ""
    return ", ".join(items) + more


@click.command("split")
@root_argument()
@out_option
@click.option(
    "--fractions",
    required=True,
    metavar="NAME=F,...",
    help="One output per part, e.g. train=0.9,val=0.1 (fractions of the episodes, sum 1).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the assignment.")
@click.option(
    "--by",
    type=click.Choice(["episode", "task"]),
    default="episode",
    show_default=True,
    help="episode: episodes assigned one by one; task: every episode of a task in one split.",
)
@target_option
@executor_option
@json_option
def split_command(
    root: str,
    out: str,
    fractions: str,
    seed: int,
    by: str,
    target_mb: float,
    executor: str,
    as_json: bool,
) -> None:
    """Split ROOT into one new dataset per fraction, written to --out DIR/<name>.

    Episodes are assigned at random (--seed); each output is a LeRobot v3.0 dataset verified
    against ROOT's rows, with videos cut without re-encoding.
    """
    from episodekit.writers.split import parse_fractions, split

    parts = parse_fractions(fractions)
    d = split(root, out, parts, seed=seed, by=by, target_mb=target_mb, executor=executor)
    if as_json:
        click.echo(jsonout.dumps(d.as_dict(), indent=2))
        return
    for part in d.as_dict()["splits"].values():
        say_written(part)


@click.command("merge")
@click.argument("roots", nargs=-1, required=True, callback=lambda c, p, v: _check_roots(c, p, v))
@out_option
@target_option
@executor_option
@json_option
def merge_command(
    roots: tuple[str, ...], out: str, target_mb: float, executor: str, as_json: bool
) -> None:
    """Merge ROOTS (two or more, same features) into one new dataset --out DIR.

    Episodes are renumbered in the order of ROOTS, tasks unified by their string, videos
    concatenated without re-encoding (their codec parameters must match); the output is
    verified against the sources' rows before it appears at DIR.
    """
    from episodekit.writers.merge import merge

    d = merge(list(roots), out, target_mb=target_mb, executor=executor).as_dict()
    if as_json:
        click.echo(jsonout.dumps(d, indent=2))
        return
    say_written(d)
    if d["status"] == "written" and d["stats"] != "carried over":
        click.echo(f"stats: {d['stats']}")


def _check_roots(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]):
    from episodekit.cli.common import check_root

    roots = tuple(check_root(ctx, param, v) for v in value)  # each one a dataset, first
    if len(roots) < 2:
        raise click.UsageError("merge needs at least two ROOTS")
    return roots
