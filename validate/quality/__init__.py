"""Data-quality checks (``quality.*``): what silently ruins training although the files are sound.

Actions and states (every float feature named ``action*`` or ``observation.state*``), timing,
episode lengths, duplicates and dataset-level task / distribution problems. Every check is a
warning with a documented threshold (:data:`DEFAULTS`, overridable from a JSON/TOML file).

How it reads: one pass over the data files, one file at a time (a thread per core), reading only
``episode_index``, ``index``, ``timestamp`` and the checked features with pyarrow into numpy.
Everything per frame is a column operation (``ufunc.reduceat`` over episode boundaries); Python
loops only over episodes or flagged candidates. The pass yields per-episode summaries plus a
strided sample of values and steps; the dataset-level thresholds (robust scales) are computed from
those, then every decision is vectorized over (episode, dimension). Only flagged episodes are read
again, to confirm near-duplicates exactly and to attach the offending signal to findings.

Modules: :mod:`.thresholds` (names and thresholds), pure per-episode computations in
:mod:`.summaries`, the scanning in :mod:`.scan`, :mod:`.merge` (files into the dataset's
summaries), the checks in :mod:`.signals` and :mod:`.episode_checks`, the second reads in
:mod:`.reread`, and :mod:`.run` (:func:`check_quality`). Importing the package loads only the
thresholds; the rest on first use.
"""

from __future__ import annotations

from episodekit.core.lazy import lazy_getattr
from episodekit.validate.quality.thresholds import (
    CHECKS,
    DEFAULTS,
    ThresholdsError,
    load_thresholds,
)

_EXPORTS = {
    "check_quality": "episodekit.validate.quality.run",
    "check_quality_metadata": "episodekit.validate.quality.run",
    "quality_features": "episodekit.validate.quality.scan",
    "scan_file": "episodekit.validate.quality.scan",
    "scan_path": "episodekit.validate.quality.scan",
    "FeatureStats": "episodekit.validate.quality.summaries",
    "FileStats": "episodekit.validate.quality.summaries",
    "Merged": "episodekit.validate.quality.merge",
    "Candidate": "episodekit.validate.quality.signals",
    "read_episode_values": "episodekit.validate.quality.reread",
}
__all__ = ["CHECKS", "DEFAULTS", "ThresholdsError", "load_thresholds", *sorted(_EXPORTS)]

__getattr__ = lazy_getattr("episodekit.validate.quality", _EXPORTS)
