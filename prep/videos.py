"""``episodekit prep videos``: bring a root's mp4s to the random-access target, verified.

Random access into a video costs a seek plus decoding from the keyframe before the wanted frame:
with a GOP of 250 that is ~125 frames per sample, with a GOP of 2 at most one extra. A file that
already meets the target (:mod:`episodekit.prep.video_target`: a codec the loader decodes,
keyframes at most ``gop`` apart, a keyframe at every episode start) is left alone, since a
re-encode would only lose quality; ``force`` re-encodes it anyway. The others are re-encoded
(codec, GOP, CRF, ``faststart``) keeping every frame's timestamp and a keyframe at every episode
start, then verified before they replace anything: the same number of frames at exactly the same
timestamps, and PSNR against the source decode >= ``min_psnr`` dB. A file is written to a
temporary sibling and moved into place with ``os.replace``, so a killed run leaves every mp4
either old or new; the settings are recorded in the file's ``comment`` tag. The files of one
camera keep one codec and pixel format: when one of them is re-encoded, those that differ are
too. info.json's ``video.codec`` and ``video.pix_fmt`` follow the files.

In place, or into ``out``: a prepared copy of the dataset (meta/, data/, and the videos: copied
when they meet the target, re-encoded from the source when not), under the output's writer lock
and marker, refused when the folder holds someone else's files or overlaps the source. A rerun
skips every file already there (same size and modification time for a copy; this tool's tag and
the source's exact timestamps for a re-encode).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.core.atomic import atomic_path, atomic_write_text, remove_temporaries
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import DatasetError, EnvironmentProblem
from episodekit.core.executor import imap_files
from episodekit.core.lock import writer_lock
from episodekit.core.options import with_overrides
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.paths import INFO_FILE, VIDEO_CODECS, inside_root
from episodekit.core.video import (
    VideoError,
    VideoIndex,
    VideoWriter,
    canonical_codec,
    container_comment,
    probe,
    random_access_seconds,
    require_av,
)
from episodekit.prep.rewrite import copy_file
from episodekit.prep.video_target import Target, start_positions, target_problem

PREP_TAG = "episodekit prep videos"
DEFAULT_CODEC = "av1"  # what re-encoded files get when no codec is asked for
DEFAULT_GOP = 2
DEFAULT_CRF = 30
DEFAULT_MIN_PSNR = 35.0
TIMING_FRAMES = 16
OUT_PIX_FMT = "yuv420p"
STATUSES = ("rewritten", "copied", "skipped", "failed")


@dataclass
class VideoFileResult:
    """One mp4: ``status`` rewritten (re-encoded) / copied (``out``: unchanged) / skipped / failed;
    ``message`` says why."""

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
    out: str | None = None
    files: list[VideoFileResult] = field(default_factory=list)
    info_updated: bool = False
    dataset_files_copied: int = 0  # ``out``: meta/ and data/ files copied in this run
    seconds: float = 0.0

    @property
    def failed(self) -> list[VideoFileResult]:
        return [f for f in self.files if f.status == "failed"]

    def count(self, status: str) -> int:
        return sum(f.status == status for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "out": self.out,
            "settings": self.settings,
            "counts": {s: self.count(s) for s in STATUSES},
            "info_updated": self.info_updated,
            "dataset_files_copied": self.dataset_files_copied,
            "seconds": round(self.seconds, 3),
            "files": [asdict(f) for f in self.files],
        }


def settings_tag(codec: str, gop: int, crf: int, faststart: bool) -> str:
    """The ``comment`` tag a re-encoded file carries."""
    return json.dumps(
        {"tool": PREP_TAG, "codec": codec, "gop": gop, "crf": crf, "faststart": faststart},
        sort_keys=True,
    )


def _ours(comment: str | None) -> bool:
    try:
        return json.loads(comment or "").get("tool") == PREP_TAG
    except (ValueError, AttributeError):
        return False


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
    dst: str | os.PathLike | None = None,
) -> tuple[int, float]:
    """Re-encode the mp4 ``path`` into ``dst`` (default: over itself), atomically, and return
    (frames, PSNR dB vs the source decode).

    Keyframes at ``episode_start_frames`` (positions in the file) and every ``gop`` frames;
    every frame keeps its pts. Raises :class:`VideoError` (nothing replaced) when the new file's
    frame count or timestamps differ from the source's, or its PSNR is below ``min_psnr``.
    """
    av = require_av()
    path = Path(path)
    src = probe(path, demux=True)
    starts = set(src.pts[np.asarray(episode_start_frames, dtype=np.int64)].tolist())
    tag = settings_tag(codec, gop, crf, faststart)
    with atomic_path(path if dst is None else dst) as tmp:
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
                pix_fmt=OUT_PIX_FMT,
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


@dataclass
class _VideoJob:
    """One mp4: where it is read and written, what to do with it (``action`` "encode", "copy";
    None: its ``result`` is known already), and the facts the info.json update needs."""

    rel: str
    src: str
    dst: str
    action: str | None = None
    first_frames: np.ndarray | None = None
    reason: str = ""
    codec: str | None = None  # after this run
    pix_fmt: str | None = None
    ours: bool = False  # re-encoded by this tool (now or earlier)
    frames: int = 0
    result: VideoFileResult | None = None


@dataclass(frozen=True)
class VideoOptions:
    """How :func:`rewrite_videos` runs: the target (``codec``, ``gop``), the encoder (``crf``,
    ``faststart``), the verification bar (``min_psnr``), ``force``, ``timing_frames``,
    ``progress`` (called with one line per file), ``executor``/``jobs`` and ``wait`` for
    another writer's lock."""

    codec: str | None = None
    gop: int = DEFAULT_GOP
    crf: int = DEFAULT_CRF
    faststart: bool = True
    min_psnr: float = DEFAULT_MIN_PSNR
    force: bool = False
    timing_frames: int = TIMING_FRAMES
    progress: Any = None
    executor: str = "local"
    jobs: int | None = 1
    wait: bool = True


