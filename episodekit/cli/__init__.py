"""The ``episodekit`` command line: a thin shell, each command calls one library function."""

from __future__ import annotations

import json

import click

from episodekit import __version__
from episodekit.cli.common import fail_cleanly
from episodekit.cli.metadata import costs_command, plan_command
from episodekit.cli.prep import prep_group
from episodekit.cli.prepare import prepare_command
from episodekit.cli.speed import speed_command
from episodekit.cli.validate import validate_command
from episodekit.sample import STYLES, VERSIONS


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="episodekit")
def main() -> None:
    """Prepare LeRobot-format datasets for large-scale training, and check them.

    Typical use: `episodekit prepare ROOT` (rewrite row groups, compute speed percentiles, cost
    tables and shard plans, validate). Each step also has its own command.
    """


@main.command("info")
@click.argument("root")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--max-files", default=20, show_default=True, help="Data files listed in the table.")
def info_command(root: str, as_json: bool, max_files: int) -> None:
    """Describe ROOT: counts, features, data-file row groups, page index, lengths per task.

    ROOT is a local path or an fsspec URL (hf://datasets/owner/name, memory://...).
    Reads metadata and parquet footers only.
    """
    from episodekit.info import describe, format_description

    with fail_cleanly():
        d = describe(root)
    click.echo(json.dumps(d, indent=2) if as_json else format_description(d, max_files))


@main.command("sample")
@click.argument("root", type=click.Path(file_okay=False))
@click.option("--episodes", "-n", default=50, show_default=True, help="Number of episodes.")
@click.option("--tasks", "-t", default=6, show_default=True, help="Number of tasks.")
@click.option(
    "--style",
    type=click.Choice(STYLES),
    default="recorded",
    show_default=True,
    help="recorded: one row group per episode (LeRobot's recorder); "
    "edited: one row group per file (LeRobot's editing tools).",
)
@click.option("--images", is_flag=True, help="Add an image feature (struct{bytes, path}).")
@click.option("--videos", default=0, show_default=True, help="Number of (fake) video cameras.")
@click.option("--seed", default=0, show_default=True)
@click.option("--fps", default=30, show_default=True)
@click.option("--state-dim", default=14, show_default=True)
@click.option("--action-dim", default=14, show_default=True)
@click.option("--file-mb", default=100.0, show_default=True, help="data_files_size_in_mb.")
@click.option("--chunks-size", default=1000, show_default=True, help="Files per chunk folder.")
@click.option(
    "--codebase-version",
    type=click.Choice(VERSIONS),
    default="v3.0",
    show_default=True,
)
def sample_command(
    root: str,
    episodes: int,
    tasks: int,
    style: str,
    images: bool,
    videos: int,
    seed: int,
    fps: int,
    state_dim: int,
    action_dim: int,
    file_mb: float,
    chunks_size: int,
    codebase_version: str,
) -> None:
    """Write a synthetic dataset in the exact LeRobot layout to ROOT (replacing it)."""
    import time

    from episodekit.sample import write_sample

    t0 = time.perf_counter()
    with fail_cleanly():
        write_sample(
            root,
            episodes=episodes,
            tasks=tasks,
            style=style,
            images=images,
            videos=videos,
            seed=seed,
            fps=fps,
            state_dim=state_dim,
            action_dim=action_dim,
            data_files_size_in_mb=file_mb,
            chunks_size=chunks_size,
            version=codebase_version,
        )
    from episodekit.core.dataset import read_info

    info = read_info(root)
    click.echo(
        f"wrote {root}: {info['total_episodes']:,} episodes, {info['total_frames']:,} frames, "
        f"{info['total_tasks']} tasks, style {style}, {codebase_version} "
        f"in {time.perf_counter() - t0:.1f}s"
    )


@main.group("metadata")
def metadata_group() -> None:
    """Derived tables: speed percentiles, episode costs, shard plans."""


metadata_group.add_command(speed_command)
metadata_group.add_command(costs_command)
metadata_group.add_command(plan_command)
main.add_command(prep_group)
main.add_command(validate_command)
main.add_command(prepare_command)


if __name__ == "__main__":  # pragma: no cover
    main()
