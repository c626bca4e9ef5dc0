"""``episodekit prep videos``: re-encode a root's mp4s for random access, verified, atomically.

Random access into a video costs a seek plus decoding from the keyframe before the wanted frame:
with a GOP of 250 that is ~125 frames per sample, with a GOP of 2 at most one extra. Each mp4 is
re-encoded (codec, GOP, CRF, ``faststart``) keeping every frame's timestamp and a keyframe at
every episode start, then verified before it replaces the source: the same number of frames at
exactly the same timestamps, and PSNR against the source decode >= ``min_psnr`` dB. A file is
written to a temporary sibling and moved over the source with ``os.replace``, so a killed run
leaves every mp4 either old or new; the settings are recorded in the file's ``comment`` tag, so
a rerun skips files already done and finishes the rest. ``info.json``'s ``video.codec`` and
``video.pix_fmt`` are updated once every file of a camera is done.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.core.atomic import atomic_path, atomic_write_text, is_temp_name
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem
from episodekit.core.executor import imap_files
from episodekit.core.paths import INFO_FILE, VIDEO_CODECS
from episodekit.core.video import (
    VideoError,
    VideoWriter,
    canonical_codec,
    container_comment,
    probe,
    random_access_seconds,
    require_av,
)

PREP_TAG = "episodekit prep videos"
DEFAULT_GOP = 2
DEFAULT_CRF = 30
DEFAULT_MIN_PSNR = 35.0
TIMING_FRAMES = 16


@dataclass
class VideoFileResult:
    """One mp4: ``status`` rewritten / skipped (already at these settings) / failed."""

    file: str
    status: str
    frames: int = 0
    psnr_db: float | None = None
    bytes_before: int = 0
    bytes_after: int = 0
    access_fps_before: float | None = None
    access_fps_after: float | None = None
    message: str = ""


@dataclass
class VideoPrepResult:
    root: str
    settings: dict
    files: list[VideoFileResult] = field(default_factory=list)
    info_updated: bool = False
    seconds: float = 0.0

    @property
    def failed(self) -> list[VideoFileResult]:
        return [f for f in self.files if f.status == "failed"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "settings": self.settings,
            "info_updated": self.info_updated,
            "seconds": round(self.seconds, 3),
            "files": [asdict(f) for f in self.files],
        }


def settings_tag(codec: str, gop: int, crf: int, faststart: bool) -> str:
    """The ``comment`` tag a re-encoded file carries (what a rerun compares)."""
    return json.dumps(
        {"tool": PREP_TAG, "codec": codec, "gop": gop, "crf": crf, "faststart": faststart},
        sort_keys=True,
    )


def _psnr(mse: float) -> float:
    return float("inf") if mse <= 0 else float(10 * np.log10(255.0**2 / mse))


def reencode_file(
    path: str | os.PathLike,
    episode_start_frames: np.ndarray,
    codec: str = "av1",
    gop: int = DEFAULT_GOP,
    crf: int = DEFAULT_CRF,
    faststart: bool = True,
    min_psnr: float = DEFAULT_MIN_PSNR,
) -> tuple[int, float]:
    """Re-encode one mp4 in place (atomically) and return (frames, PSNR dB vs the source decode).

    Keyframes at ``episode_start_frames`` (positions in the file) and every ``gop`` frames;
    every frame keeps its pts. Raises :class:`VideoError` (source untouched) when the new file's
    frame count or timestamps differ from the source's, or its PSNR is below ``min_psnr``.
    """
    av = require_av()
    path = Path(path)
    src = probe(path, demux=True)
    starts = set(src.pts[np.asarray(episode_start_frames, dtype=np.int64)].tolist())
    tag = settings_tag(codec, gop, crf, faststart)
    with atomic_path(path) as tmp:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            with VideoWriter(
                tmp,
                src.width,
                src.height,
                round(src.fps) or 30,
                codec=codec,
                gop=gop,
                crf=crf,
                faststart=faststart,
                time_base=src.time_base,
                comment=tag,
            ) as writer:
                for frame in container.decode(stream):
                    writer.write_frame(frame, frame.pts, frame.pts in starts)
        new = probe(tmp, demux=True)
        if new.num_frames != src.num_frames or not np.array_equal(new.pts, src.pts):
            raise VideoError(
                f"re-encoded file has {new.num_frames} frames (source {src.num_frames}) or "
                "different timestamps; source kept",
                str(path),
            )
        missing = sorted(starts - set(new.pts[new.keyframe].tolist()))
        if missing:
            raise VideoError(f"episode start at pts {missing[0]} is not a keyframe", str(path))
        psnr = _compare(path, tmp)
        if psnr < min_psnr:
            raise VideoError(
                f"PSNR {psnr:.1f} dB vs the source is below {min_psnr:g} dB; source kept "
                "(lower --crf)",
                str(path),
            )
    return src.num_frames, psnr


def _compare(a: Path, b: Path) -> float:
    """PSNR (dB) of ``b``'s decode against ``a``'s over every frame, on the planar YUV planes."""
    av = require_av()
    sq, n = 0.0, 0
    with av.open(str(a)) as ca, av.open(str(b)) as cb:
        sa, sb = ca.streams.video[0], cb.streams.video[0]
        sa.thread_type = sb.thread_type = "AUTO"
        for fa, fb in zip(ca.decode(sa), cb.decode(sb)):
            x = fa.reformat(format="yuv420p").to_ndarray().astype(np.int32)
            y = fb.reformat(format="yuv420p").to_ndarray().astype(np.int32)
            sq += float(((x - y) ** 2).sum())
            n += x.size
    return _psnr(sq / max(1, n))


def _clean_temps(folder: Path) -> None:
    for p in folder.iterdir():
        if is_temp_name(p.name) and p.name.startswith(".file-"):
            p.unlink(missing_ok=True)


def rewrite_videos(
    root: str,
    codec: str = "av1",
    gop: int = DEFAULT_GOP,
    crf: int = DEFAULT_CRF,
    faststart: bool = True,
    min_psnr: float = DEFAULT_MIN_PSNR,
    force: bool = False,
    timing_frames: int = TIMING_FRAMES,
    progress: Any = None,
    executor: str = "local",
    jobs: int | None = 1,
) -> VideoPrepResult:
    """Re-encode every referenced mp4 of a local v3.0 ``root`` for random access (see the module
    docstring). ``timing_frames``: random frames timed per file before and after (0: no timing).
    Files that fail verification are reported and left as they were. Files are re-encoded one
    at a time here (``jobs=1``; the encoder has its own threads), by ``jobs`` processes, or one
    Ray task each with ``executor="ray"`` (the root on a filesystem every node mounts)."""
    require_av()
    if codec not in VIDEO_CODECS:
        raise ValueError(f"codec must be one of {VIDEO_CODECS}, got {codec!r}")
    if gop < 1:
        raise ValueError("gop must be >= 1")
    t0 = time.perf_counter()
    ds = open_dataset(root)
    if not ds.is_local:
        raise ValueError("prep videos rewrites files in place: ROOT must be a local folder")
    if ds.version != "v3.0":
        raise ValueError("prep videos handles v3.0 roots (one mp4 per camera file)")
    if not os.access(ds.join("meta"), os.W_OK):
        raise EnvironmentProblem("root is read-only; prep videos rewrites it in place", root)
    settings = {"codec": codec, "gop": gop, "crf": crf, "faststart": faststart}
    result = VideoPrepResult(root=str(root), settings={**settings, "min_psnr": min_psnr})
    tag = settings_tag(codec, gop, crf, faststart)
    jobs_of: dict[str, list[_VideoJob]] = {}
    for key in ds.video_keys:
        jobs_of[key] = _video_jobs(ds, key, force, tag)
    todo = [j for js in jobs_of.values() for j in js]
    options = (codec, gop, crf, faststart, min_psnr, timing_frames)

    known = lambda job: job.result  # noqa: E731 - missing or already done: no worker needed
    for i, res in imap_files(_video_job, todo, executor, jobs, quick=known, shared=options):
        todo[i].result = res
        if progress and res.status != "skipped":
            progress(
                f"re-encoded {res.file}" if res.status == "rewritten" else f"failed {res.file}"
            )
    for folder in {Path(j.full).parent for j in todo if j.first_frames is not None}:
        _clean_temps(folder)  # a job killed with its node (retried elsewhere) left its temp
    done_keys = []
    for key, js in jobs_of.items():
        result.files += [j.result for j in js]
        if all(j.result.status != "failed" for j in js):
            done_keys.append(key)
    result.info_updated = _update_info(ds, done_keys, codec)
    result.seconds = time.perf_counter() - t0
    return result


@dataclass
class _VideoJob:
    """One mp4 to look at: its path, the frames its episodes start at, and (after) its result."""

    rel: str
    full: str
    first_frames: np.ndarray | None  # None: missing, or already at the settings
    result: VideoFileResult | None = None


def _video_jobs(ds: Any, key: str, force: bool, tag: str) -> list[_VideoJob]:
    """The mp4s of camera ``key`` with the episode-start frames of each (files missing or
    already done get their result now)."""
    chunk = ds.column(f"videos/{key}/chunk_index")
    fidx = ds.column(f"videos/{key}/file_index")
    start = ds.column(f"videos/{key}/from_timestamp").astype(np.float64)
    out = []
    for c, f in sorted(set(zip(chunk.tolist(), fidx.tolist()))):
        rel = ds.video_path(key, int(c), int(f))
        full = Path(ds.join(rel))
        job = _VideoJob(rel, str(full), None)
        if not full.exists():
            job.result = VideoFileResult(rel, "failed", message="file is missing")
        else:
            _clean_temps(full.parent)
            if not force and container_comment(full) == tag:
                job.result = VideoFileResult(rel, "skipped", bytes_before=full.stat().st_size)
            else:
                rows = np.flatnonzero((chunk == c) & (fidx == f))
                job.first_frames = np.rint(start[rows] * ds.fps).astype(np.int64)
        out.append(job)
    return out


def _video_job(job: _VideoJob, options: tuple) -> VideoFileResult:
    """Re-encode one mp4 (an executor job)."""
    codec, gop, crf, faststart, min_psnr, timing_frames = options
    full = Path(job.full)
    entry = VideoFileResult(job.rel, "rewritten", bytes_before=full.stat().st_size)
    try:
        if timing_frames:
            entry.access_fps_before = 1 / random_access_seconds(full, timing_frames)
        entry.frames, entry.psnr_db = reencode_file(
            full, job.first_frames, codec, gop, crf, faststart, min_psnr
        )
        if timing_frames:
            entry.access_fps_after = 1 / random_access_seconds(full, timing_frames)
    except (VideoError, DatasetError, IndexError) as exc:
        entry.status, entry.message = "failed", str(exc)
    entry.bytes_after = full.stat().st_size
    return entry


def _update_info(ds: Any, keys: list[str], codec: str) -> bool:
    """Set ``video.codec``/``video.pix_fmt`` of ``keys`` in info.json (atomic; only if changed)."""
    path = ds.join(INFO_FILE)
    with open(path, encoding="utf-8") as fh:
        info = json.load(fh)
    changed = False
    for key in keys:
        vinfo = info["features"][key].setdefault("info", {})
        for field_name, value in (("video.codec", codec), ("video.pix_fmt", "yuv420p")):
            current = vinfo.get(field_name)
            same = canonical_codec(current) == value if field_name == "video.codec" else False
            if current != value and not same:
                vinfo[field_name] = value
                changed = True
    if changed:
        atomic_write_text(path, json.dumps(info, indent=4))
    return changed


def format_result(result: VideoPrepResult) -> str:
    """Human summary: one line per file, then totals."""
    lines = [f"prep videos {result.root}  ({result.seconds:.1f}s) settings {result.settings}"]
    lines.append(
        f"  {'file':<58} {'status':<9} {'frames':>6} {'PSNR dB':>7} {'MB before':>9} "
        f"{'MB after':>8} {'rand fps before':>15} {'after':>7}"
    )
    for f in result.files:
        psnr = f"{f.psnr_db:.1f}" if f.psnr_db is not None else "-"
        fb = f"{f.access_fps_before:.1f}" if f.access_fps_before else "-"
        fa = f"{f.access_fps_after:.1f}" if f.access_fps_after else "-"
        lines.append(
            f"  {f.file:<58} {f.status:<9} {f.frames:>6} {psnr:>7} "
            f"{f.bytes_before / 1e6:>9.2f} {f.bytes_after / 1e6:>8.2f} {fb:>15} {fa:>7}"
        )
        if f.message:
            lines.append(f"    {f.message}")
    n = {s: sum(f.status == s for f in result.files) for s in ("rewritten", "skipped", "failed")}
    lines.append(
        f"{n['rewritten']} rewritten, {n['skipped']} skipped, {n['failed']} failed; "
        f"info.json {'updated' if result.info_updated else 'unchanged'}"
    )
    return "\n".join(lines)
