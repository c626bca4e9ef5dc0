"""CLI: `episodekit prep rowgroups`, `prep videos` and `prep frames`, thin shells over
episodekit.prep (rewrite_rowgroups, rewrite_videos, build_frame_store)."""

from __future__ import annotations

import sys

import click

from episodekit.cli.common import (
    EpisodekitGroup,
    deprecated_alias,
    executor_option,
    force_option,
    jobs_option,
    json_option,
    no_wait_option,
    pick,
    quiet_option,
    root_argument,
    target_mb_option,
)
from episodekit.core import jsonout
from episodekit.core.paths import COMPRESSIONS, VIDEO_CODECS


@click.group("prep", cls=EpisodekitGroup)
def prep_group() -> None:
    """Prepare data files for fast reading: parquet row groups (rowgroups), videos for random
    access (videos), a decoded frame store for random access (frames)."""


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
@no_wait_option
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
    no_wait: bool,
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
        if result.status == "rewritten":  # the rate counts work done, not files skipped
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
        wait=not no_wait,
    )
    if as_json:
        click.echo(jsonout.dumps(report.summary(), indent=2))
    else:
        if dry_run:
            for r in report.files:
                if r.status == "planned":
                    click.echo(f"would rewrite {r.path}: {r.reason}")
        click.echo(format_report(report))
    if not report.ok:
        sys.exit(1)


@prep_group.command("videos")
@root_argument()
@click.option(
    "--codec",
    type=click.Choice(VIDEO_CODECS),
    default=None,
    help="Codec files must have and re-encoded files get: av1 (libsvtav1) or h264 (libx264). "
    "Default: any codec the loader decodes is kept, re-encoded files get av1.",
)
@click.option(
    "--gop",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Largest keyframe interval (random access decodes at most GOP-1 extra frames).",
)
@click.option("--crf", type=click.IntRange(min=0, max=63), default=30, show_default=True)
@click.option("--no-faststart", is_flag=True, help="Keep the index at the end of the file.")
@click.option(
    "--min-psnr",
    default=35.0,
    show_default=True,
    help="Refuse a re-encode whose PSNR vs the source decode is lower (dB).",
)
@click.option(
    "--timing-frames",
    default=16,
    show_default=True,
    help="Random frames timed per re-encoded file before/after (0: no timing).",
)
@click.option(
    "--out",
    "out",
    type=click.Path(file_okay=False),
    default=None,
    help="Write a prepared copy of the dataset (meta, data, videos) here instead of working in "
    "place.",
)
@click.option(
    "--force", is_flag=True, help="Re-encode every file, also those that meet the target."
)
@no_wait_option
@json_option
@quiet_option
def prep_videos_command(
    root: str,
    codec: str | None,
    gop: int,
    crf: int,
    no_faststart: bool,
    min_psnr: float,
    timing_frames: int,
    out: str | None,
    force: bool,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Bring ROOT's mp4s to the random-access target, in place or into --out.

    A file already meets it when its codec is one the loader decodes (the --codec asked, when
    given), its keyframes are at most --gop frames apart and every episode starts on a keyframe
    (LeRobot's default AV1 does): it is left as it is (--force re-encodes it). The others are
    re-encoded (codec, GOP, CRF, faststart), each verified (same frames at the same timestamps,
    PSNR >= --min-psnr) before it atomically replaces anything; a rerun skips files already
    done. Needs PyAV (pip install 'episodekit[video]'). Exit 1 when a file fails verification.
    """
    from episodekit.core.progress import current
    from episodekit.prep.videos import format_result, rewrite_videos

    current().stage("prep videos")
    result = rewrite_videos(
        root,
        codec=codec,
        gop=gop,
        crf=crf,
        faststart=not no_faststart,
        min_psnr=min_psnr,
        force=force,
        timing_frames=timing_frames,
        progress=current().step,
        out=out,
        wait=not no_wait,
    )
    click.echo(jsonout.dumps(result.to_dict(), indent=2) if as_json else format_result(result))
    if result.failed:
        sys.exit(1)


@prep_group.command("frames")
@root_argument()
@click.option(
    "--store",
    "store",
    type=click.Path(file_okay=False),
    default=None,
    help="Store directory (default: a folder per dataset under $EPISODEKIT_CACHE, else "
    "~/.cache/episodekit/frames/).",
)
@force_option
@jobs_option
@json_option
@quiet_option
def frames_command(
    root: str, store: str | None, force: bool, jobs: int | None, as_json: bool
) -> None:
    """Decode ROOT's fixed-width columns once into a memory-mapped frame store.

    Every numeric scalar and fixed-size list column (action, observation.state, timestamp,
    indices...) becomes one .npy with a row per frame, next to the episode bounds and a manifest
    (format version, episodes fingerprint, each data file's size/mtime/footer hash). FrameDataset
    then reads random frames from it at memory speed, one copy per node through the page cache;
    images, strings and videos stay in parquet. Built in a temporary folder, verified against
    what was decoded, then published by rename; a fresh store is left alone (--force rebuilds).

    ROOT is a local path or an fsspec URL (the store is always local).
    """
    from episodekit.core.progress import current
    from episodekit.prep.frames import build_frame_store, format_report

    current().stage("prep frames")
    bar: dict = {}

    def progress(done: int, total: int) -> None:
        if "task" not in bar:  # the total is known once the build starts
            bar["task"] = current().task(total, label="prep frames")
        bar["task"].advance(1)

    try:
        report = build_frame_store(root, store=store, force=force, jobs=jobs, progress=progress)
    finally:
        if "task" in bar:
            bar["task"].close()
    click.echo(jsonout.dumps(report.summary(), indent=2) if as_json else format_report(report))
