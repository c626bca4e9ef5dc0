"""Rewrite every data file of a dataset into ~32 MiB episode-aligned row groups with page index.

In place for a local root, or into a complete copy (``out``) -- the way remote roots (any fsspec
URL) are handled: read remote, write local. Files are independent and run one process each
(``executor`` "local" or "ray"); the result is a :class:`PrepReport` with one
:class:`~episodekit.prep.rewrite.FileResult` per file and a before/after summary.
"""

from __future__ import annotations

import contextlib
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from episodekit.core.atomic import remove_temporaries
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.executor import imap_files
from episodekit.core.lock import writer_lock
from episodekit.core.outdir import check_output_dir, mark_output_dir
from episodekit.core.paths import COMPRESSIONS, DEFAULT_TARGET_MB, MIB, UnsafePathError, inside_root
from episodekit.prep.rewrite import (
    FileJob,
    FileResult,
    LayoutStats,
    copy_file,
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


def _copy_tree(fs, src_root: str, dst_root: Path, sub: str) -> int:
    """Copy every file under ``src_root/sub`` to ``dst_root/sub`` (each write atomic)."""
    folder = posixpath.join(src_root, sub)
    if not fs.exists(folder):
        return 0
    n = 0
    for src in sorted(fs.find(folder)):
        rel = posixpath.relpath(src, src_root)
        copy_file(src, inside_root(dst_root, rel), fs)
        n += 1
    return n


def rewrite_rowgroups(
    root: str,
    target_mb: float = DEFAULT_TARGET_MB,
    out: str | None = None,
    workers: int | None = None,
    compression: str = "keep",
    dry_run: bool = False,
    force: bool = False,
    executor: str = "local",
    copy_videos: bool = False,
    progress: Callable[[FileResult, int, int], None] | None = None,
    wait: bool = True,
) -> PrepReport:
    """Rewrite the data files of ``root`` (local path or fsspec URL); see the module docstring.

    ``out``: write a complete copy there (meta/ always, videos/ when ``copy_videos``) instead of
    rewriting in place; required for a remote root. Files already done (marked for this target,
    or already within the band with a page index) are skipped, or copied unchanged to ``out``.
    ``progress(result, done, total)`` is called in the parent as each file finishes. Leftover
    temporaries of a crashed run are removed first, under the output's writer lock (another
    writer: wait, or with ``wait=False`` raise EnvironmentProblem). Per-file failures are in the
    report.
    """
    if target_mb <= 0:
        raise ValueError(f"target_mb must be > 0, got {target_mb}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    t0 = time.perf_counter()
    ds = open_dataset(str(root))
    if out is None:
        if not ds.is_local:
            raise ValueError(f"{root} is not a local path: pass out=DIR (read remote, write local)")
        out_root = Path(ds.path)
    else:
        out_root = Path(out).resolve()
        if ds.is_local and out_root == Path(ds.path).resolve():
            raise UnsafePathError(
                "--out is the dataset root itself; omit --out to rewrite in place", str(out)
            )
        if not dry_run:  # before anything is written: a user's folder is never overwritten
            check_output_dir(out)
    src_fs = None if ds.is_local else ds.fs
    if src_fs is not None and "memory" in _protocols(src_fs):
        workers = 1  # an in-memory filesystem is not shared with worker processes
    target_bytes = int(round(target_mb * MIB))
    report = PrepReport(str(root), str(out_root), float(target_mb), dry_run)
    jobs = [
        FileJob(
            relpath=rel,
            src=ds.join(rel),
            dst=inside_root(out_root, rel),  # no symlinked folder may lead the write out
            target_bytes=target_bytes,
            compression=compression,
            force=force,
            dry_run=dry_run,
            fs=src_fs,
        )
        for rel in ds.data_files
    ]
    lock = contextlib.nullcontext([]) if dry_run else writer_lock(out_root, wait=wait)
    with lock as removed:
        report.removed_temporaries = len(removed)
        if not dry_run and out is not None:
            mark_output_dir(out_root, "a prepared copy")
            _copy_tree(ds.fs, ds.path, out_root, "meta")
            if copy_videos:
                _copy_tree(ds.fs, ds.path, out_root, "videos")
        results: list[FileResult | None] = [None] * len(jobs)
        runs = imap_files(rewrite_file, jobs, executor, workers, quick=done_already)
        for done, (i, res) in enumerate(runs, start=1):
            results[i] = res
            if progress is not None:
                progress(res, done, len(jobs))
        if not dry_run:  # a job killed with its node (Ray retries it elsewhere) left its temp
            report.removed_temporaries += len(remove_temporaries(Path(out_root) / "data"))
    report.files = [r for r in results if r is not None]
    report.seconds = time.perf_counter() - t0
    env = [r for r in report.files if r.environment]
    if env:  # read-only or full disk: the command cannot run here (exit 2), not a bad file
        raise EnvironmentProblem(env[0].reason)
    return report
