"""Rewrite every data file of a dataset into ~32 MiB episode-aligned row groups with page index.

In place for a local root, or into a complete copy (``out``) -- the way remote roots (any fsspec
URL) are handled: read remote, write local. Files are independent and run one process each
(``executor`` "local" or "ray"); the result is a :class:`PrepReport` with one
:class:`~episodekit.prep.rewrite.FileResult` per file and a before/after summary.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.core import staging
from episodekit.core.atomic import remove_temporaries
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.executor import imap_files
from episodekit.core.lock import remove_if_only_lock, writer_lock
from episodekit.core.options import with_overrides
from episodekit.core.outdir import check_output_dir, mark_output_dir, resolve_output
from episodekit.core.paths import (
    COMPRESSIONS,
    DEFAULT_TARGET_MB,
    MIB,
    check_target_mb,
    inside_root,
    target_bytes,
)
from episodekit.prep.outcopy import CopyRecord, copy_tree, gone_from_source, source_keys
from episodekit.prep.rewrite import (
    FileJob,
    FileResult,
    LayoutStats,
    done_already,
    rewrite_file,
)


@dataclass
class PrepReport:
    """What a rewrite run did: per-file results (in data-file order) and the wall time."""

    root: str
    out: str
    target_mb: float
    dry_run: bool
    files: list[FileResult] = field(default_factory=list)
    seconds: float = 0.0
    removed_temporaries: int = 0
    copied: list[str] = field(default_factory=list)  # --out: meta/ and videos/ files copied

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.files)

    @property
    def failed(self) -> list[FileResult]:
        return [r for r in self.files if r.status == "failed"]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def rewritten_bytes(self) -> int:
        """Uncompressed bytes of the files rewritten in this run."""
        return sum(r.bytes for r in self.files if r.status == "rewritten")

    @property
    def mb_per_s(self) -> float:
        return self.rewritten_bytes / MIB / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict:
        """Before/after figures as plain data (for JSON output and ``prepare``)."""
        return {
            "root": self.root,
            "out": self.out,
            "target_mb": self.target_mb,
            "dry_run": self.dry_run,
            "counts": {s: self.count(s) for s in ("rewritten", "skipped", "copied", "planned")}
            | {"failed": len(self.failed)},
            "before": _side([r.before for r in self.files]),
            "after": _side([r.after for r in self.files]),
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.mb_per_s, 1),
            "failed": [{"path": r.path, "reason": r.reason} for r in self.failed],
        }


def _side(stats: list[LayoutStats | None]) -> dict:
    present = [s for s in stats if s is not None]
    sizes = np.array([b for s in present for b in s.row_group_bytes], dtype=np.float64) / MIB
    return {
        "files": len(present),
        "row_groups": int(sum(s.row_groups for s in present)),
        "rg_mib_min": float(sizes.min()) if len(sizes) else 0.0,
        "rg_mib_median": float(np.median(sizes)) if len(sizes) else 0.0,
        "rg_mib_max": float(sizes.max()) if len(sizes) else 0.0,
        "page_index": int(sum(s.has_page_index for s in present)),
        "file_mib": sum(s.file_size for s in present) / MIB,
    }


def format_report(report: PrepReport) -> str:
    """The before/after table printed at the end of a run."""
    s = report.summary()
    lines = [
        f"{'':8}{'files':>7}{'row groups':>12}{'rg MiB min/median/max':>26}"
        f"{'page index':>12}{'file MiB':>10}"
    ]
    for side in ("before", "after"):
        d = s[side]
        rg = f"{d['rg_mib_min']:.2f} / {d['rg_mib_median']:.2f} / {d['rg_mib_max']:.2f}"
        lines.append(
            f"{side:8}{d['files']:>7}{d['row_groups']:>12}{rg:>26}"
            f"{str(d['page_index']) + '/' + str(d['files']):>12}{d['file_mib']:>10.1f}"
        )
    c = s["counts"]
    lines.append(
        ", ".join(f"{k} {v}" for k, v in c.items() if v or k in ("rewritten", "failed"))
        + f"; {report.seconds:.1f} s, {report.mb_per_s:.0f} MiB/s"
        f" ({report.rewritten_bytes / MIB:.0f} MiB uncompressed rewritten)"
    )
    if report.removed_temporaries:
        lines.append(f"removed {report.removed_temporaries} leftover temporary files")
    for r in report.failed:
        lines.append(f"FAILED {r.reason}")
    return "\n".join(lines)


def _protocols(fs) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


@dataclass(frozen=True)
class RowGroupOptions:
    """How :func:`rewrite_rowgroups` runs (its target and output are arguments of their own):
    ``workers`` processes (None: cores) on ``executor``, output ``compression`` ("keep": the
    source's), ``dry_run``, ``force`` (rewrite files already done), ``copy_videos`` into
    ``out``, ``progress(result, done, total)``, ``wait`` for another writer's lock, ``stage``
    the ``out`` copy (False: the caller stages it)."""

    workers: int | None = None
    compression: str = "keep"
    dry_run: bool = False
    force: bool = False
    executor: str = "local"
    copy_videos: bool = False
    progress: Callable[[FileResult, int, int], None] | None = None
    wait: bool = True
    stage: bool = True


def rewrite_rowgroups(
    root: str,
    target_mb: float = DEFAULT_TARGET_MB,
    out: str | None = None,
    options: RowGroupOptions | None = None,
    **overrides: Any,
) -> PrepReport:
    """Rewrite the data files of ``root`` (local path or fsspec URL); see the module docstring.

    ``out``: write a complete copy there (meta/ always, videos/ when ``copy_videos``) instead of
    rewriting in place; required for a remote root. The copy is built in a hidden staging folder
    next to ``out`` (:mod:`episodekit.core.staging`) and published at once when every file made
    it: a failure (a full disk, a file that fails) leaves ``out`` as it was. ``stage=False``:
    write into ``out`` directly (a caller that stages ``out`` itself: ``prepare --out``). Files
    already done (marked for this target, or already within the band with a page index) are
    skipped, or copied unchanged to ``out``. A rerun into the same ``out`` copies or rewrites
    only what changed at the source since (:mod:`episodekit.prep.outcopy`): what later steps
    made of the copies there stays (the staging folder is seeded with it).
    ``progress(result, done, total)`` is called in the parent as each file finishes. Leftover
    temporaries of a crashed run are removed first, under the output's writer lock (another
    writer: wait, or with ``wait=False`` raise EnvironmentProblem). Per-file failures are in the
    report. ``options`` (:class:`RowGroupOptions`; keyword arguments override its fields).
    """
    o = with_overrides(RowGroupOptions, options, overrides)
    compression, dry_run, copy_videos = o.compression, o.dry_run, o.copy_videos
    wait, stage = o.wait, o.stage
    check_target_mb(target_mb)
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    t0 = time.perf_counter()
    ds = open_dataset(str(root))
    final = None  # --out: the folder published at the end (the work happens in a staging one)
    if out is None:
        if not ds.is_local:
            raise ValueError(f"{root} is not a local path: pass out=DIR (read remote, write local)")
        out_root = Path(ds.path)
    elif not stage:  # a caller that stages --out itself (prepare --out) checked it already
        out_root = resolve_output(out)
    else:
        # before anything is written (a dry run says what the run would): symlinks resolved, a
        # user's folder is never overwritten, and the copy never lands in (or around) the source
        out_root = check_output_dir(out, sources=[ds.path] if ds.is_local else [])
        final = None if dry_run else out_root
    report = PrepReport(str(root), str(out_root), float(target_mb), dry_run)
    source = str(Path(ds.path).resolve()) if ds.is_local else ds.root
    if dry_run:
        record = CopyRecord(out_root, source) if out is not None else None
        keys = source_keys(ds.fs, ds.path, "data") if record is not None else {}
        results = _run_jobs(ds, out_root, target_mb, o, record, keys)
    else:
        created = not out_root.exists()
        try:
            with writer_lock(out_root, wait=wait) as removed:
                report.removed_temporaries = len(removed)
                work, gone = _start(ds, out_root, final, source)
                try:
                    record = CopyRecord(work, source) if out is not None else None
                    keys = source_keys(ds.fs, ds.path, "data") if record is not None else {}
                    if record is not None:
                        for rel in gone:  # their copies were not carried over
                            record.note(rel, None)
                        mark_output_dir(work, "a prepared copy")
                        for sub in ("meta", "videos") if copy_videos else ("meta",):
                            report.copied += copy_tree(ds.fs, ds.path, work, sub, record)
                    results = _run_jobs(ds, work, target_mb, o, record, keys)
                    # a job killed with its node (Ray retries it elsewhere) left its temporary
                    report.removed_temporaries += len(remove_temporaries(work / "data"))
                    files = [r for r in results if r is not None]
                    if record is not None:
                        for res in files:
                            if res.status != "failed":
                                record.note(res.path, keys.get(res.path))
                        record.save()
                    if final is not None:
                        _finish(work, final, files)
                    env = [r for r in files if r.environment]
                    if env:  # read-only or full disk: cannot run here (exit 2), not a bad file
                        raise EnvironmentProblem(env[0].reason)
                except BaseException:
                    if final is not None:
                        staging.discard(work, final)
                    raise
        except BaseException:
            if created and final is not None:
                remove_if_only_lock(final)
            raise
    report.files = [r for r in results if r is not None]
    report.seconds = time.perf_counter() - t0
    return report


def _start(ds, out_root: Path, final: Path | None, source: str) -> tuple[Path, set[str]]:
    """Where the files are written: the root itself (in place), ``--out`` as given (a caller
    that stages it), or a fresh staging folder next to ``--out`` seeded with hard links of what
    an earlier run left there: with its copy record of this source, everything but the copies
    of source files gone since (unchanged copies and later steps' work stay; the record tells
    a rerun they are done), else its data files (already rewritten files are skipped, not
    redone). Also returns the recorded copies left behind (their source files are gone)."""
    if final is None:
        return out_root, set()
    staging.remove_stale(final)
    work = staging.new_staging(final)
    record = CopyRecord(final, source)
    gone = gone_from_source(ds.fs, ds.path, record)
    if record.files:
        staging.seed_from(final, work, skip=gone)
    else:
        staging.seed_from(final, work, only=set(ds.data_files))
    return work, gone


def _finish(work: Path, final: Path, results: list[FileResult]) -> None:
    """Publish the staged copy when every file made it; else publish nothing, and say so in
    the failures (named as the files under ``final`` they were going to be)."""
    failed = [r for r in results if r.status == "failed"]
    if not failed:
        staging.publish(work, final)
        return
    staging.discard(work, final)
    for r in failed:
        r.reason = r.reason.replace(str(work), str(final)) + " (nothing was published)"


def done_in_place(ds, target_mb: float) -> bool:
    """Whether every data file of the local ``ds`` is already done for ``target_mb`` (marked
    for this target, or within the band with a page index): footers only, nothing written."""
    target = target_bytes(target_mb)
    for rel in ds.data_files:
        path = ds.join(rel)
        if done_already(FileJob(rel, path, path, target)) is None:
            return False
    return True


def _run_jobs(
    ds,
    work: Path,
    target_mb: float,
    o: RowGroupOptions,
    record: CopyRecord | None,
    keys: dict[str, str | None],
) -> list[FileResult | None]:
    """Rewrite (or plan) every data file of ``ds`` into ``work``; results in file order.
    ``record`` (``--out``): what the copies already in ``work`` were made from; ``keys``: the
    source data files' keys (:func:`episodekit.prep.outcopy.source_keys`)."""
    compression, force, dry_run, workers = o.compression, o.force, o.dry_run, o.workers
    src_fs = None if ds.is_local else ds.fs
    if src_fs is not None and "memory" in _protocols(src_fs):
        workers = 1  # an in-memory filesystem is not shared with worker processes
    target = target_bytes(target_mb)
    jobs = [
        FileJob(
            relpath=rel,
            src=ds.join(rel),
            dst=inside_root(work, rel),  # no symlinked folder may lead the write out
            target_bytes=target,
            compression=compression,
            force=force,
            dry_run=dry_run,
            fs=src_fs,
            same_source=record.same(rel, keys.get(rel)) if record is not None else None,
        )
        for rel in ds.data_files
    ]
    results: list[FileResult | None] = [None] * len(jobs)
    runs = imap_files(rewrite_file, jobs, o.executor, workers, quick=done_already)
    with contextlib.closing(runs):  # on an error, the pool ends here: before a discard
        for done, (i, res) in enumerate(runs, start=1):
            results[i] = res
            if o.progress is not None:
                o.progress(res, done, len(jobs))
    return results
