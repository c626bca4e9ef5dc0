"""CLI: `episodekit prep rowgroups` and `prep frames`, thin shells over episodekit.prep
(rewrite_rowgroups, build_frame_store)."""

from __future__ import annotations

import json
import sys
import time

import click

from episodekit.cli.common import (
    deprecated_alias,
    executor_option,
    fail_cleanly,
    force_option,
    jobs_option,
    json_option,
    no_wait_option,
    pick,
    quiet_option,
    target_mb_option,
)
from episodekit.core.paths import COMPRESSIONS, VIDEO_CODECS


@click.group("prep")
def prep_group() -> None:
    """Prepare data files for fast reading: parquet row groups (rowgroups), a decoded frame
    store for random access (frames)."""


@prep_group.command("rowgroups")
@click.argument("root")
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
    quiet: bool,
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
    from episodekit.prep import format_report, rewrite_rowgroups

    state = {"mb": 0.0, "t0": time.perf_counter()}
    bar = None
    if not quiet:
        bar = click.progressbar(
            length=1, label="prep rowgroups", file=sys.stderr, show_pos=True, width=24
        )

    def progress(result, done: int, total: int) -> None:
        if bar is None:
            return
        state["mb"] += result.bytes / 2**20
        rate = state["mb"] / max(time.perf_counter() - state["t0"], 1e-9)
        bar.length = total
        bar.label = f"prep: {done}/{total} files, {state['mb']:.0f} MiB, {rate:.0f} MiB/s"
        bar.update(1)

    with fail_cleanly():
        try:
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
        finally:
            if bar is not None:
                bar.render_finish()
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


@prep_group.command("videos")
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--codec",
    type=click.Choice(VIDEO_CODECS),
    default="av1",
    show_default=True,
    help="Output codec: av1 (libsvtav1) or h264 (libx264).",
)
@click.option(
    "--gop",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Keyframe interval (random access decodes at most GOP-1 extra frames).",
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
    help="Random frames timed per file before/after (0: no timing).",
)
@force_option
@json_option
@quiet_option
def prep_videos_command(
    root: str,
    codec: str,
    gop: int,
    crf: int,
    no_faststart: bool,
    min_psnr: float,
    timing_frames: int,
    force: bool,
    as_json: bool,
    quiet: bool,
) -> None:
    """Re-encode ROOT's mp4s for random access (GOP, codec, CRF, faststart), in place.

    Each file is verified (same frames at the same timestamps, PSNR >= --min-psnr) before it
    atomically replaces the source; a rerun skips files already done. Needs PyAV
    (pip install 'episodekit[video]'). Exit 1 when a file fails verification.
    """
    from episodekit.prep.videos import format_result, rewrite_videos

    say = None if quiet or as_json else (lambda m: click.echo(m, err=True))
    with fail_cleanly():
        result = rewrite_videos(
            root,
            codec=codec,
            gop=gop,
            crf=crf,
            faststart=not no_faststart,
            min_psnr=min_psnr,
            force=force,
            timing_frames=timing_frames,
            progress=say,
        )
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else format_result(result))
    if result.failed:
        sys.exit(1)


@prep_group.command("frames")
@click.argument("root")
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
    root: str, store: str | None, force: bool, jobs: int | None, as_json: bool, quiet: bool
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
    from episodekit.core.errors import EnvironmentProblem
    from episodekit.prep.frames import build_frame_store, format_report

    bar = None
    if not quiet:
        bar = click.progressbar(length=1, label="prep frames", file=sys.stderr, width=24)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.length = total
            bar.label = f"prep frames: {done}/{total} files"
            bar.update(1)

    with fail_cleanly():
        try:
            report = build_frame_store(root, store=store, force=force, jobs=jobs, progress=progress)
        except EnvironmentProblem as exc:
            click.echo(f"Error: {exc}", err=True)
            sys.exit(exc.exit_code)
        finally:
            if bar is not None:
                bar.render_finish()
    click.echo(json.dumps(report.summary(), indent=2) if as_json else format_report(report))
