"""``episodekit import``: robot data in another format (RLDS, ALOHA / robomimic HDF5, zarr, ROS
bags) to a new LeRobot v3.0 dataset, a thin call into
:func:`episodekit.writers.import_run.run_import`."""

from __future__ import annotations

import click

from episodekit.cli.common import SIZE_MB, executor_option, json_option
from episodekit.core import jsonout


@click.command("import")
@click.argument("src", metavar="SRC")
@click.option(
    "--out",
    metavar="DIR",
    help="The new dataset's folder: missing, empty or written by episodekit (never the source).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["rlds", "aloha", "robomimic", "zarr", "rosbag"]),  # registry.READERS
    default=None,
    help="The source's layout (default: detected).",
)
@click.option(
    "--map",
    "map_path",
    metavar="MAP.toml",
    default=None,
    help="Which source keys become which features (default: the built-in map).",
)
@click.option(
    "--print-map",
    is_flag=True,
    help="Print the built-in map of SRC as TOML (to edit and pass to --map); write nothing.",
)
@click.option(
    "--fps",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Frames per second (overrides the map's and the source's).",
)
@click.option(
    "--video",
    type=click.Choice(["av1", "h264", "none"]),
    default="av1",
    show_default=True,
    help="How camera images are stored: AV1 (LeRobot's "
    "libsvtav1, g 2, crf 30, yuv420p), h264; none refuses a map with cameras.",
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes (or with --executor ray, Ray tasks at a time) reading, mapping and "
    "decoding episodes (the encoding and writing stay on this machine, in order: the output "
    "is the same bytes whatever N and the executor).",
)
@click.option(
    "--data-mb",
    type=SIZE_MB,
    default=100.0,
    show_default=True,
    help="Data file size (MB, LeRobot's data_files_size_in_mb); a killed import resumes "
    "from its last full data file.",
)
@click.option(
    "--video-mb",
    type=SIZE_MB,
    default=200.0,
    show_default=True,
    help="Video file size (MB, LeRobot's video_files_size_in_mb).",
)
@executor_option(unit="episode")
@click.option("--dry-run", is_flag=True, help="Check the source and the map, write nothing.")
@json_option
def import_command(
    src: str,
    out: str | None,
    fmt: str | None,
    map_path: str | None,
    print_map: bool,
    fps: float | None,
    video: str,
    jobs: int,
    data_mb: float,
    video_mb: float,
    executor: str,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Import SRC (an RLDS / Open X TFDS folder, a folder of ALOHA episode_N.hdf5 files, a
    robomimic HDF5 file, a diffusion policy / UMI zarr ReplayBuffer, or a ROS 1 / ROS 2 bag or
    a folder of bags, one episode each) as a new LeRobot v3.0 dataset --out DIR (RLDS, zarr
    and ROS bags record no frame rate: give --fps; a bag's topics are resampled onto that
    grid, docs/import.md says the rule).

    Each episode is read, mapped (--map, else the format's built-in map: --print-map shows
    it) and written before the next: data parquet in 32 MiB row groups, cameras encoded as
    video, episodes, tasks, info and exact stats. The output is verified (rows, checksums,
    video frame counts) before it appears at DIR; on any failure nothing is published. A rerun
    with the same inputs does nothing; a rerun after a killed import keeps the episodes of
    the data files it finished and verified, and carries on from there.
    """
    from episodekit.importers.mapping import MapError
    from episodekit.importers.registry import UnknownLayout
    from episodekit.writers.import_run import ImportOptions, inferred_map, run_import

    options = ImportOptions(fmt, map_path, fps, video, jobs, data_mb, video_mb, executor)
    try:
        if print_map:
            click.echo(inferred_map(src, options), nl=False)
            return
        if not out:
            raise click.UsageError("Missing option '--out' (or give --print-map).")
        d = run_import(src, out, options, dry_run=dry_run).as_dict()
    except (MapError, UnknownLayout) as exc:  # the command cannot run as asked: exit 2
        raise ValueError(str(exc)) from None
    if as_json:
        click.echo(jsonout.dumps(d, indent=2))
        return
    if d["status"] == "unchanged":
        click.echo(f"{d['out']}: already imported from the same inputs; nothing to do")
    elif d["status"] == "dry run":
        click.echo(
            f"would import {d['episodes']} {d['format']} episodes into {d['out']}: "
            f"features {', '.join(d['features'])} (nothing written)"
        )
    else:
        click.echo(
            f"wrote {d['out']}: {d['episodes']} episodes, {d['frames']} frames, "
            f"{d['tasks']} tasks, {d['data_files']} data files, {d['video_files']} "
            f"video files in {d['seconds']:.1f}s (verified)"
        )
    if d.get("resumed"):
        click.echo(f"resumed: {d['resumed']} episodes kept from a killed import")
    for reason in d["skipped"]:
        click.echo(f"skipped {reason}")