def rewrite_videos(
    root: str,
    options: VideoOptions | None = None,
    out: str | None = None,
    **overrides: Any,
) -> VideoPrepResult:
    """Bring every referenced mp4 of a local v3.0 ``root`` to the random-access target (see the
    module docstring), in place or into ``out``.

    ``codec``: the codec files must have and re-encoded files get (None: any codec the loader
    decodes is kept, re-encoded files get :data:`DEFAULT_CODEC`). ``timing_frames``: random frames
    timed per re-encoded file before and after (0: no timing). Files that fail verification
    are reported and left as they were. Re-encodes run one at a time here (``jobs=1``; the
    encoder has its own threads), by ``jobs`` processes, or one Ray task each with
    ``executor="ray"`` (the root on a filesystem every node mounts). ``options``
    (:class:`VideoOptions`; keyword arguments override its fields)."""
    o = with_overrides(VideoOptions, options, overrides)
    codec, gop, crf, faststart, min_psnr = o.codec, o.gop, o.crf, o.faststart, o.min_psnr
    force, timing_frames, progress, executor, jobs = (
        o.force, o.timing_frames, o.progress, o.executor, o.jobs
    )  # fmt: skip
    require_av()
    if codec is not None and codec not in VIDEO_CODECS:
        raise ValueError(f"codec must be one of {VIDEO_CODECS}, got {codec!r}")
    if gop < 1:
        raise ValueError("gop must be >= 1")
    t0 = time.perf_counter()
    ds = open_dataset(root)
    if not ds.is_local:
        raise ValueError("prep videos reads the mp4s with PyAV: ROOT must be a local folder")
    if ds.version != "v3.0":
        raise ValueError("prep videos handles v3.0 roots (one mp4 per camera file)")
    src_root = Path(ds.path).resolve()
    if out is None:
        out_root = src_root
        if not os.access(ds.join("meta"), os.W_OK):
            raise EnvironmentProblem("root is read-only; prep videos rewrites it in place", root)
    else:
        # the one output-folder rule: symlinks resolved, never a user's folder, never the
        # source, a folder inside it or one around it
        out_root = check_output_dir(out, sources=[src_root])
    target = Target(gop, codec)
    settings = {"codec": codec, "gop": gop, "crf": crf, "faststart": faststart}
    result = VideoPrepResult(str(root), {**settings, "min_psnr": min_psnr}, out)
    options = (gop, crf, faststart, min_psnr, timing_frames)
    with writer_lock(out_root, wait=o.wait):
        if out is not None:
            mark_output_dir(out_root, "a prepared copy")
            result.dataset_files_copied = _copy_dataset(ds, src_root, out_root)
        cameras = {key: _camera_jobs(ds, key, target, force, out_root) for key in ds.video_keys}
        todo = [j for js in cameras.values() for j in js]
        known = lambda job: job.result  # noqa: E731 - decided while planning: no worker needed
        for i, res in imap_files(_video_job, todo, executor, jobs, quick=known, shared=options):
            todo[i].result = res
            if progress and todo[i].action is not None:
                verb = {"rewritten": "re-encoded", "copied": "copied"}.get(res.status, res.status)
                progress(f"{verb} {res.file}")
        remove_temporaries(out_root / "videos")  # a job killed with its node left its temp
        for js in cameras.values():
            result.files += [j.result for j in js]
        result.info_updated = _write_info(ds.join(INFO_FILE), out_root / INFO_FILE, cameras)
    result.seconds = time.perf_counter() - t0
    return result


