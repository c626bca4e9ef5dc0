"""The steps of ``prepare`` that give the verdict: validation (a pass leaves the stamp that lets
an unchanged root skip it, and the whole rerun), then, when asked, the frame store."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from episodekit.core.paths import STAMP_FILE, inside_root
from episodekit.core.words import plural
from episodekit.prepare_base import (
    Artifact,
    Context,
    Ensured,
    PrepareStep,
    stamped_globs,
    steps_before,
)

if TYPE_CHECKING:
    from episodekit.prepare_model import PrepareOptions, Step


class Validate(PrepareStep):
    """Validation; a pass leaves a stamp keyed on the fingerprint and the size/mtime of every
    data file and artifact, so an unchanged root is not scanned again."""

    name = "validate"
    artifacts = (
        Artifact(
            "validation stamp",
            (STAMP_FILE,),
            "the state digest: episodes fingerprint, size and mtime of every file validated",
            stamped=False,  # it is the stamp
        ),
    )
    verdict = True

    def is_fresh(self, ctx: Context) -> bool:
        from episodekit.prepare_model import read_stamp, state_digest

        stamp = read_stamp(ctx.work)
        digest = state_digest(
            ctx.work, ctx.ds.fingerprint, ctx.ds.data_files, stamped_globs(ctx.steps)
        )
        return not ctx.opts.force and bool(
            stamp and stamp.get("state") == digest and stamp.get("ok")
        )

    def ensure(self, ctx: Context) -> Ensured:
        if self.is_fresh(ctx):
            stamp = json.loads((ctx.work / STAMP_FILE).read_text())
            self._record_rerun(ctx, stamp)
            return Ensured("skipped", self.replayed(None, ctx.root, stamp), [])
        from episodekit.prepare_model import STAMP_VERSION, state_digest
        from episodekit.prepare_noop import eligible, rerun_record
        from episodekit.validate.runner import validate

        o, work, ds = ctx.opts, ctx.work, ctx.ds
        digest = state_digest(work, ds.fingerprint, ds.data_files, stamped_globs(ctx.steps))
        # A copy prepared without its videos cannot have them checked (and is not meant to).
        checks = "all,-info.videos,-video" if o.out is not None and not o.include_videos else None
        d = validate(str(work), checks=checks, executor=o.executor).to_dict()
        detail = {
            "ok": d["ok"],
            "errors": d["counts"]["error"],
            "warnings": d["counts"]["warning"],
            "first_errors": [f for f in d["findings"] if f["severity"] == "error"][:10],
        }
        if d["ok"]:
            stamp = {
                "version": STAMP_VERSION,
                "fingerprint": ds.fingerprint,
                "state": digest,
                "ok": True,
                "counts": {"errors": detail["errors"], "warnings": detail["warnings"]},
            }
            if eligible(ctx.root, o, recording=True):  # what a rerun reports: prepare_noop
                before = steps_before(ctx.steps, self, o)
                stamp["rerun"] = rerun_record(ctx.result, o, list(ds.data_files), before)
            from episodekit.core.atomic import atomic_write_text

            text = json.dumps(stamp, indent=2, sort_keys=True)
            atomic_write_text(inside_root(work, STAMP_FILE), text)
        return Ensured("done" if d["ok"] else "failed", detail, [])

    def _record_rerun(self, ctx: Context, stamp: dict) -> None:
        """A fresh root rerun with options its stamp has no record for (e.g. `prepare ROOT`
        after `prepare ROOT --frames`) leaves that record, so the next such rerun answers from the
        stamp alone (prepare_noop); the stamp is otherwise unchanged."""
        from episodekit.prepare_noop import eligible, options_key, rerun_record

        o = ctx.opts
        if not eligible(ctx.root, o, recording=True):
            return
        if (stamp.get("rerun") or {}).get("options") == options_key(o):
            return
        rec = rerun_record(ctx.result, o, list(ctx.ds.data_files), steps_before(ctx.steps, self, o))
        if not rec:
            return
        from episodekit.core.atomic import atomic_write_text

        stamp["rerun"] = rec
        text = json.dumps(stamp, indent=2, sort_keys=True)
        atomic_write_text(inside_root(ctx.work, STAMP_FILE), text)

    def replayed(self, recorded: dict | None, root: str, stamp: dict) -> dict:
        """A fresh stamp's verdict: passed, with the counts it recorded."""
        return {"ok": True, "fresh_stamp": True, **stamp.get("counts", {})}

    def summary(self, step: Step) -> str:
        d = step.detail
        txt = f"{plural(d.get('errors', 0), 'error')}, {plural(d.get('warnings', 0), 'warning')}"
        if d.get("fresh_stamp"):
            txt += "; unchanged since last passing validation"
        for f in d.get("first_errors", [])[:5]:
            txt += f"\n      {f.get('check')}: {f.get('file') or ''} {f.get('message')}"
        return txt


class Frames(PrepareStep):
    """The frame store of the prepared root (in the local cache, outside it: nothing changed)."""

    name = "frames"
    artifacts = (
        Artifact(
            "frame store",
            (),  # in the local cache, never in the root (nothing of it is pushed)
            "episodes fingerprint and features digest (the store's header)",
            stamped=False,
        ),
    )
    verdict = True

    def wanted(self, opts: PrepareOptions) -> bool:
        return opts.frames

    def ensure(self, ctx: Context) -> Ensured:
        from episodekit.core.errors import DatasetError, EnvironmentProblem
        from episodekit.prep.frames import build_frame_store

        if not ctx.result.ok:
            return Ensured("skipped", {"reason": "validation failed"}, [])
        try:
            rep = build_frame_store(
                str(ctx.work), jobs=ctx.opts.jobs, force=ctx.opts.force, executor=ctx.opts.executor
            )
        except (DatasetError, EnvironmentProblem) as exc:
            return Ensured("failed", {"error": str(exc)}, [])
        return Ensured("done" if rep.status == "built" else "skipped", rep.summary(), [])

    def summary(self, step: Step) -> str:
        d = step.detail
        if "error" in d or "reason" in d:
            return str(d.get("error") or d.get("reason"))
        mib = d.get("bytes", 0) / 2**20
        return f"{plural(d.get('frames', 0), 'frame')}, {mib:,.0f} MiB in {d.get('store')}"
