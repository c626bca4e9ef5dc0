"""Where each episode sits in file order, and which row groups it reads: the inputs of a
``locality="rowgroup"`` plan, from the data files' parquet footers only."""

from __future__ import annotations

import numpy as np

from episodekit.core.dataset import Dataset, DatasetError
from episodekit.core.footer import file_layout


def rowgroup_units(ds: Dataset, episode_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per episode (in ``episode_index`` order): its file-order position (first global frame)
    and its row-group unit (row groups numbered in file order, from the parquet footers; row
    groups joined by an episode that spans them share one unit). Reads footers only."""
    frm_all = ds.column("dataset_from_index").astype(np.int64)
    to_all = ds.column("dataset_to_index").astype(np.int64)
    fid_all = ds.column("file_id").astype(np.int64)
    files = np.unique(fid_all)
    first = np.array([frm_all[fid_all == f].min() for f in files], dtype=np.int64)
    files = files[np.argsort(first, kind="stable")]
    rg_start, offset = [], 0
    base = np.zeros(int(fid_all.max()) + 1 if len(fid_all) else 0, dtype=np.int64)
    starts_of: dict[int, np.ndarray] = {}
    for f in files.tolist():
        path = ds.data_path(f)
        try:
            rows = file_layout(path, ds.fs).row_group_rows
        except (OSError, ValueError) as exc:
            raise DatasetError(f"cannot read the parquet footer ({exc})", path) from exc
        starts_of[f] = np.cumsum(rows) - rows + frm_all[fid_all == f].min()
        base[f] = offset
        offset += max(len(rows), 1)
        rg_start.append(starts_of[f])
    rows_idx = ds.episode_rows(np.asarray(episode_index))
    frm, to, fid = frm_all[rows_idx], to_all[rows_idx], fid_all[rows_idx]
    rg_first = np.zeros(len(frm), np.int64)
    rg_last = np.zeros(len(frm), np.int64)
    for f in np.unique(fid).tolist():
        sel = fid == f
        s = starts_of[f]
        rg_first[sel] = base[f] + np.maximum(np.searchsorted(s, frm[sel], side="right") - 1, 0)
        last = np.maximum(to[sel] - 1, frm[sel])
        rg_last[sel] = base[f] + np.maximum(np.searchsorted(s, last, side="right") - 1, 0)
    order = np.lexsort((np.asarray(episode_index), frm))
    a, b = rg_first[order], rg_last[order]
    reach = np.maximum.accumulate(b) if len(b) else b
    new = np.r_[True, a[1:] > reach[:-1]] if len(a) else np.zeros(0, bool)
    unit = np.empty(len(order), np.int64)
    unit[order] = np.cumsum(new) - 1
    return frm, unit
