"""Batch rewrites of a dataset's own files: data parquet into episode-aligned row groups."""

from .checksum import TableChecksum
from .plan import (
    DEFAULT_TARGET_MB,
    MARKER_KEY,
    band_violations,
    file_needs_rewrite,
    plan_row_groups,
    read_marker,
    row_group_band,
)
from .rewrite import FileJob, FileResult, LayoutStats, VerificationError, rewrite_file
from .rowgroups import PrepReport, format_report, rewrite_rowgroups

__all__ = [
    "DEFAULT_TARGET_MB",
    "MARKER_KEY",
    "FileJob",
    "FileResult",
    "LayoutStats",
    "PrepReport",
    "TableChecksum",
    "VerificationError",
    "band_violations",
    "file_needs_rewrite",
    "format_report",
    "plan_row_groups",
    "read_marker",
    "rewrite_file",
    "rewrite_rowgroups",
    "row_group_band",
]
