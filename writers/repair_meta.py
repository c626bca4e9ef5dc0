"""The ``meta/episodes`` rows ``episodekit repair`` rebuilds (those that never reached the disk,
or that disagree with the rows), computed the way LeRobot's recorder computes them, and where
each kept row goes.

- length, ``dataset_from_index``/``to_index`` and data chunk/file from where its rows are;
  tasks from its rows' ``task_index`` (LeRobot stores ``list(set(tasks))``);
- per camera chunk/file and ``from_timestamp``/``to_timestamp`` from the mp4s (the plan's
  :class:`~episodekit.writers.repair_plan._Cursor`);
- stats: LeRobot's per-episode stats (``compute_episode_stats``) of every numeric feature from
  its rows, bit for bit what the recorder wrote; image and video features from its sampled
  frames (``sample_indices``), image bytes decoded with Pillow, video frames decoded from the
  mp4, which the recorder measured before encoding (lossy coding moves them by a few levels);
- the ``meta/episodes`` file of a row: a recovered row stays in its file; a rebuilt row goes
  where the recorder would have flushed it: after a recovered row of a file the recorder had
  closed (it rolled over), the next file, else that same file.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.errors import DatasetError
from episodekit.metadata.image_stats import (
    TOLERANCE_S,
    _require_pil,
    downsample_step,
    sample_indices,
)
from episodekit.metadata.stats import feature_values
from episodekit.writers import repair_schema
from episodekit.writers.repair_kept import column
from episodekit.writers.repair_plan import Episode, RepairPlan, episode_rows


def next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """LeRobot's ``update_chunk_file_indices``."""
    return (chunk + 1, 0) if file + 1 >= chunks_size else (chunk, file + 1)


def meta_files(plan: RepairPlan) -> np.ndarray:
    """The ``meta/episodes`` (chunk, file) of each kept episode's row (see the module
    docstring), one row of two int64 each: column operations, no Python object per episode.

    A row found on disk (kept as it is, or rebuilt because it disagreed) stays in its file; a
    rebuilt row without one goes where the last row found before it is, or, when that file was
    closed (it has its footer: the recorder had rolled over), to the next file (every such row
    up to the next found one); before any found row, to (0, 0)."""
    inv = plan.inventory
    source = column(plan.kept, "source_row")
    out = np.zeros((len(source), 2), np.int64)
    found = source >= 0
    if not found.any():
        return out
    assert plan.recovered is not None
    meta = np.asarray(plan.recovered.file_of, np.int64)[source[found]]
    places = np.array([(m.chunk, m.file) for m in inv.episodes], np.int64).reshape(-1, 2)
    closed = np.array([m.intact for m in inv.episodes], bool)
    out[found] = places[meta]
    # each episode's last found row at or before it (-1: none yet)
    last = np.maximum.accumulate(np.where(found, np.arange(len(source)), -1))
    lost = ~found & (last >= 0)
    if lost.any():
        f = np.zeros(len(source), np.int64)
        f[found] = meta
        prev = last[lost]
        at, shut = out[prev], closed[f[prev]]
        chunks_size = int(inv.info.get("chunks_size") or 1000)
        roll = shut & (at[:, 1] + 1 >= chunks_size)
        nxt = np.where(roll[:, None], np.c_[at[:, 0] + 1, np.zeros(len(at), np.int64)], at)
        nxt[shut & ~roll, 1] += 1
        out[lost] = np.where(shut[:, None], nxt, at)
    return out


def _video_frames(plan: RepairPlan, e: Episode, key: str, timestamps: np.ndarray) -> np.ndarray:
    from episodekit.core.video import VideoFile

    chunk, file, start, _ = e.videos[key]
    rel = next(v.rel for v in plan.inventory.videos[key] if (v.chunk, v.file) == (chunk, file))
    picks = sample_indices(e.length)
    vf = VideoFile(plan.inventory.root / rel, threads=1)
    try:
        frames = vf.read_seconds((start + timestamps[picks]).tolist(), TOLERANCE_S)
    finally:
        vf.close()
    return np.stack(frames)


def _image_frames(col: pa.ChunkedArray, length: int, root: Path) -> np.ndarray:
    image = _require_pil()
    picks = sample_indices(length)
    col = col.combine_chunks().take(pa.array(picks))
    out = []
    for b in pc.struct_field(col, "bytes").to_pylist():
        if b is None:
            raise DatasetError("an image with no bytes: its stats cannot be rebuilt", str(root))
        with image.open(io.BytesIO(b)) as im:
            out.append(np.asarray(im.convert("RGB")))
    return np.stack(out)


def episode_stats(plan: RepairPlan, e: Episode) -> dict[str, dict[str, np.ndarray]]:
    """LeRobot's per-episode stats of every feature it computes stats for (module docstring)."""
    info = plan.inventory.info
    feats = info["features"]
    names = repair_schema.stats_features(info)
    in_data = [n for n in names if feats[n].get("dtype") != "video"]
    columns = sorted(set(in_data) | {"timestamp", "frame_index"})
    table = episode_rows(plan.inventory, e.data, e.run, columns)
    out = {}
    for name in names:
        dtype = feats[name].get("dtype")
        if dtype in ("image", "video"):
            if dtype == "video":
                ts = table["timestamp"].to_numpy().astype(np.float64)
                frames = _video_frames(plan, e, name, ts)
            else:
                frames = _image_frames(table[name], e.length, plan.inventory.root)
            step = downsample_step(frames.shape[1], frames.shape[2])
            out[name] = repair_schema.lerobot_image_stats(frames[:, ::step, ::step])
        elif name == "timestamp":
            out[name] = repair_schema.lerobot_episode_stats(_recorded_timestamps(plan, table))
        else:
            dims = int(np.prod(feats[name].get("shape") or [1]))
            values = feature_values(table[name], dims, name)
            out[name] = repair_schema.lerobot_episode_stats(values)
    return out


def _recorded_timestamps(plan: RepairPlan, table: pa.Table) -> np.ndarray:
    """The timestamps the recorder measured its stats on: it computes ``frame_index / fps`` in
    float64 and stores them as float32; when the stored ones are exactly that, the float64
    values (else the stored ones)."""
    stored = table["timestamp"].to_numpy()
    exact = table["frame_index"].to_numpy() / float(plan.inventory.info["fps"])
    return exact if np.array_equal(exact.astype(stored.dtype), stored) else stored


def rebuilt_row(plan: RepairPlan, e: Episode, meta_file: tuple[int, int]) -> dict:
    """The metadata row of ``e`` as LeRobot's recorder would have written it."""
    return repair_schema.episode_row(
        plan.inventory.info,
        e.index,
        e.tasks,
        e.length,
        (e.data.chunk, e.data.file),
        e.first_index,
        e.videos,
        episode_stats(plan, e),
        meta_file,
    )
