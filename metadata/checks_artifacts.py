"""Artifact checks (placeholder, filled in next)."""

from __future__ import annotations

from .checks_base import Finding, RawRoot


def check_artifacts(raw: RawRoot, want: set[str]) -> list[Finding]:
    return []
