"""Parquet footer facts (row groups, bytes, statistics, page index), read without data pages.

Shared by ``info``, the row-group rewrite (idempotence, before/after tables), the cost table
(per-episode byte shares) and validation (layout quality). The footer itself comes from
:func:`episodekit.core.parquet_read.read_footer` (parsed once per file per process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from episodekit.core.parquet_read import FileMetaData, is_local, read_footer
from episodekit.core.paths import MIB

BATCH_BYTES = 8 * MIB  # aim for read batches of about this many uncompressed bytes


@dataclass
class FileLayout:
    """Row-group layout of one parquet file, from its footer."""

    path: str
    num_rows: int
    file_size: int
    row_group_rows: np.ndarray  # int64 per row group
    row_group_bytes: np.ndarray  # uncompressed bytes per row group (footer total_byte_size)
    row_group_compressed: np.ndarray  # compressed bytes per row group
    has_page_index: bool  # every column chunk has both a column index and an offset index
    episode_min: np.ndarray | None  # per row group, from statistics when written
    episode_max: np.ndarray | None
    key_value: dict[str, str] = field(default_factory=dict)
    compression: str = "UNCOMPRESSED"

    @property
    def num_row_groups(self) -> int:
        return len(self.row_group_rows)

    def batch_rows(self) -> int:
        """Rows per read batch of about :data:`BATCH_BYTES` uncompressed bytes (from the
        widest row group's bytes per row; between 1024 and 1Mi rows)."""
        rows = np.maximum(self.row_group_rows, 1)
        per_row = float(np.max(self.row_group_bytes / rows)) if self.num_row_groups else 1.0
        return int(np.clip(BATCH_BYTES / max(per_row, 1.0), 1024, 1 << 20))


def _file_size(path: str, fs) -> int:
    if fs is None or is_local(fs):
        return os.path.getsize(path)
    return int(fs.size(path))


def _stat(stats, attr: str):
    if stats is None or not stats.has_min_max:
        return None
    return getattr(stats, attr)


def file_layout(path: str, fs=None, meta: FileMetaData | None = None) -> FileLayout:
    """Summarize a file's row groups from its footer (``meta``: that footer, when already read)."""
    meta = meta if meta is not None else read_footer(path, fs)
    n = meta.num_row_groups
    rows = np.zeros(n, dtype=np.int64)
    ubytes = np.zeros(n, dtype=np.int64)
    cbytes = np.zeros(n, dtype=np.int64)
    paths = [meta.schema.column(j).path for j in range(meta.num_columns)]
    ep_col = paths.index("episode_index") if "episode_index" in paths else None
    ep_min = np.zeros(n, dtype=np.int64) if ep_col is not None else None
    ep_max = np.zeros(n, dtype=np.int64) if ep_col is not None else None
    page_index = n > 0
    compression = "UNCOMPRESSED"
    for i in range(n):
        rg = meta.row_group(i)
        rows[i] = rg.num_rows
        ubytes[i] = rg.total_byte_size
        comp = 0
        for j in range(rg.num_columns):
            c = rg.column(j)
            comp += c.total_compressed_size
            if page_index and not (c.has_column_index and c.has_offset_index):
                page_index = False
            if i == 0 and j == 0:
                compression = c.compression
        cbytes[i] = comp
        if ep_col is not None:
            stats = rg.column(ep_col).statistics
            lo, hi = _stat(stats, "min"), _stat(stats, "max")
            if lo is None:
                ep_min = ep_max = None
                ep_col = None
            else:
                ep_min[i], ep_max[i] = lo, hi
    kv = {
        k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
        for k, v in (meta.metadata or {}).items()
        if k != b"ARROW:schema"
    }
    return FileLayout(
        path=path,
        num_rows=meta.num_rows,
        file_size=_file_size(path, fs),
        row_group_rows=rows,
        row_group_bytes=ubytes,
        row_group_compressed=cbytes,
        has_page_index=page_index,
        episode_min=ep_min,
        episode_max=ep_max,
        key_value=kv,
        compression=compression,
    )
