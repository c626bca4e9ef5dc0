"""CI-grade validation of a dataset root and of every artifact under ``meta/``.

Public face: :func:`validate` returns a :class:`Report` of :class:`Finding` s (check id, severity,
message, file, episode); :data:`REGISTRY` holds every check (id, title, severity, description,
help), :data:`CHECKS` maps each id to its description; :func:`render` and :func:`write_report`
give a report in every format (text, JSON, GitHub, SARIF, JUnit, Markdown, HTML). Loaded lazily,
so importing this package costs nothing until a name is used.
"""

from __future__ import annotations

from episodekit.core.lazy import lazy_getattr

_EXPORTS = {
    "validate": "episodekit.validate.runner",
    "Report": "episodekit.validate.runner",
    "CHECKS": "episodekit.validate.runner",
    "select_checks": "episodekit.validate.runner",
    "format_report": "episodekit.validate.runner",
    "format_annotations": "episodekit.validate.runner",
    "REGISTRY": "episodekit.validate.checks",
    "Check": "episodekit.validate.checks",
    "render": "episodekit.validate.outputs",
    "write_report": "episodekit.validate.outputs",
    "Scope": "episodekit.validate.scope",
    "sample_episodes": "episodekit.validate.scope",
    "Finding": "episodekit.validate.raw",
    "CannotValidate": "episodekit.validate.raw",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("episodekit.validate", _EXPORTS)