def _copy_dataset(ds: Any, src_root: Path, out_root: Path) -> int:
    """Copy meta/ (but info.json, written after the videos) and the data files into ``out_root``;
    a file already there with the source's size and modification time is kept. The count."""
    rels = [str(p.relative_to(src_root)) for p in sorted((src_root / "meta").rglob("*"))]
    rels = [r for r in rels if r != INFO_FILE and not Path(r).name.startswith(".")]
    rels += list(ds.data_files)
    n = 0
    for rel in rels:
        src = Path(ds.safe_join(rel))
        if src.is_file():
            n += _sync_file(src, inside_root(out_root, rel))
    return n


def _sync_file(src: Path, dst: str | Path) -> bool:
    """Copy ``src`` to ``dst`` (atomic) unless ``dst`` has its size and modification time (set
    from the source at copy time, so a rerun recognizes its copies). True when copied."""
    st = src.stat()
    try:
        got = os.stat(dst)
        if got.st_size == st.st_size and got.st_mtime_ns == st.st_mtime_ns:
            return False
    except FileNotFoundError:
        pass
    copy_file(str(src), str(dst))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    return True


def _camera_jobs(ds: Any, key: str, target: Target, force: bool, out_root: Path) -> list[_VideoJob]:
    """The mp4s of camera ``key``: what each needs (planned from the sample tables alone)."""
    chunk = ds.column(f"videos/{key}/chunk_index")
    fidx = ds.column(f"videos/{key}/file_index")
    start = ds.column(f"videos/{key}/from_timestamp").astype(np.float64)
    out_codec = target.codec or DEFAULT_CODEC
    jobs: list[_VideoJob] = []
    indexes: list[VideoIndex | None] = []
    for c, f in sorted(set(zip(chunk.tolist(), fidx.tolist()))):
        rel = ds.video_path(key, int(c), int(f))
        job = _VideoJob(rel, ds.safe_join(rel), str(inside_root(out_root, rel)))
        jobs.append(job)
        indexes.append(None)
        if not os.path.exists(job.src):
            job.result = VideoFileResult(rel, "failed", message="file is missing")
            continue
        try:
            index = indexes[-1] = probe(job.src)
            job.ours = _ours(container_comment(job.src))
        except VideoError as exc:
            job.result = VideoFileResult(rel, "failed", message=str(exc))
            continue
        rows = np.flatnonzero((chunk == c) & (fidx == f))
        job.first_frames = start_positions(index, start[rows])
        job.codec, job.pix_fmt = index.codec, index.pix_fmt
        problem = "forced" if force else target_problem(index, job.first_frames, target)
        if problem:
            job.action, job.reason = "encode", problem
    encoding = any(j.action == "encode" for j in jobs)
    for job, index in zip(jobs, indexes):
        if encoding and index is not None and job.action is None:
            if (index.codec, index.pix_fmt) != (out_codec, OUT_PIX_FMT):
                job.action = "encode"
                job.reason = "re-encoded with the camera's other files (one codec per camera)"
        if job.action == "encode":
            job.codec, job.pix_fmt, job.ours = out_codec, OUT_PIX_FMT, True
            job.result = _already_encoded(job, index, out_codec, force)
        elif index is not None:
            _plan_unchanged(job, target, index.num_frames)
    return jobs


def _already_encoded(
    job: _VideoJob, index: VideoIndex | None, codec: str, force: bool
) -> VideoFileResult | None:
    """For ``out``: the output already holds this tool's re-encode of this source (same frame
    timestamps, the codec wanted): a skipped result; else None."""
    if force or job.src == job.dst or not os.path.exists(job.dst) or index is None:
        return None
    try:
        have = probe(job.dst)
        ours = _ours(container_comment(job.dst))
    except VideoError:
        return None
    if ours and have.codec == codec and np.array_equal(have.pts, index.pts):
        size = os.path.getsize(job.dst)
        job.action = None
        msg = "already re-encoded in the output"
        return VideoFileResult(job.rel, "skipped", index.num_frames, None, size, size, message=msg)
    return None


