"""``episodekit info`` and ``episodekit sample``: look at a root, or write a synthetic one."""

from __future__ import annotations

import click

from episodekit.cli.common import SIZE_MB, RootProblem, json_option, root_argument
from episodekit.core import jsonout
from episodekit.core.paths import VIDEO_CODECS
from episodekit.core.words import plural
from episodekit.sample.spec import STYLES, VERSIONS


def _parse_size(text: str) -> tuple[int, int]:
    try:
        h, w = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not HEIGHTxWIDTH (e.g. 96x128)") from None
    if h < 8 or w < 8 or h % 2 or w % 2:
        raise click.BadParameter(f"{text!r}: height and width must be even and >= 8")
    return h, w


@click.command("info")
@root_argument(required=False)
@json_option
@click.option(
    "--max-files",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="Data files listed in the table.",
)
@click.option(
    "--mixture",
    default=None,
    metavar="FILE|JSON",
    help="Describe a mixture instead of ROOT (mixture.json or inline JSON): sources, frames, "
    "effective weights, per-epoch quotas, repeats.",
)
def info_command(root: str | None, as_json: bool, max_files: int, mixture: str | None) -> None:
    """Describe ROOT: counts, features, data-file row groups, page index, video files per camera
    (mp4 files, size, codec, resolution), lengths per task.

    ROOT is a local path or an fsspec URL (hf://datasets/owner/name, memory://...).
    Reads metadata, parquet footers and video file sizes only (the codec and resolution shown
    are what info.json declares; validate checks them against the streams). With --mixture M
    (no ROOT): the mixture's sources, frames, effective weights after balance, per-epoch quotas
    and repeats.
    """
    from episodekit.info import describe, format_description

    if mixture is not None or root is None:
        if root is not None:
            raise click.UsageError("give either ROOT or --mixture, not both")
        if mixture is None:
            raise click.UsageError("missing ROOT (or --mixture FILE)")
        source = click.get_current_context().get_parameter_source("max_files")
        if source == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(
                "--max-files lists ROOT's data files; it does not combine with --mixture"
            )
        from episodekit.metadata.mixture.spec import describe_mixture, format_mixture

        d = describe_mixture(mixture)
        click.echo(jsonout.dumps(d, indent=2) if as_json else format_mixture(d))
        return

    d = describe(root)
    click.echo(jsonout.dumps(d, indent=2) if as_json else format_description(d, max_files))


def _local_output(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if "://" in value:
        raise RootProblem(f"{value}: the sample writer writes a local folder, not a URL")
    return value


POSITIVE = click.IntRange(min=1)


@click.command("sample")
@click.argument("root", type=click.Path(file_okay=False), callback=_local_output)
@click.option(
    "--episodes", "-n", type=POSITIVE, default=50, show_default=True, help="Number of episodes."
)
@click.option("--tasks", "-t", type=POSITIVE, default=6, show_default=True, help="Number of tasks.")
@click.option(
    "--style",
    type=click.Choice(STYLES),
    default="recorded",
    show_default=True,
    help="recorded: one row group per episode (LeRobot's recorder); "
    "edited: one row group per file (LeRobot's editing tools).",
)
@click.option("--images", is_flag=True, help="Add an image feature (struct{bytes, path}).")
@click.option(
    "--videos",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Video cameras, encoded as real mp4s (needs PyAV: pip install 'episodekit[video]').",
)
@click.option(
    "--video-size",
    default="48x64",
    show_default=True,
    help="HEIGHTxWIDTH of the encoded cameras.",
)
@click.option(
    "--video-codec",
    type=click.Choice(VIDEO_CODECS),
    default="av1",
    show_default=True,
    help="av1 (libsvtav1, LeRobot's default) or h264 (libx264).",
)
@click.option(
    "--gop", type=click.IntRange(min=1), default=2, show_default=True, help="Keyframe interval."
)
@click.option("--seed", default=0, show_default=True)
@click.option("--fps", type=POSITIVE, default=30, show_default=True)
@click.option("--state-dim", type=POSITIVE, default=14, show_default=True)
@click.option("--action-dim", type=POSITIVE, default=14, show_default=True)
@click.option(
    "--file-mb",
    type=SIZE_MB,
    default=100.0,
    show_default=True,
    help="data_files_size_in_mb.",
)
@click.option(
    "--chunks-size", type=POSITIVE, default=1000, show_default=True, help="Files per chunk folder."
)
@click.option(
    "--codebase-version",
    type=click.Choice(VERSIONS),
    default="v3.0",
    show_default=True,
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace ROOT even when it holds files episodekit did not write (never ., a parent of "
    "the current folder, / or $HOME).",
)
def sample_command(
    root: str,
    episodes: int,
    tasks: int,
    style: str,
    images: bool,
    videos: int,
    video_size: str,
    video_codec: str,
    gop: int,
    seed: int,
    fps: int,
    state_dim: int,
    action_dim: int,
    file_mb: float,
    chunks_size: int,
    codebase_version: str,
    force: bool,
) -> None:
    """Write a synthetic dataset in the exact LeRobot layout to ROOT.

    ROOT must be missing, empty, or a sample written earlier (it is replaced); a folder holding
    other files is refused (exit 2, nothing deleted) unless --force.
    """
    import time

    from episodekit.sample import write_sample

    t0 = time.perf_counter()
    write_sample(
        root,
        episodes=episodes,
        tasks=tasks,
        style=style,
        images=images,
        videos=videos,
        video_size=_parse_size(video_size),
        video_codec=video_codec,
        gop=gop,
        seed=seed,
        fps=fps,
        state_dim=state_dim,
        action_dim=action_dim,
        data_files_size_in_mb=file_mb,
        chunks_size=chunks_size,
        version=codebase_version,
        force=force,
    )
    from episodekit.core.dataset import read_info

    info = read_info(root)
    click.echo(
        f"wrote {root}: {plural(info['total_episodes'], 'episode')}, "
        f"{plural(info['total_frames'], 'frame')}, {plural(info['total_tasks'], 'task')}, "
        f"style {style}, {codebase_version} "
        f"in {time.perf_counter() - t0:.1f}s"
    )
