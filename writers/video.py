"""The kept episodes' video, cut and joined without re-encoding (``episodekit.prep.remux``).

Per video key, output episodes are grouped into mp4 files in output order, rolling over at
``video_files_size_in_mb`` (each episode's bytes estimated as its share, by duration, of its
source file's size); each file is one :func:`~episodekit.prep.remux.remux` of the episodes'
segments, and the episodes' new ``videos/<key>/{chunk_index,file_index,from_timestamp,
to_timestamp}`` come from where the segments landed. Every segment must copy exactly the
episode's ``length`` frames. Remote sources are fetched into the staging folder first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset
from episodekit.core.errors import DatasetError
from episodekit.core.layout.files import chunk_file, file_path, roll_over
from episodekit.core.paths import MIB, VIDEO_PATH_V3
from episodekit.writers.plan import OutputPlan

FETCHED = ".sources"  # inside staging: remote mp4s copied for remux, removed after


def _column(ds: Dataset, key: str, field: str, rows: np.ndarray) -> np.ndarray:
    return ds.column(f"videos/{key}/{field}")[rows]


def _local_mp4(ds: Dataset, rel: str, staging: Path, d: int) -> str:
    """A local path of the source mp4 ``rel`` (fetched into staging for a remote root)."""
    full = ds.safe_join(rel)
    if ds.is_local:
        return full
    local = staging / FETCHED / str(d) / rel
    if not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        ds.fs.get(full, str(local))
    return str(local)


def _sources(plan: OutputPlan, key: str) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """Per output episode: (dataset id, source relpath) pairs as strings, and from/to seconds."""
    rels, ids = [], []
    frm = np.zeros(plan.num_episodes)
    to = np.zeros(plan.num_episodes)
    for d, ds in enumerate(plan.datasets):
        sel = np.flatnonzero(plan.ds_id == d)
        rows = plan.row[sel]
        chunk = _column(ds, key, "chunk_index", rows)
        fidx = _column(ds, key, "file_index", rows)
        frm[sel] = _column(ds, key, "from_timestamp", rows)
        to[sel] = _column(ds, key, "to_timestamp", rows)
        for i, c, f in zip(sel.tolist(), chunk.tolist(), fidx.tolist()):
            while len(rels) <= i:
                rels.append("")
                ids.append("")
            rels[i] = ds.video_path(key, int(c), int(f))
            ids[i] = str(d)
    return ids, rels, frm, to


def _byte_estimates(plan: OutputPlan, key: str, ids, rels, frm, to) -> np.ndarray:
    """Bytes per output episode: its share by duration of its source file's size."""
    out = np.zeros(plan.num_episodes)
    for d, ds in enumerate(plan.datasets):
        ends: dict[str, float] = {}
        all_rows = np.arange(ds.num_episodes)
        c = _column(ds, key, "chunk_index", all_rows)
        f = _column(ds, key, "file_index", all_rows)
        t = _column(ds, key, "to_timestamp", all_rows)
        for ci, fi, ti in zip(c.tolist(), f.tolist(), t.tolist()):
            rel = ds.video_path(key, int(ci), int(fi))
            ends[rel] = max(ends.get(rel, 0.0), float(ti))
        sizes = {rel: float(ds.fs.size(ds.safe_join(rel))) for rel in ends}
        for i in np.flatnonzero(plan.ds_id == d).tolist():
            share = (to[i] - frm[i]) / max(ends[rels[i]], 1e-9)
            out[i] = sizes[rels[i]] * share
    return out


def write_videos(
    plan: OutputPlan, staging: Path, keys: list[str], file_limit_mb: float, chunks_size: int
) -> tuple[dict[str, pa.Array], dict[str, dict[str, int]], int]:
    """Write every video key's files under ``staging``; return the episodes' ``videos/*``
    columns, each written file's expected frame count per key, and the segments re-encoded."""
    from episodekit.prep.remux import Segment, remux

    cols: dict[str, pa.Array] = {}
    frames: dict[str, dict[str, int]] = {}
    reencoded = 0
    for key in keys:
        ids, rels, frm, to = _sources(plan, key)
        seq = roll_over(_byte_estimates(plan, key, ids, rels, frm, to), file_limit_mb * MIB)
        new_from = np.zeros(plan.num_episodes)
        new_to = np.zeros(plan.num_episodes)
        frames[key] = {}
        for f in np.unique(seq).tolist():
            sel = np.flatnonzero(seq == f).tolist()
            segments = [
                Segment(
                    _local_mp4(plan.datasets[int(ids[i])], rels[i], staging, int(ids[i])),
                    float(frm[i]),
                    float(to[i]),
                )
                for i in sel
            ]
            rel = file_path(VIDEO_PATH_V3, *chunk_file(f, chunks_size), video_key=key)
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            placed = remux(segments, staging / rel)
            for i, p in zip(sel, placed):
                if p.frames != plan.length[i]:
                    raise DatasetError(
                        f"episode {int(plan.src_episode[i])}: {p.frames} video frames in "
                        f"[{frm[i]:g}, {to[i]:g}) s, the episode has {int(plan.length[i])} ({key})",
                        plan.datasets[int(ids[i])].join(rels[i]),
                    )
                new_from[i], new_to[i] = p.from_ts, p.to_ts
                reencoded += int(p.reencoded)
            frames[key][rel] = int(plan.length[sel].sum())
        chunk, fidx = chunk_file(seq, chunks_size)
        cols[f"videos/{key}/chunk_index"] = pa.array(chunk)
        cols[f"videos/{key}/file_index"] = pa.array(fidx)
        cols[f"videos/{key}/from_timestamp"] = pa.array(new_from)
        cols[f"videos/{key}/to_timestamp"] = pa.array(new_to)
    shutil.rmtree(staging / FETCHED, ignore_errors=True)
    return cols, frames, reencoded


def check_joinable(datasets: list[Dataset], keys: list[str]) -> None:
    """Every source mp4 of each video key can share one stream with the first (ValueError
    naming the key, the two files and what differs); local sources only (remote ones are
    checked by the copy itself)."""
    from episodekit.prep.remux import signature_difference, stream_signature

    for key in keys:
        first: tuple[str, dict] | None = None
        for ds in datasets:
            if not ds.is_local:
                continue
            rows = np.arange(ds.num_episodes)
            pairs = set(
                zip(
                    _column(ds, key, "chunk_index", rows).tolist(),
                    _column(ds, key, "file_index", rows).tolist(),
                )
            )
            for c, f in sorted(pairs):
                path = ds.safe_join(ds.video_path(key, int(c), int(f)))
                sig = stream_signature(path)
                if first is None:
                    first = (path, sig)
                    continue
                diff = signature_difference(first[1], sig)
                if diff:
                    raise ValueError(
                        f"{key}: {path} cannot be joined with {first[0]} without re-encoding "
                        f"({diff})"
                    )


__all__ = ["check_joinable", "write_videos"]
