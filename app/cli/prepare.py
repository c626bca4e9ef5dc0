"""CLI: ``episodekit prepare`` — the whole job in one command."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from episodekit.cli.common import (
    IntList,
    canonical_bins_option,
    cost_option,
    dataloader_workers_option,
    exclude_options,
    executor_option,
    force_option,
    jobs_option,
    json_option,
    locality_option,
    no_wait_option,
    parse_canonical_bins,
    quiet_option,
    root_argument,
    split_long_option,
    target_mb_option,
)
from episodekit.cli.mixture_args import check_mixture_args
from episodekit.core import jsonout

if TYPE_CHECKING:
    from episodekit.exclusions import ExcludeOptions


@click.command("prepare")
@root_argument(required=False)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Prepare a complete copy here instead of in place (required for remote roots). "
    "With --mixture: the folder for the mixture plans (the sources are prepared in place).",
)
@target_mb_option
@click.option(
    "--world-size",
    "world_size",
    type=IntList(),
    default="8,64",
    show_default=True,
    help="Comma-separated world sizes (ranks) to write shard plans for. A size whose "
    "ranks x workers bins cannot all get a frame is skipped with a warning.",
)
@dataloader_workers_option(default=4)
@split_long_option("skip those sizes. A run where every world size is skipped exits 1.")
@cost_option()
@executor_option
@jobs_option
@click.option(
    "--push-to-hub",
    "push_to_hub",
    default=None,
    metavar="REPO",
    help="Upload the changed files to this dataset repo in one commit.",
)
@click.option(
    "--videos",
    "include_videos",
    is_flag=True,
    help="Also copy videos/ into --out (default: meta and data only).",
)
@locality_option(default="rowgroup")
@click.option(
    "--videos-gop",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Also bring the videos to the random-access target, keyframes at most N frames apart "
    "(`prep videos`: video that meets it is left alone; needs PyAV; with --out also pass "
    "--videos).",
)
@click.option(
    "--frames",
    "frames",
    is_flag=True,
    help="Also build the frame store for random access (`prep frames`; local cache, "
    "skipped when fresh).",
)
@canonical_bins_option()
@exclude_options
@click.option(
    "--stats",
    "stats",
    type=click.Choice(["keep", "recompute"]),
    default="keep",
    show_default=True,
    help="keep: the dataset's own stats (meta/stats.json, per-episode stats) stay when they pass "
    "the stats.* checks (computed where missing, stale or failing); recompute: replace them.",
)
@click.option(
    "--mixture",
    default=None,
    metavar="FILE|JSON",
    help="Prepare every local source of a mixture (mixture.json or inline JSON) in place "
    "instead of ROOT, then write its mixture plans into --out DIR (not with --push-to-hub, "
    "--videos, --videos-gop, --canonical-bins).",
)
@click.option(
    "--convert",
    "convert",
    is_flag=True,
    help="ROOT is a v2.1/v2.0 dataset: convert it into --out DIR first (`episodekit convert`), "
    "then prepare DIR.",
)
@force_option
@no_wait_option
@json_option
@quiet_option
def prepare_command(
    root: str | None,
    out: str | None,
    target_mb: float,
    world_size: list[int],
    workers: int,
    split_long: str,
    cost: str,
    executor: str,
    jobs: int | None,
    push_to_hub: str | None,
    include_videos: bool,
    locality: str,
    videos_gop: int | None,
    frames: bool,
    canonical_bins: str | None,
    stats: str,
    mixture: str | None,
    force: bool,
    no_wait: bool,
    as_json: bool,
    exclude: ExcludeOptions,
    convert: bool = False,
) -> None:
    """Take ROOT from "as recorded" to "ready for training", then prove it.

    Runs, in order: row-group rewrite, speed percentiles, cost table, shard plans (with
    --canonical-bins also the canonical plan for elastic resume), normalization stats,
    validation (and with --frames the frame store). --exclude-* leave episodes or frame ranges
    out of the plans (the data stays as it is).
    Each step is skipped when its output is already fresh, so a rerun (after a crash, or after
    adding episodes) only does what is needed. Arguments and plan feasibility are checked before
    anything is written. Exit codes: 0 prepared and valid; 1 validation or a rewrite failed;
    2 usage or environment (bad option, not a dataset, unreachable hub, missing extra); 130
    interrupted (Ctrl-C), 143 terminated (SIGTERM): nothing half-written is left.

    ROOT is a local path or a URL such as hf://datasets/owner/name[@revision] (then --out is
    required: only meta/ and data/ are downloaded).
    """
    from episodekit.cli.progress import hub_bars_follow
    from episodekit.prepare import format_result, prepare

    hub_bars_follow(click.get_current_context())
    canonical = parse_canonical_bins(canonical_bins)
    if mixture is not None or root is None:
        only_root = (
            ("--push-to-hub", push_to_hub),
            ("--videos", include_videos),
            ("--videos-gop", videos_gop),
            ("--canonical-bins", canonical is not False),
            ("--exclude-*", bool(exclude)),
            ("--convert", convert),
        )
        for flag, given in only_root:
            if given:
                raise click.UsageError(
                    f"{flag} is for ROOT; it does not combine with --mixture "
                    "(prepare each source with 'episodekit prepare ROOT' instead)"
                )
        _prepare_mixture(root, mixture, out, world_size, workers, cost, locality, split_long,
                         force, no_wait, as_json, executor=executor, jobs=jobs, frames=frames,
                         target_mb=target_mb, stats=stats)  # fmt: skip
        return
    result = prepare(
        root,
        out=out,
        target_mb=target_mb,
        world_sizes=world_size,
        num_workers=workers,
        cost=cost,
        executor=executor,
        jobs=jobs,
        push_to_hub=push_to_hub,
        include_videos=include_videos,
        force=force,
        split_long=split_long,
        videos_gop=videos_gop,
        locality=locality,
        frames=frames,
        wait=not no_wait,
        canonical_bins=canonical,
        stats=stats,
        exclude=exclude or None,
        convert=convert,
    )
    click.echo(jsonout.dumps(result.to_dict(), indent=2) if as_json else format_result(result))
    if not result.ok:
        sys.exit(1)


def _prepare_mixture(
    root, mixture, out, world_size, workers, cost, locality, split_long, force, no_wait, as_json,
    **kwargs,
) -> None:  # fmt: skip
    """``prepare --mixture M --out DIR``."""
    from episodekit.mixture import format_mixture_result, prepare_mixture

    check_mixture_args(root, mixture, out, "the mixture plan")
    result = prepare_mixture(
        mixture, out, world_sizes=world_size, num_workers=workers, cost=cost, locality=locality,
        split_long=split_long, force=force, wait=not no_wait, **kwargs,
    )  # fmt: skip
    click.echo(
        jsonout.dumps(result.to_dict(), indent=2) if as_json else format_mixture_result(result)
    )
    if not result.ok:
        sys.exit(1)
