"""Batch rewrites of a dataset's own files: data parquet into episode-aligned row groups.

Public face: :func:`rewrite_rowgroups` (what ``episodekit prep rowgroups`` runs), its
:class:`PrepReport` and :func:`format_report`, and :class:`VerificationError`. The row-group band
(what a good layout is) lives in :mod:`episodekit.core.band`.
"""

from episodekit.prep.rewrite import VerificationError
from episodekit.prep.rowgroups import PrepReport, format_report, rewrite_rowgroups

__all__ = ["PrepReport", "VerificationError", "format_report", "rewrite_rowgroups"]
