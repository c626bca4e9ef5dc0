"""Which episodes validation flagged: the input of ``--exclude-flagged`` (plans) and of
surgery's ``--drop-flagged`` (which drops only the frames a frame-level finding names, see
:mod:`episodekit.validate.quality.frames`, and the episodes of the other findings).

The flags come either from a ``validate --json`` report already written (CI keeps one), or from a
fresh run of just the named checks. A report caps each check's findings (``... and N more``);
those summary findings list the remaining episodes in ``details.episodes``, so nothing flagged is
lost. A report that did not run a named check is refused: excluding nothing because the check
never ran would look like a clean dataset.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from episodekit.validate.runner import select_checks


def flagged_checks(names: str | Iterable[str]) -> list[str]:
    """Check ids named by ``names`` (ids or groups, e.g. ``quality.frozen,quality.duplicate``
    or ``quality``); ValueError for an unknown name."""
    return select_checks(names)


# Findings whose episode is where a change starts, not an episode at fault: they flag none.
NOT_AN_EPISODE_AT_FAULT = {"quality.drift"}


def _is_index(e: Any) -> bool:
    return isinstance(e, int) and not isinstance(e, bool)


def _ranges(value: Any) -> list[list[int]] | None:
    """A finding's ``[[first, last], ...]`` frames (None when it is not such a list)."""
    if not isinstance(value, list) or not value:
        return None
    out = []
    for r in value:
        if not (isinstance(r, list) and len(r) == 2 and all(_is_index(v) for v in r)):
            return None
        if not 0 <= r[0] <= r[1]:
            return None
        out.append([r[0], r[1]])
    return out


def _finding_frames(f: dict[str, Any]) -> dict[int, list[list[int]]]:
    """The frames a finding points at, per episode (``details.frames``: a list of ranges for
    its episode, or ``{episode: ranges}`` in a ``... and N more`` summary finding)."""
    details = f.get("details") or {}
    frames = details.get("frames")
    if isinstance(frames, dict):
        out = {}
        for k, v in frames.items():
            r = _ranges(v)
            if r is not None and str(k).isdigit():
                out[int(k)] = r
        return out
    r = _ranges(frames)
    return {f["episode"]: r} if r is not None and _is_index(f.get("episode")) else {}


def episodes_of_findings(
    findings: Iterable[dict[str, Any]], checks: list[str], frames: bool = False
) -> dict[int, list]:
    """``{episode: [check, ...]}`` for the findings of ``checks`` (dicts as in a JSON report),
    including the episodes listed by ``... and N more`` summary findings. With ``frames``, an
    episode whose finding names its frames (:func:`frames_of_findings`) is not listed for it."""
    wanted = set(checks) - NOT_AN_EPISODE_AT_FAULT
    out: dict[int, set[str]] = {}
    for f in findings:
        if f.get("check") not in wanted:
            continue
        eps = [f.get("episode")] + list((f.get("details") or {}).get("episodes") or [])
        cut = _finding_frames(f) if frames else {}
        for e in eps:
            if _is_index(e) and e not in cut:
                out.setdefault(e, set()).add(f["check"])
    return {e: sorted(c) for e, c in sorted(out.items())}


def frames_of_findings(
    findings: Iterable[dict[str, Any]], checks: list[str]
) -> dict[int, tuple[list[list[int]], list[str]]]:
    """``{episode: ([[first, last], ...], [check, ...])}``: the frames the findings of
    ``checks`` point at (frame-level checks, see :mod:`episodekit.validate.quality.frames`)."""
    wanted = set(checks) - NOT_AN_EPISODE_AT_FAULT
    ranges: dict[int, list[list[int]]] = {}
    by: dict[int, set[str]] = {}
    for f in findings:
        if f.get("check") not in wanted:
            continue
        for e, r in _finding_frames(f).items():
            ranges.setdefault(e, []).extend(r)
            by.setdefault(e, set()).add(f["check"])
    return {e: (ranges[e], sorted(by[e])) for e in sorted(ranges)}


def read_report(path: str | Path) -> dict[str, Any]:
    """A ``validate --json`` report; ValueError naming the file when it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: cannot read a validate --json report ({exc})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("findings"), list):
        raise ValueError(f"{p}: not a validate --json report (no findings list)")
    return doc


def flagged_episodes(
    root: str,
    checks: str | Iterable[str],
    report: str | Path | None = None,
    fingerprint: str | None = None,
) -> dict[int, list[str]]:
    """Episodes of ``root`` flagged by ``checks``: from ``report`` (a ``validate --json`` file of
    this root that ran those checks) or, without one, from a fresh validation of just them.
    A report must carry the episodes fingerprint of ``root`` (``fingerprint``, computed when
    not given): one of another dataset, or of these episodes before an edit, would drop the
    wrong episodes, so it is refused (ValueError), as is one that records no fingerprint."""
    ids = flagged_checks(checks)
    return episodes_of_findings(flagged_findings(root, ids, report, fingerprint), ids)


def flagged_frames(
    root: str,
    checks: str | Iterable[str],
    report: str | Path | None = None,
    fingerprint: str | None = None,
) -> tuple[dict[int, list[str]], dict[int, tuple[list[list[int]], list[str]]]]:
    """What ``edit --drop-flagged`` drops (read as :func:`flagged_episodes`): the episodes whose
    findings judge them whole, and the frames the frame-level findings point at (their episodes
    stay)."""
    ids = flagged_checks(checks)
    found = flagged_findings(root, ids, report, fingerprint)
    return episodes_of_findings(found, ids, frames=True), frames_of_findings(found, ids)


def flagged_findings(
    root: str, ids: list[str], report: str | Path | None = None, fingerprint: str | None = None
) -> list[dict[str, Any]]:
    """The findings of checks ``ids`` on ``root``: a report's (checked as
    :func:`flagged_episodes` says) or a fresh validation's."""
    if report is None:
        from episodekit.validate.runner import validate

        return validate(root, checks=ids).to_dict()["findings"]
    doc = read_report(report)
    redo = f"run `episodekit validate ROOT --json --checks {','.join(ids)}` for a report"
    missing = [c for c in ids if c not in (doc.get("checks_run") or [])]
    if missing:
        raise ValueError(
            f"{report}: the report did not run {', '.join(missing[:5])} ({redo} that did)"
        )
    if fingerprint is None:
        from episodekit.core.dataset import open_dataset

        fingerprint = open_dataset(root).fingerprint
    judged = doc.get("fingerprint")
    if not judged:
        raise ValueError(
            f"{report}: the report does not say which episodes it judged (no fingerprint: "
            f"an older episodekit wrote it); {redo} of these episodes"
        )
    if judged != fingerprint:
        raise ValueError(
            f"{report}: the report judged other episodes ({doc.get('root')!s}, fingerprint "
            f"{judged}) than {root}'s ({fingerprint}); {redo} of these episodes"
        )
    return doc["findings"]
