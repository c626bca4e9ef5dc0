"""The steps of ``prepare`` that rewrite the dataset's own files: row groups, then videos.

They own no artifact under ``meta/``; the row-group step also fixes the work root (the root
itself, or ``--out``) that every later step writes to.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from episodekit.core.paths import INFO_FILE, STAMP_FILE
from episodekit.core.progress import Progress, current, reporting
from episodekit.prepare_base import Context, Ensured, PrepareStep, done_or_skipped

if TYPE_CHECKING:
    from episodekit.prepare_model import PrepareOptions, Step


class RowGroups(PrepareStep):
    """Row-group rewrite (also copies meta/ into ``--out`` for an out-of-place run)."""

    name = "rowgroups"
    stops_on_failure = True

    def is_fresh(self, ctx: Context) -> bool:
        if ctx.opts.out is not None or ctx.opts.force or not ctx.source.is_local:
            return False
        from episodekit.prep.rowgroups import done_in_place

        return done_in_place(ctx.source, ctx.opts.target_mb)

    def ensure(self, ctx: Context) -> Ensured:
        from episodekit.prep import rewrite_rowgroups
        from episodekit.prep.rowgroups import RowGroupOptions

        o, reporter = ctx.opts, current()

        def bytes_done(res, done: int, total: int) -> None:
            reporter.active().advance(0, nbytes=res.bytes)  # the executor counts files

        options = RowGroupOptions(
            workers=o.jobs, executor=o.executor, force=o.force, copy_videos=o.include_videos,
            progress=bytes_done,
            stage=False,  # prepare --out stages the whole run (app/prepare.py)
        )  # fmt: skip
        quiet = reporting(Progress()) if self.is_fresh(ctx) else contextlib.nullcontext()
        with quiet:  # progress only for work that runs
            rep = rewrite_rowgroups(ctx.root, o.target_mb, o.out, options)
        # every later step works in the work root (local: a remote root needs --out)
        ctx.work = Path(ctx.result.work_root).resolve()
        ctx.result.work_root = str(ctx.work)
        summary = rep.summary()
        # what this run wrote: rewritten data files, and with --out the files copied there
        # (a rerun into the same --out copies only what changed at the source)
        written = ("rewritten", "copied")
        copied = [p for p in rep.copied if p != STAMP_FILE]  # the source's: validated again
        changed = sorted([r.path for r in rep.files if r.status in written] + copied)
        if not rep.ok:
            return Ensured("failed", summary, changed)
        return done_or_skipped(summary, changed)

    def summary(self, step: Step) -> str:
        d, c = step.detail, step.detail.get("counts", {})
        txt = (
            f"{c.get('rewritten', 0)} rewritten, {c.get('skipped', 0)} skipped, "
            f"{c.get('copied', 0)} copied, {c.get('failed', 0)} failed; "
            f"row groups {d.get('before', {}).get('row_groups', '?')} -> "
            f"{d.get('after', {}).get('row_groups', '?')}; {d.get('mb_per_s', 0)} MB/s"
        )
        for f in d.get("failed", [])[:5]:
            txt += f"\n      failed: {f['path']}: {f['reason']}"
        return txt

    def rerun_detail(self, step: Step) -> dict | None:
        """Every file skipped, the layout as this run left it."""
        d = step.detail
        n = d.get("after", {}).get("files", 0)
        counts = {"rewritten": 0, "skipped": n, "copied": 0, "planned": 0, "failed": 0}
        return {**d, "counts": counts, "before": d.get("after"), "seconds": 0.0, "mb_per_s": 0.0}

    def replayed(self, recorded: dict | None, root: str, stamp: dict) -> dict:
        return {**(recorded or {}), "root": str(root)}  # as this run names it


class Videos(PrepareStep):
    """``prep videos`` on the work root: mp4s that meet the random-access target are left alone,
    the others re-encoded in place (verified, resumable)."""

    name = "videos"
    stops_on_failure = True

    def wanted(self, opts: PrepareOptions) -> bool:
        return opts.videos_gop is not None

    def ensure(self, ctx: Context) -> Ensured:
        from episodekit.prep.videos import VideoOptions, rewrite_videos

        gop = ctx.opts.videos_gop
        ctx.say(f"videos: random-access target GOP {gop} (video that meets it is left alone)")
        o = ctx.opts
        options = VideoOptions(
            gop=gop, force=o.force, timing_frames=0, progress=ctx.say, executor=o.executor,
            jobs=o.jobs if o.executor != "local" else 1,
        )  # fmt: skip
        rep = rewrite_videos(str(ctx.work), options)
        counts = {
            s: sum(f.status == s for f in rep.files) for s in ("rewritten", "skipped", "failed")
        }
        changed = [f.file for f in rep.files if f.status == "rewritten"]
        if rep.info_updated:
            changed.append(INFO_FILE)
        detail = {"counts": counts, "failed": [f"{f.file}: {f.message}" for f in rep.failed][:10]}
        if rep.failed or not rep.files:
            if not rep.files:
                detail["failed"] = ["no video files (prepared into --out without --videos?)"]
            return Ensured("failed", detail, changed)
        return done_or_skipped(detail, changed)

    def summary(self, step: Step) -> str:
        d, c = step.detail, step.detail.get("counts", {})
        txt = f"{c.get('rewritten', 0)} re-encoded, {c.get('skipped', 0)} skipped, "
        txt += f"{c.get('failed', 0)} failed"
        for f in d.get("failed", [])[:5]:
            txt += f"\n      failed: {f}"
        return txt
