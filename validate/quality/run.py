"""The entry point: :func:`check_quality` runs the pass, every check, and turns the candidates
into findings (worst first, capped per check)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from episodekit.core.memory import release_memory
from episodekit.core.words import noun_for
from episodekit.validate import drift
from episodekit.validate.quality.episode_checks import (
    episode_checks,
    shift_checks,
    task_checks,
    timing_checks,
)
from episodekit.validate.quality.frames import merge_frames
from episodekit.validate.quality.reread import (
    attach_signals,
    confirm_duplicates,
    duplicate_candidates,
)
from episodekit.validate.quality.scan import (
    quality_features,
    scan_files,
)
from episodekit.validate.quality.signals import (
    Candidate,
    dim_label,
    signal_checks,
)
from episodekit.validate.quality.thresholds import (
    CHECKS,
    DEFAULTS,
    MAX_PER_CHECK,
)
from episodekit.validate.raw import WARNING, Finding, RawRoot


def check_quality(
    raw: RawRoot,
    rels: list[str],
    want: set[str] | None = None,
    thresholds: dict | None = None,
    threads: int | None = None,
    executor: str = "local",
) -> list[Finding]:
    """Run the ``quality.*`` checks over the readable data files ``rels`` of ``raw``.

    The per-file pass runs in threads here, or one Ray task per file with ``executor="ray"``
    (each returns its per-episode summaries and strided sample, never the file's rows). Each
    file's summaries are folded into the merged ones as they arrive and dropped: the driver
    holds one copy of the per-episode summaries, whatever the number of files."""
    th = dict(DEFAULTS if thresholds is None else {**DEFAULTS, **thresholds})
    want = set(CHECKS) if want is None else want
    m = scan_files(raw, rels, quality_features(raw), th, threads, executor)
    cands: list[Candidate] = []
    cands += signal_checks(raw, m, th)
    cands += timing_checks(raw, m, th)
    cands += episode_checks(raw, m, th)
    cands += task_checks(raw, th)
    cands += shift_checks(raw, m, th)
    if "quality.drift" in want:
        label = lambda f, j: dim_label(raw, f, j)  # noqa: E731
        cands += [Candidate(**c) for c in drift.drift_candidates(raw, m, th, label)]
    if "quality.duplicate" in want:
        cands += confirm_duplicates(raw, m, duplicate_candidates(m, th), th, MAX_PER_CHECK)
    del m
    release_memory()  # the merged summaries and the re-read rows' Arrow buffers
    cands = [c for c in cands if c.check in want]
    return _to_findings(raw, cands)


def check_quality_metadata(
    raw: RawRoot, want: set[str], thresholds: dict | None = None
) -> list[Finding]:
    """The ``quality.*`` checks in ``want`` that the episodes and tasks tables decide alone
    (episode lengths, task strings; ``validate --metadata-only``), judged as a full run judges
    them, with no data file read: the checks that count rows (``quality.empty_episode``) are
    not among them."""
    th = dict(DEFAULTS if thresholds is None else {**DEFAULTS, **thresholds})
    no_rows = SimpleNamespace(episodes=np.zeros(0, np.int64), rows=np.zeros(0, np.int64))
    no_rows.scanned = set()  # no data file read: only the tables' lengths count
    cands = episode_checks(raw, no_rows, th) + task_checks(raw, th)
    return _to_findings(raw, [c for c in cands if c.check in want])


def _to_findings(raw: RawRoot, cands: list[Candidate]) -> list[Finding]:
    """Worst first per check, capped at MAX_PER_CHECK (the rest summarized in one finding);
    signals are attached to the kept ones."""
    by_check: dict[str, list[Candidate]] = {}
    for c in cands:
        by_check.setdefault(c.check, []).append(c)
    kept, rest = [], {}
    for check, items in by_check.items():
        items.sort(
            key=lambda c: (-c.score if math.isfinite(c.score) else -math.inf, c.episode or 0)
        )
        kept += items[:MAX_PER_CHECK]
        if len(items) > MAX_PER_CHECK:
            rest[check] = items[MAX_PER_CHECK:]
    attach_signals(raw, kept)
    attach_signals(raw, [c for items in rest.values() for c in items], signals=False)
    release_memory()  # the re-read rows' Arrow buffers
    out = []
    for c in kept:
        details = dict(c.details)
        details["score"] = round(c.score, 3) if math.isfinite(c.score) else None
        out.append(
            Finding(
                c.check,
                WARNING,
                c.message,
                c.file,
                c.episode,
                feature=c.feature,
                dimension=c.dimension,
                value=c.value,
                details=details,
            )
        )
    for check, items in rest.items():
        eps = sorted({c.episode for c in items if c.episode is not None})
        out.append(
            Finding(
                check,
                WARNING,
                f"... and {len(items)} more {noun_for(len(items), 'finding')} of this check"
                + (
                    f" (episodes {', '.join(map(str, eps[:20]))}{', ...' if len(eps) > 20 else ''})"
                    if eps
                    else ""
                ),
                details=_rest_details(items, eps),
            )
        )
    return out


def _rest_details(items: list[Candidate], eps: list[int]) -> dict:
    """A summary finding's details: how many more, their episodes and, for a frame-level
    check, each episode's frames (``{"episode": [[first, last], ...]}``)."""
    out: dict = {"more": len(items), "episodes": eps}
    frames: dict[int, list] = {}
    for c in items:
        if c.episode is not None and "frames" in c.details:
            frames.setdefault(c.episode, []).extend(c.details["frames"])
    if frames:
        out["frames"] = {str(e): merge_frames(r) for e, r in sorted(frames.items())}
    return out
