"""``episodekit info``: what a dataset root holds, from its metadata and parquet footers only."""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from episodekit.core.dataset import Dataset, open_dataset
from episodekit.core.footer import file_layout
from episodekit.core.paths import MIB
from episodekit.core.words import plural


def videos(ds: Dataset) -> dict[str, dict[str, Any]]:
    """Per camera: the mp4 files the episodes table names (how many, how many are missing, their
    total bytes) and the codec, resolution and fps info.json declares for them (``validate``
    checks those against the streams)."""
    out = {}
    for key in ds.video_keys:
        cols = [f"videos/{key}/chunk_index", f"videos/{key}/file_index"]
        pairs: list[tuple[int, int]] = []
        if ds.num_episodes and all(c in ds.episodes.column_names for c in cols):
            df = pl.from_arrow(ds.episodes.select(cols)).unique().sort(cols)
            pairs = [(int(c), int(f)) for c, f in df.iter_rows()]
        sizes = []
        for chunk, file in pairs:
            try:
                sizes.append(int(ds.fs.info(ds.safe_join(ds.video_path(key, chunk, file)))["size"]))
            except FileNotFoundError:
                pass
        declared = ds.features[key].get("info") or {}
        out[key] = {
            "files": len(pairs),
            "missing_files": len(pairs) - len(sizes),
            "bytes": sum(sizes),
            "codec": declared.get("video.codec"),
            "width": declared.get("video.width"),
            "height": declared.get("video.height"),
            "fps": declared.get("video.fps"),
        }
    return out


def describe(root: str) -> dict[str, Any]:
    """A JSON-ready description: counts, features, data-file row groups, video files per camera,
    lengths per task."""
    ds = open_dataset(root)
    files = []
    for file_id, rel in enumerate(ds.data_files):
        lay = file_layout(ds.data_path(file_id), ds.fs)
        b = lay.row_group_bytes
        files.append(
            {
                "path": rel,
                "rows": lay.num_rows,
                "file_bytes": lay.file_size,
                "row_groups": lay.num_row_groups,
                "row_group_bytes_min": int(b.min()) if len(b) else 0,
                "row_group_bytes_median": int(np.median(b)) if len(b) else 0,
                "row_group_bytes_max": int(b.max()) if len(b) else 0,
                "page_index": lay.has_page_index,
                "compression": lay.compression,
            }
        )
    eps = pl.from_arrow(ds.episodes.select(["task_index", "length"]))
    per_task = (
        eps.group_by("task_index")
        .agg(
            pl.len().alias("episodes"),
            pl.col("length").n_unique().alias("distinct_lengths"),
            pl.col("length").min().alias("min"),
            pl.col("length").median().alias("median"),
            pl.col("length").max().alias("max"),
            pl.col("length").sum().alias("frames"),
        )
        .sort("task_index")
    )
    task_names = dict(zip(ds.tasks["task_index"].to_pylist(), ds.tasks["task"].to_pylist()))
    tasks = [
        {**row, "task": task_names.get(row["task_index"], None)} for row in per_task.to_dicts()
    ]
    rg_bytes = np.concatenate([[f["row_group_bytes_median"]] for f in files]) if files else []
    return {
        "root": ds.root,
        "codebase_version": ds.version,
        "fps": ds.fps,
        "episodes": ds.num_episodes,
        "frames": ds.num_frames,
        "tasks": ds.tasks.num_rows,
        "fingerprint": ds.fingerprint,
        "features": {
            k: {"dtype": f.get("dtype"), "shape": f.get("shape")} for k, f in ds.features.items()
        },
        "data_files": files,
        "row_groups_total": int(sum(f["row_groups"] for f in files)),
        "row_group_bytes_median": int(np.median(rg_bytes)) if len(rg_bytes) else 0,
        "page_index_all": bool(files) and all(f["page_index"] for f in files),
        "videos": videos(ds),
        "lengths_per_task": tasks,
    }


def _mb(b: float) -> str:
    return f"{b / MIB:.2f}"


def format_description(d: dict[str, Any], max_files: int = 20) -> str:
    """Human-readable form of :func:`describe`."""
    lines = [
        f"root            {d['root']}",
        f"version         {d['codebase_version']}   fps {d['fps']:g}",
        f"episodes        {d['episodes']:,}",
        f"frames          {d['frames']:,}",
        f"tasks           {d['tasks']:,}",
        f"fingerprint     {d['fingerprint']}",
        "features",
    ]
    for k, f in d["features"].items():
        lines.append(f"  {k:<32} {f['dtype']:<8} {f['shape']}")
    lines.append(
        f"data files      {len(d['data_files'])}  ({plural(d['row_groups_total'], 'row group')}; "
        f"page index on all: {'yes' if d['page_index_all'] else 'no'})"
    )
    lines.append(
        f"  {'file':<40} {'rows':>10} {'groups':>7} {'rg MiB min/med/max':>22} {'pidx':>5}"
    )
    for f in d["data_files"][:max_files]:
        rg = "/".join(
            _mb(f[k])
            for k in ("row_group_bytes_min", "row_group_bytes_median", "row_group_bytes_max")
        )
        lines.append(
            f"  {f['path']:<40} {f['rows']:>10,} {f['row_groups']:>7,} {rg:>22} "
            f"{'yes' if f['page_index'] else 'no':>5}"
        )
    if len(d["data_files"]) > max_files:
        lines.append(f"  ... {len(d['data_files']) - max_files} more files")
    lines += _video_lines(d.get("videos") or {})
    lines.append("episode lengths per task (frames)")
    lines.append(
        f"  {'task':>5} {'episodes':>9} {'distinct':>9} {'min':>7} {'median':>8} {'max':>7}  text"
    )
    for t in d["lengths_per_task"]:
        text = (t["task"] or "?")[:48]
        lines.append(
            f"  {t['task_index']:>5} {t['episodes']:>9,} {t['distinct_lengths']:>9,} "
            f"{t['min']:>7,} {t['median']:>8,.0f} {t['max']:>7,}  {text}"
        )
    return "\n".join(lines)


def _video_lines(cams: dict[str, dict[str, Any]]) -> list[str]:
    """The video files per camera (none: one line saying so)."""
    if not cams:
        return ["video files     none (no video feature)"]
    files = sum(c["files"] for c in cams.values())
    total = sum(c["bytes"] for c in cams.values())
    lines = [
        f"video files     {plural(files, 'mp4 file')} of {plural(len(cams), 'camera')}, "
        f"{_mb(total)} MiB",
        f"  {'camera':<32} {'files':>6} {'MiB':>10} {'codec':>6} {'resolution':>11} {'fps':>5}",
    ]
    for key, c in cams.items():
        size = f"{c['width']}x{c['height']}" if c["width"] and c["height"] else "?"
        missing = f"  ({c['missing_files']} missing)" if c["missing_files"] else ""
        lines.append(
            f"  {key:<32} {c['files']:>6,} {_mb(c['bytes']):>10} {c['codec'] or '?':>6} "
            f"{size:>11} {c['fps'] if c['fps'] is not None else '?':>5}{missing}"
        )
    return lines