def _plan_unchanged(job: _VideoJob, target: Target, frames: int) -> None:
    """A file that meets the target: skipped in place, copied into ``out`` unless it is there."""
    size = os.path.getsize(job.src)
    why = f"meets the random-access target ({target.describe()})"
    job.frames = frames
    if job.src == job.dst:
        job.result = VideoFileResult(job.rel, "skipped", frames, None, size, size, message=why)
        return
    try:
        got = os.stat(job.dst)
        same = got.st_size == size and got.st_mtime_ns == os.stat(job.src).st_mtime_ns
    except FileNotFoundError:
        same = False
    if same:
        job.result = VideoFileResult(job.rel, "skipped", frames, None, size, size, message=why)
    else:
        job.action, job.reason = "copy", why


def _video_job(job: _VideoJob, options: tuple) -> VideoFileResult:
    """Re-encode or copy one mp4 (an executor job)."""
    gop, crf, faststart, min_psnr, timing_frames = options
    src, dst = Path(job.src), Path(job.dst)
    size = src.stat().st_size
    if job.action == "copy":
        _sync_file(src, dst)
        return VideoFileResult(job.rel, "copied", job.frames, None, size, size, message=job.reason)
    entry = VideoFileResult(job.rel, "rewritten", bytes_before=size, message=job.reason)
    try:
        if timing_frames:
            entry.access_fps_before = 1 / random_access_seconds(src, timing_frames)
        entry.frames, entry.psnr_db = reencode_file(
            src, job.first_frames, job.codec, gop, crf, faststart, min_psnr, dst=dst
        )
        if timing_frames:
            entry.access_fps_after = 1 / random_access_seconds(dst, timing_frames)
    except (VideoError, DatasetError, IndexError) as exc:
        entry.status, entry.message = "failed", str(exc)
    entry.bytes_after = dst.stat().st_size if dst.exists() else 0
    return entry


def _write_info(base: str | Path, dst: Path, cameras: dict[str, list[_VideoJob]]) -> bool:
    """Write ``dst`` = info.json ``base`` (the source's) with ``video.codec``/``video.pix_fmt``
    of every camera this tool re-encoded (now or earlier) set to what its files hold (one codec
    and pixel format, no file failed); atomic, only when it changes ``dst``. True when
    written."""
    with open(base, encoding="utf-8") as fh:
        info = json.load(fh)
    for key, jobs in cameras.items():
        kinds = {(j.codec, j.pix_fmt) for j in jobs}
        if any(j.result.status == "failed" for j in jobs) or len(kinds) != 1:
            continue
        if not any(j.ours for j in jobs):
            continue
        ((codec, pix_fmt),) = kinds
        vinfo = info["features"][key].setdefault("info", {})
        if canonical_codec(vinfo.get("video.codec")) != codec:
            vinfo["video.codec"] = codec
        vinfo["video.pix_fmt"] = pix_fmt
    try:
        with open(dst, encoding="utf-8") as fh:
            if json.load(fh) == info:
                return False
    except (OSError, ValueError):
        pass
    atomic_write_text(dst, json.dumps(info, indent=4))
    return True


def format_result(result: VideoPrepResult) -> str:
    """Human summary: one line per file, then totals and what a skip means."""
    where = f" -> {result.out}" if result.out else ""
    lines = [f"prep videos {result.root}{where}  ({result.seconds:.1f}s) {result.settings}"]
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
        if f.message and f.status in ("rewritten", "failed"):
            lines.append(f"    {f.message}")
    n = {s: result.count(s) for s in STATUSES}
    copied = f", {n['copied']} copied" if result.out else ""
    lines.append(
        f"{n['rewritten']} re-encoded{copied}, {n['skipped']} skipped, {n['failed']} failed; "
        f"info.json {'updated' if result.info_updated else 'unchanged'}"
    )
    fine = [f for f in result.files if f.message.startswith("meets the random-access target")]
    if fine:
        lines.append(
            f"{len(fine)} file(s) already meet the random-access target and were left as they "
            "are (--force re-encodes them)"
        )
    return "\n".join(lines)
