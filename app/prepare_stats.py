"""The stats step of ``prepare``: normalization stats, recomputed where stale, or the dataset's
own kept when they pass the ``stats.*`` checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from episodekit.core.paths import EPISODES_FILES, STATS_FILE, STATS_SUMMARY_FILE
from episodekit.core.words import plural
from episodekit.prepare_base import Artifact, Context, Ensured, PrepareStep, done_or_skipped

if TYPE_CHECKING:
    from episodekit.prepare_model import Step


class Stats(PrepareStep):
    """Normalization stats (stats.json + per-episode stats columns). Stats episodekit wrote are
    recomputed when stale; the dataset's own (another tool's, e.g. LeRobot's) are kept when they
    pass the ``stats.*`` checks and replaced only when they fail them, are missing, or with
    ``stats="recompute"``. The detail says which (``status``: fresh, kept, written,
    recomputed) and why."""

    name = "stats"
    artifacts = (
        Artifact(
            "stats",
            (STATS_FILE, STATS_SUMMARY_FILE),
            "episodes fingerprint, data files' sizes and footers, stats.json's sha256 (summary)",
        ),
    )

    def ensure(self, ctx: Context) -> Ensured:
        ds, o = ctx.ds, ctx.opts
        if ds.version != "v3.0":
            return Ensured(
                "skipped", {"status": f"{ds.version}: stats are written for v3.0 only"}, []
            )
        if o.force or o.stats == "recompute":
            why = "--stats recompute" if o.stats == "recompute" else ""  # --force: as before
            return self._write(ctx, force=True, why=why)
        foreign = self._foreign(ctx)
        if foreign is None:  # ours (or none): recomputed where stale, as ``metadata stats``
            return self._write(ctx, force=False, why="")
        problem = self._problem(ctx) if foreign else "no meta/stats.json"
        if not problem:
            return self._keep(ctx)
        return self._write(ctx, force=True, why=problem)

    @staticmethod
    def _keep(ctx: Context) -> Ensured:
        """Keep the dataset's own stats; a summary of ours left from earlier stats describes
        other numbers: removed, so that no check holds the kept stats to it."""
        from episodekit.metadata.stats.rank import kept_quantiles

        detail = {"status": "kept", "why": "the dataset's own stats pass the stats checks"}
        detail.update(kept_quantiles(str(ctx.work)))  # how far its quantiles are, if far
        summary = ctx.work / STATS_SUMMARY_FILE
        if not summary.exists():
            return Ensured("skipped", detail, [])
        summary.unlink()
        detail["why"] += f"; {STATS_SUMMARY_FILE} of earlier stats removed"
        return Ensured("done", detail, [STATS_SUMMARY_FILE])

    @staticmethod
    def _foreign(ctx: Context) -> bool | None:
        """None when episodekit wrote the stats there now (its summary records this very
        stats.json) or there are none and no summary; True for another writer's stats.json;
        False when stats.json is missing."""
        import hashlib

        from episodekit.metadata.stats import read_summary_meta

        path = ctx.work / STATS_FILE
        if not path.is_file():
            return False
        meta = read_summary_meta(str(ctx.work)) or {}
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        return None if (meta.get("outputs") or {}).get("stats_sha256") == sha else True

    @staticmethod
    def _problem(ctx: Context) -> str:
        """The first error of the ``stats.*`` checks on the work root ("" when none)."""
        from episodekit.validate.raw import ERROR, read_raw
        from episodekit.validate.stats import check_stats

        for f in check_stats(read_raw(str(ctx.work))):
            if f.severity == ERROR and f.check != "stats.fresh":  # freshness: of our summary
                return f"{f.check}: {f.file or ''} {f.message}".replace("  ", " ")
        return ""

    @staticmethod
    def _write(ctx: Context, force: bool, why: str) -> Ensured:
        from episodekit.metadata.stats import ensure_stats

        work, o = ctx.work, ctx.opts
        res, status = ensure_stats(str(work), force=force, executor=o.executor, jobs=o.jobs)
        if res is None:
            return Ensured("skipped", {"status": status}, [])
        changed = []
        if status == "written":
            changed = [STATS_FILE, STATS_SUMMARY_FILE]
            changed += [str(p.relative_to(work)) for p in work.glob(EPISODES_FILES)]
            if o.stats == "recompute":
                status = "recomputed"
        detail = {"status": status, "features": len(res.features), "quantiles": res.mode}
        if why:
            detail["why"] = why
        return done_or_skipped(detail, changed)

    def summary(self, step: Step) -> str:
        d = step.detail
        why = f" ({d['why']})" if d.get("why") else ""
        if "features" not in d:
            status = d.get("status", "")
            if status == "kept" and d.get("quantiles"):  # far from the data: say so
                q, n = d["quantiles"], round(100 * d["quantiles"]["rank"])
                th = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
                return (
                    f"kept; {q['key']} is the data's {n}{th} percentile ({q['feature']}, dimension "
                    f"{q['dimension']}); `--stats recompute` writes exact ones"
                )
            return ("fresh" if status == "fresh" else str(status)) + why
        modes = sorted(set((d.get("quantiles") or {}).values()))
        feats = plural(d["features"], "feature")
        return f"{feats}, quantiles {'/'.join(modes)}, {d.get('status')}{why}"

    def rerun_detail(self, step: Step) -> dict | None:
        d = step.detail
        if d.get("status") == "kept":  # kept again, without the one-time summary removal
            kept = {"status": "kept", "why": d["why"].split("; ")[0]}
            return {**kept, **({"quantiles": d["quantiles"]} if "quantiles" in d else {})}
        return {"status": "fresh"} if step.status == "done" else d
