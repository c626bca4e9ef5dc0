"""``episodekit convert``: a v2.1/v2.0 dataset to LeRobot v3.0, a thin call into
:func:`episodekit.writers.convert.convert`."""

from __future__ import annotations

import click

from episodekit.cli.common import SIZE_MB, executor_option, json_option, root_argument
from episodekit.cli.surgery import out_option, say_written, target_option
from episodekit.core import jsonout

size_mb = SIZE_MB


@click.command("convert")
@root_argument()
@out_option
@click.option(
    "--data-mb", type=size_mb, default=100.0, show_default=True, help="Data file size (MB)."
)
@click.option(
    "--video-mb", type=size_mb, default=200.0, show_default=True, help="Video file size (MB)."
)
@target_option
@click.option(
    "--stats",
    type=click.Choice(["carry", "complete"]),
    default="carry",
    show_default=True,
    help="carry: the source's per-episode stats as they are (computed where it has none); "
    "complete: also compute what v2.1 stats lack (quantiles), reading the data once more.",
)
@click.option(
    "--push-to-hub",
    "push_to_hub",
    default=None,
    metavar="REPO",
    help="Upload the converted dataset to this dataset repo in one commit.",
)
@click.option(
    "--revision",
    default=None,
    metavar="BRANCH",
    help="With --push-to-hub: the branch to commit to (e.g. v3.0; default: main).",
)
@executor_option
@json_option
def convert_command(
    root: str,
    out: str,
    data_mb: float,
    video_mb: float,
    target_mb: float,
    stats: str,
    push_to_hub: str | None,
    revision: str | None,
    executor: str,
    as_json: bool,
) -> None:
    """Convert the v2.1 or v2.0 dataset ROOT (one parquet and one mp4 per episode) to a new
    LeRobot v3.0 dataset --out DIR, ready to train.

    Rows are streamed into DATA-MB files with 32 MiB episode-aligned row groups (what `prepare`
    writes), each camera's episodes are joined into VIDEO-MB mp4s by packet copy (no
    re-encode), the episodes and tasks tables are written in v3.0 form, and the stats are
    carried over (computed where ROOT has none; --stats complete also computes
    the quantiles v2.1 lacks). The output is verified against
    ROOT's rows and video frames before it appears at DIR. ROOT may be a hub URL
    (hf://datasets/owner/name@rev): only the files converted are read.
    """
    from episodekit.writers.convert import ConvertOptions, convert, push_output

    options = ConvertOptions(data_mb, video_mb, target_mb, stats, executor)
    result = convert(root, out, options)
    d = result.as_dict()
    if push_to_hub:
        commit = push_output(out, push_to_hub, revision=revision)
        d["pushed"] = str(getattr(commit, "commit_url", commit))
    if as_json:
        click.echo(jsonout.dumps(d, indent=2))
        return
    say_written(d)
    if d["status"] == "written":
        click.echo(f"stats: {d['stats']}")
    if push_to_hub:
        click.echo(f"pushed to {push_to_hub}: {d['pushed']}")
