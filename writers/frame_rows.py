"""Rows of episodes cut inside: the writer's hook that drops the frames an edit leaves out and
renumbers the kept ones, the check of the written output, and its recomputed stats.

An episode cut inside (:attr:`OutputPlan.frames <episodekit.writers.plan.OutputPlan>`: a bool
mask over its source frames) keeps its place; its kept rows are written with ``frame_index``
renumbered ``0..n-1`` and ``timestamp = frame_index / fps`` (LeRobot's rule, which the cut video
follows: its frames sit back to back), every other value as the source's (``index`` and
``episode_index`` are the writer's, as for any episode). Episodes not cut are copied as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.errors import DatasetError
from episodekit.writers.plan import OutputPlan


class FrameCutter:
    """The kept rows of the output episodes ``pos`` (one run of the writer), renumbered.

    The masks of the cut episodes are laid end to end in one flat array, so a batch is cut with
    a few numpy operations whatever the number of episodes in it."""

    def __init__(self, plan: OutputPlan, pos: np.ndarray, fps: float) -> None:
        self.fps = float(fps)
        self.base = np.full(len(pos), -1, dtype=np.int64)  # offset in the flat masks (-1: whole)
        self.size = np.zeros(len(pos), dtype=np.int64)
        masks, at = [], 0
        for j, p in enumerate(pos.tolist()):
            mask = plan.frames.get(p)
            if mask is None:
                continue
            self.base[j], self.size[j] = at, len(mask)
            masks.append(np.asarray(mask, dtype=bool))
            at += len(mask)
        self.keep = np.concatenate(masks) if masks else np.zeros(0, dtype=bool)
        # the new frame_index of each kept frame: its rank among its episode's kept frames
        ranks = [np.cumsum(m) - 1 for m in masks]
        self.new = np.concatenate(ranks) if ranks else np.zeros(0, dtype=np.int64)

    def _rows(self, batch: pa.RecordBatch, k: np.ndarray, path: str) -> tuple:
        """``(cut, fi, flat, keep)`` per row: in an episode cut inside, its source frame_index,
        its place in the flat masks, kept."""
        base = self.base[k]
        cut = base >= 0
        fi = batch.column("frame_index").to_numpy(zero_copy_only=False).astype(np.int64)
        bad = cut & ((fi < 0) | (fi >= self.size[k]))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"frame_index {int(fi[i])} is outside its episode's {int(self.size[k][i])} frames",
                path,
            )
        flat = np.where(cut, base + fi, 0)
        return cut, fi, flat, ~cut | self.keep[flat]

    def kept_rows(self, batch: pa.RecordBatch, k: np.ndarray, path: str) -> np.ndarray:
        """Which rows of ``batch`` :meth:`apply` keeps (a bool per row)."""
        if not (self.base[k] >= 0).any():
            return np.ones(batch.num_rows, dtype=bool)
        return self._rows(batch, k, path)[3]

    def apply(self, batch: pa.RecordBatch, k: np.ndarray, path: str) -> tuple:
        """``(batch, k)`` (``k``: each row's position in ``pos``) without the dropped frames,
        ``frame_index`` and ``timestamp`` of the cut episodes' rows renumbered."""
        if not (self.base[k] >= 0).any():
            return batch, k
        cut, fi, flat, keep = self._rows(batch, k, path)
        new_fi = np.where(cut, self.new[flat], fi)[keep]
        cut, k = cut[keep], k[keep]
        batch = batch.filter(pa.array(keep))
        schema = batch.schema
        cols = dict(zip(schema.names, batch.columns))
        cols["frame_index"] = pa.array(new_fi, schema.field("frame_index").type)
        ts_type = schema.field("timestamp").type
        ts = cols["timestamp"].to_numpy(zero_copy_only=False)
        new_ts = (new_fi / self.fps).astype(ts.dtype)
        cols["timestamp"] = pa.array(np.where(cut, new_ts, ts), ts_type)
        return pa.RecordBatch.from_arrays([cols[n] for n in schema.names], schema=schema), k


def verify_frames(staging: Path, plan: OutputPlan) -> None:
    """Every written episode's ``frame_index`` runs ``0..n-1`` and a cut episode's timestamps
    are ``frame_index / fps``; raises :class:`VerificationError` naming the first episode not."""
    from episodekit.core.dataset import open_dataset, read_parquet
    from episodekit.prep.rewrite import VerificationError

    ds = open_dataset(str(staging))
    cut = np.zeros(plan.num_episodes, dtype=bool)
    cut[list(plan.frames)] = True
    for f in np.unique(ds.column("file_id")).tolist():
        t = read_parquet(
            ds.fs, ds.data_path(f), ["index", "episode_index", "frame_index", "timestamp"]
        )
        ep = t["episode_index"].to_numpy()
        fi = t["frame_index"].to_numpy()
        want = t["index"].to_numpy() - plan.from_index[ep]
        wrong = fi != want
        ts = t["timestamp"].to_numpy()
        wrong |= cut[ep] & (ts != (fi / ds.fps).astype(ts.dtype))
        if wrong.any():
            e = int(ep[np.flatnonzero(wrong)[0]])
            raise VerificationError(f"episode {e}: frame_index or timestamp not renumbered")


def cut_image_stats(staging: Path, episodes: pa.Table, cut: np.ndarray) -> pa.Table | None:
    """The staged episodes table with the image/video stats of the episodes ``cut`` inside
    computed from their sampled frames (their per-episode count is the frames sampled, which
    must fit the episode); the other episodes keep theirs. When some episode has none to keep
    (a source without them), every episode's are computed. None: no image/video features."""
    from episodekit.core.dataset import open_dataset
    from episodekit.metadata.image_stats import compute_image_stats, image_features
    from episodekit.writers.stream_stats import replace_rows

    ds = open_dataset(str(staging))
    feats = image_features(ds.info)
    if not feats:
        return None
    cols = [f"stats/{n}/{k}" for n in feats for k in ("min", "max", "mean", "std", "count")]
    whole = all(c in episodes.column_names and not episodes[c].null_count for c in cols)
    img = compute_image_stats(ds, episodes=cut if whole else None)
    if img is None:
        return None
    new = img.episode_columns(np.arange(len(img.episode_index)))
    return replace_rows(episodes, new, img.episode_index)
