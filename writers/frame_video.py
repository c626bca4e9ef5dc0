"""The video of an edit that cuts frames inside episodes: per video key, the output episodes
grouped into mp4 files as :mod:`episodekit.writers.video` does (roll-over at
``video_files_size_in_mb``), each file one :func:`~episodekit.writers.smart_cut.smart_remux` of
the episodes' kept frame ranges (an episode not cut is one range: all packets copied).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.layout.files import chunk_file, file_path, roll_over
from episodekit.core.paths import MIB, VIDEO_PATH_V3
from episodekit.writers.frames import kept_ranges
from episodekit.writers.plan import OutputPlan
from episodekit.writers.smart_cut import CutStats, Piece, smart_remux
from episodekit.writers.video import FETCHED, _byte_estimates, _local_mp4, _sources


def write_videos(
    plan: OutputPlan,
    staging: Path,
    keys: list[str],
    file_limit_mb: float,
    chunks_size: int,
    lossless_only: bool = False,
) -> tuple[dict[str, pa.Array], dict[str, dict[str, int]], CutStats]:
    """Write every video key's files under ``staging``; return the episodes' ``videos/*``
    columns, each written file's frame count per key, and what the cuts copied and re-encoded."""
    cols: dict[str, pa.Array] = {}
    frames: dict[str, dict[str, int]] = {}
    stats = CutStats()
    t0 = time.perf_counter()
    fps = float(plan.datasets[0].fps)
    for key in keys:
        cam = CutStats()
        ids, rels, frm, to = _sources(plan, key)
        est = _byte_estimates(plan, key, ids, rels, frm, to)
        for i, mask in plan.frames.items():  # a cut episode's share of its bytes
            est[i] *= np.count_nonzero(mask) / max(len(mask), 1)
        seq = roll_over(est, file_limit_mb * MIB)
        new_from = np.zeros(plan.num_episodes)
        new_to = np.zeros(plan.num_episodes)
        frames[key] = {}
        for f in np.unique(seq).tolist():
            sel = np.flatnonzero(seq == f).tolist()
            pieces = []
            for i in sel:
                d = int(ids[i])
                mask = plan.frames.get(i)
                n = len(mask) if mask is not None else int(plan.length[i])
                ranges = kept_ranges(mask) if mask is not None else ((0, n),)
                src = _local_mp4(plan.datasets[d], rels[i], staging, d)
                pieces.append(Piece(src, float(frm[i]), n, ranges, int(plan.src_episode[i])))
            rel = file_path(VIDEO_PATH_V3, *chunk_file(f, chunks_size), video_key=key)
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            placed = smart_remux(pieces, staging / rel, fps, lossless_only, cam)
            for i, p in zip(sel, placed):
                new_from[i], new_to[i] = p.from_ts, p.to_ts
            frames[key][rel] = int(plan.length[sel].sum())
        chunk, fidx = chunk_file(seq, chunks_size)
        cols[f"videos/{key}/chunk_index"] = pa.array(chunk)
        cols[f"videos/{key}/file_index"] = pa.array(fidx)
        cols[f"videos/{key}/from_timestamp"] = pa.array(new_from)
        cols[f"videos/{key}/to_timestamp"] = pa.array(new_to)
        stats.add(key, cam)
    shutil.rmtree(staging / FETCHED, ignore_errors=True)
    stats.video_seconds = time.perf_counter() - t0
    return cols, frames, stats
