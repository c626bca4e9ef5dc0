"""Baselines: adopt validation on a dataset with old findings, fail only on new ones.

``validate --write-baseline FILE`` records every finding's fingerprint; ``--baseline FILE``
then lets the findings it holds pass (they are still reported, as known), fails on the others,
and reports the baseline's entries no longer found as gone. A fingerprint is the check, the
file (relative to the root), the episode and the feature: never the message text (it carries
measured values and the root's path) nor the findings' order. The file lists the fingerprints
sorted, without a date or a path, so a rerun on unchanged data writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from episodekit.core.atomic import atomic_write_text
from episodekit.validate.raw import Finding

VERSION = 1
KIND = "episodekit validate baseline"


class BaselineError(ValueError):
    """A baseline file that cannot be read or is not one."""


@dataclass(frozen=True, order=True)
class Entry:
    """One baseline line: what a finding's fingerprint is made of, and the fingerprint."""

    check: str
    file: str
    episode: int
    feature: str

    @property
    def fingerprint(self) -> str:
        text = json.dumps([self.check, self.file, self.episode, self.feature])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "check": self.check,
            "file": self.file or None,
            "episode": None if self.episode < 0 else self.episode,
            "feature": self.feature or None,
        }

    def where(self) -> str:
        parts = [self.file] if self.file else []
        if self.episode >= 0:
            parts.append(f"episode {self.episode}")
        if self.feature:
            parts.append(self.feature)
        return " ".join(parts) or "dataset"


def entry(f: Finding) -> Entry:
    return Entry(
        f.check, f.file or "", -1 if f.episode is None else int(f.episode), f.feature or ""
    )


def fingerprint(f: Finding) -> str:
    """A finding's stable fingerprint (check, file, episode, feature)."""
    return entry(f).fingerprint


def dumps(findings: Iterable[Finding]) -> str:
    """The baseline file's text for ``findings``: sorted, one entry per fingerprint."""
    entries = sorted({entry(f) for f in findings})
    doc = {"kind": KIND, "version": VERSION, "findings": [e.to_dict() for e in entries]}
    return json.dumps(doc, indent=1, sort_keys=False) + "\n"


def write(path: str | Path, findings: Iterable[Finding]) -> None:
    """Write the baseline of ``findings`` to ``path`` atomically."""
    atomic_write_text(Path(path), dumps(findings))


def load(path: str | Path) -> list[Entry]:
    """The entries of a baseline file; :class:`BaselineError` when it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError as exc:
        raise BaselineError(f"{p}: no such file (write one with --write-baseline)") from exc
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{p}: cannot read a baseline: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise BaselineError(f"{p}: not a baseline (--write-baseline writes one)")
    if doc.get("version") != VERSION:
        raise BaselineError(f"{p}: baseline version {doc.get('version')!r}, expected {VERSION}")
    out = []
    for item in doc.get("findings") or []:
        try:
            e = Entry(
                str(item["check"]),
                str(item.get("file") or ""),
                -1 if item.get("episode") is None else int(item["episode"]),
                str(item.get("feature") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BaselineError(f"{p}: malformed entry {item!r}") from exc
        out.append(e)
    return out


@dataclass
class BaselineDiff:
    """A run against a baseline: which of its findings the baseline holds (``known``, they
    do not fail) and which baseline entries of the checks that ran are no longer found."""

    path: str
    known: frozenset[str]  # the baseline's fingerprints
    gone: list[Entry]

    def is_known(self, f: Finding) -> bool:
        return fingerprint(f) in self.known

    def to_dict(self, findings: list[Finding]) -> dict[str, Any]:
        known = sum(self.is_known(f) for f in findings)
        return {
            "file": self.path,
            "known": known,
            "new": len(findings) - known,
            "gone": [e.to_dict() for e in self.gone],
        }


def compare(
    findings: list[Finding], checks_run: Iterable[str], entries: list[Entry], path: str
) -> BaselineDiff:
    """Findings against a baseline's entries; an entry is gone when its check ran and no
    finding has its fingerprint (entries of checks that did not run say nothing)."""
    ran = set(checks_run)
    now = {fingerprint(f) for f in findings}
    gone = sorted({e for e in entries if e.check in ran and e.fingerprint not in now})
    return BaselineDiff(str(path), frozenset(e.fingerprint for e in entries), gone)
