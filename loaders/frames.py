"""Map-style frames with LeRobot's delta-window semantics: ``FrameDataset``.

``ds[i]`` is frame ``i`` of the selected episodes (all by default): every non-video feature as
numpy, ``task`` (string), ``speed`` (the episode's bucket from ``meta/speed_percentiles.jsonl``,
50 when absent), and for each key of ``delta_timestamps`` the window of values at
``t + round(delta * fps)`` frames, clamped to the episode's first/last frame, with
``{key}_is_pad`` True exactly where the query fell outside the episode (LeRobot's rules).
Video features are not decoded: ``sample[key] = {"path": mp4 path, "timestamp": seconds in that
file}`` (``from_timestamp`` + the frame's timestamp), so any decoder can be plugged in.
``get_batch(indices)`` does the same for many frames with numpy fancy indexing only.
"""

from __future__ import annotations

import operator
import os
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.loaders.reader import DEFAULT_CACHE_MB, DEFAULT_FOOTER_MB, RowGroupReader

DEFAULT_TOLERANCE_S = 1e-4
DEFAULT_SPEED = 50


def delta_offsets(
    delta_timestamps: Mapping[str, Sequence[float]] | None,
    features: Mapping[str, Any],
    fps: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> dict[str, np.ndarray]:
    """Frame offsets ``round(delta * fps)`` per key, after LeRobot's checks (clear ValueErrors)."""
    out: dict[str, np.ndarray] = {}
    for key, deltas in (delta_timestamps or {}).items():
        if key not in features:
            raise ValueError(
                f"delta_timestamps key {key!r} is not a feature of this dataset "
                f"(features: {sorted(features)})"
            )
        d = np.asarray(deltas, dtype=np.float64).ravel()
        if d.size == 0:
            raise ValueError(f"delta_timestamps[{key!r}] is empty")
        x = d * fps
        off = np.round(x)
        bad = np.abs(x - off) / fps > tolerance_s
        if bad.any():
            raise ValueError(
                f"delta_timestamps[{key!r}] has {float(d[bad][0]):g} s, not a multiple of 1/fps "
                f"(fps={fps:g}) within tolerance_s={tolerance_s:g}"
            )
        out[key] = off.astype(np.int64)
    return out


def _row_shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    if feature.get("dtype") in ("image", "string"):
        return ()
    shape = tuple(int(x) for x in feature.get("shape") or ())
    return () if shape in ((), (1,)) else shape


def _speed_buckets(ds: Dataset) -> np.ndarray:
    """Per-episode speed bucket (ds.episodes row order) from the artifact; 50 when unavailable."""
    from episodekit.metadata.speed import episode_buckets, load_or_compute

    return np.asarray(episode_buckets(ds, load_or_compute(ds)), dtype=np.int64)


class FrameDataset:
    """Map-style frames of a LeRobot root (see the module docstring for the sample layout).

    ``episodes`` selects episode indices (len() = their frames, in episode order);
    ``cache_mb`` bounds the decoded row-group pool, ``footer_mb`` the parsed footers of open
    files (files beyond it are closed and reopened when needed); ``speed=False`` skips the speed
    artifact (every sample then has speed 50).
    """

    def __init__(
        self,
        root: str | os.PathLike | Dataset,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episodes: Sequence[int] | np.ndarray | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        speed: bool = True,
        footer_mb: float = DEFAULT_FOOTER_MB,
    ):
        ds = as_dataset(root)
        self.ds = ds
        self.fps = ds.fps
        features = ds.features
        self.delta_timestamps = {k: list(v) for k, v in (delta_timestamps or {}).items()}
        self.offsets = delta_offsets(delta_timestamps, features, self.fps, tolerance_s)
        rows = ds.episode_rows(None if episodes is None else np.unique(np.asarray(episodes)))
        self.episode_rows = rows
        self.episode_index = ds.column("episode_index")[rows]
        self._from = ds.column("dataset_from_index")[rows]
        self._len = ds.column("length")[rows]
        self._cum = np.concatenate([[0], np.cumsum(self._len)]).astype(np.int64)
        self._n = int(self._cum[-1])

        self.video_keys = [k for k in ds.video_keys if k in features]
        columns = {k: _row_shape(f) for k, f in features.items() if f.get("dtype") != "video"}
        if self.video_keys and "timestamp" not in columns:
            columns["timestamp"] = ()
        self._plain = [k for k in columns if k not in self.offsets and k in features]
        self._windows = [(k, off) for k, off in self.offsets.items() if k not in self.video_keys]
        self._video_windows = [(k, off) for k, off in self.offsets.items() if k in self.video_keys]
        self.reader = RowGroupReader(
            ds, columns, file_ids=ds.column("file_id")[rows], cache_mb=cache_mb, footer_mb=footer_mb
        )
        self._ep_rg = self.reader.single_row_group(self._from, self._from + self._len)

        buckets = _speed_buckets(ds) if speed else np.full(ds.num_episodes, DEFAULT_SPEED)
        self._speed = np.asarray(buckets, dtype=np.int64)[rows]
        self._task_of = dict(
            zip(ds.tasks.column("task_index").to_pylist(), ds.tasks.column("task").to_pylist())
        )
        self._task_ids = ds.tasks.column("task_index").to_numpy()  # sorted
        self._task_names = np.array(ds.tasks.column("task").to_pylist() or [""], dtype=object)
        self._ep_task_index = ds.column("task_index")[rows]
        self._frame_task = "task_index" in self._plain  # LeRobot: the frame's task_index
        self._video: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for key in self.video_keys:
            chunk = ds.column(f"videos/{key}/chunk_index")[rows]
            fidx = ds.column(f"videos/{key}/file_index")[rows]
            pairs, inverse = np.unique(np.stack([chunk, fidx], 1), axis=0, return_inverse=True)
            paths = np.array(
                [ds.join(ds.video_path(key, int(c), int(f))) for c, f in pairs], dtype=object
            )
            start = ds.column(f"videos/{key}/from_timestamp")[rows].astype(np.float64)
            self._video[key] = (paths[inverse.ravel()], start)
        # Python lists for the scalar fast path of __getitem__ (O(episodes)).
        self._cum_l = self._cum.tolist()
        self._from_l = self._from.tolist()
        self._len_l = self._len.tolist()
        self._ep_rg_l = self._ep_rg.tolist()
        self._speed_l = self._speed.tolist()
        self._windows_fast = [(k, off, int(off.min()), int(off.max())) for k, off in self._windows]

    def __len__(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return (
            f"FrameDataset({self.ds.root!r}, episodes={len(self.episode_index)}, "
            f"frames={self._n}, windows={list(self.offsets)})"
        )

    @property
    def episode_lengths(self) -> np.ndarray:
        """Frames per selected episode (same order as ``episode_index``)."""
        return self._len

    @property
    def episode_starts(self) -> np.ndarray:
        """Position in this dataset (0..len-1) of each selected episode's first frame."""
        return self._cum[:-1]

    def locate(self, indices: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(selected-episode position, global frame index) of dataset indices; IndexError if out."""
        idx = np.asarray(indices, dtype=np.int64)
        idx = np.where(idx < 0, idx + self._n, idx)
        bad = (idx < 0) | (idx >= self._n)
        if bad.any():
            raise IndexError(
                f"frame index {int(np.asarray(indices).ravel()[np.flatnonzero(bad.ravel())[0]])} "
                f"out of range for {self._n} frames"
            )
        k = np.searchsorted(self._cum, idx, side="right") - 1
        return k, self._from[k] + (idx - self._cum[k])

    # -- single frame ------------------------------------------------------------------------

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = self._n
        i = operator.index(i)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"frame index {i} out of range for {n} frames")
        k = bisect_right(self._cum_l, i) - 1
        s = self._from_l[k]
        g = s + i - self._cum_l[k]
        rg = self._ep_rg_l[k]
        reader = self.reader
        if rg < 0:  # episode split across row groups: the general path
            return _squeeze(self._batch(np.array([g]), np.array([k])))
        slot = int(reader.slot[rg])
        if slot < 0:
            reader.load(np.array([rg]))
            slot = int(reader.slot[rg])
        base = slot - int(reader.rg_start[rg])
        pool = reader.pool
        p = g + base
        out: dict[str, Any] = {}
        for c in self._plain:
            v = pool[c][p]
            out[c] = v.copy() if isinstance(v, np.ndarray) else v
        e = s + self._len_l[k]
        for key, off, lo, hi in self._windows_fast:
            if s <= g + lo and g + hi < e:  # the whole window lies inside the episode
                out[key] = np.take(pool[key], off + p, axis=0)
                out[f"{key}_is_pad"] = np.zeros(len(off), dtype=bool)
            else:
                q = off + g
                out[key] = np.take(pool[key], np.minimum(np.maximum(q, s), e - 1) + base, axis=0)
                out[f"{key}_is_pad"] = (q < s) | (q >= e)
        ti = int(pool["task_index"][p]) if self._frame_task else int(self._ep_task_index[k])
        out["task"] = self._task_of.get(ti, "")
        out["speed"] = self._speed_l[k]
        for key, (paths, start) in self._video.items():
            win = next((off for vk, off in self._video_windows if vk == key), None)
            if win is None:
                ts = start[k] + float(pool["timestamp"][p])
            else:
                q = win + g
                ts = start[k] + pool["timestamp"][np.clip(q, s, e - 1) + base].astype(np.float64)
                out[f"{key}_is_pad"] = (q < s) | (q >= e)
            out[key] = {"path": paths[k], "timestamp": ts}
        return out

    # -- batches -----------------------------------------------------------------------------

    def get_batch(self, indices: np.ndarray | Sequence[int]) -> dict[str, Any]:
        """Frames ``indices`` as one batch: arrays with a leading batch axis, ``task`` a list."""
        k, g = self.locate(np.asarray(indices, dtype=np.int64).ravel())
        return self._batch(g, k)

    def get_frames(self, frames: np.ndarray | Sequence[int]) -> dict[str, Any]:
        """Like :meth:`get_batch` but by global frame index (``dataset_from_index`` space)."""
        g = np.asarray(frames, dtype=np.int64).ravel()
        k = np.searchsorted(self._from, g, side="right") - 1
        km = np.maximum(k, 0)
        bad = (k < 0) | (g >= self._from[km] + self._len[km])
        if bad.any():
            raise IndexError(f"global frame {int(g[bad][0])} is not in the selected episodes")
        return self._batch(g, k)

    def _batch(self, g: np.ndarray, k: np.ndarray) -> dict[str, Any]:
        s = self._from[k][:, None]
        e = s + self._len[k][:, None]
        requests: list[tuple[str, np.ndarray]] = [(c, g) for c in self._plain]
        pads: dict[str, np.ndarray] = {}
        for key, off in self._windows:
            q, pads[f"{key}_is_pad"] = _clamped_window(g, off, s, e)
            requests.append((key, q))
        video_req: dict[str, int] = {}
        for key in self.video_keys:
            win = next((off for vk, off in self._video_windows if vk == key), None)
            if win is None:
                frames = g
            else:
                frames, pads[f"{key}_is_pad"] = _clamped_window(g, win, s, e)
            video_req[key] = len(requests)
            requests.append(("timestamp", frames))
        values = self._gather(requests, k)
        out: dict[str, Any] = {}
        for (c, _), v in zip(requests[: len(self._plain) + len(self._windows)], values):
            out[c] = v
        out.update(pads)
        ti = out["task_index"] if self._frame_task else self._ep_task_index[k]
        out["task"] = self._task_strings(ti)
        out["speed"] = self._speed[k]
        for key, (paths, start) in self._video.items():
            ts = values[video_req[key]].astype(np.float64)
            ts = ts + (start[k] if ts.ndim == 1 else start[k][:, None])
            out[key] = {"path": paths[k], "timestamp": ts}
        return out

    def _task_strings(self, task_index: np.ndarray) -> list[str]:
        pos = np.searchsorted(self._task_ids, task_index)
        pos = np.minimum(pos, len(self._task_ids) - 1)
        known = self._task_ids[pos] == task_index if len(self._task_ids) else task_index < -1
        return np.where(known, self._task_names[pos], "").tolist() if len(pos) else []

    def _gather(self, requests: list[tuple[str, np.ndarray]], k: np.ndarray) -> list[np.ndarray]:
        """Pool gather; vectorized fast path when each frame's episode sits in one row group."""
        reader = self.reader
        rgk = self._ep_rg[k]
        if len(rgk) and (rgk >= 0).all():
            missing = rgk[reader.slot[rgk] < 0]
            if missing.size:
                reader.load(missing)
            slots = reader.slot[rgk]
            if (slots >= 0).all():
                base = slots - reader.rg_start[rgk]
                pool = reader.pool
                return [
                    np.take(pool[c], f + (base if f.ndim == 1 else base[:, None]), axis=0)
                    for c, f in requests
                ]
        return reader.gather(requests)


def _clamped_window(
    g: np.ndarray, off: np.ndarray, s: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Frames ``g + off`` clamped to each episode [s, e) and where they were clamped (is_pad).

    Only rows whose window leaves the episode are clamped (most windows lie inside).
    """
    q = g[:, None] + off[None, :]
    pad = np.zeros(q.shape, dtype=bool)
    rows = np.flatnonzero((g + off.min() < s[:, 0]) | (g + off.max() >= e[:, 0]))
    if rows.size:
        sub = q[rows]
        clamped = np.minimum(np.maximum(sub, s[rows]), e[rows] - 1)
        pad[rows] = clamped != sub
        q[rows] = clamped
    return q, pad


def _squeeze(batch: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in batch.items():
        out[key] = _squeeze(v) if isinstance(v, dict) else v[0]
    return out
