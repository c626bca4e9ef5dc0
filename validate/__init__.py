"""CI-grade validation of a dataset root and of every artifact under ``meta/``.

Public face: :func:`validate` returns a :class:`Report` of :class:`Finding` s (check id, severity,
message, file, episode); :data:`CHECKS` lists every check id. Loaded lazily, so importing this
package costs nothing until a name is used.
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
    "Scope": "episodekit.validate.scope",
    "sample_episodes": "episodekit.validate.scope",
    "Finding": "episodekit.validate.raw",
    "CannotValidate": "episodekit.validate.raw",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr("episodekit.validate", _EXPORTS)
