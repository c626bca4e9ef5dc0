"""Map-style frames with LeRobot's delta-window semantics: ``FrameDataset``.

``ds[i]`` is frame ``i`` of the selected episodes (all by default): every non-video feature as
numpy, ``task`` (string), ``speed`` (the episode's bucket from ``meta/speed_percentiles.jsonl``,
50 when absent), and for each key of ``delta_timestamps`` the window of values at
``t + round(delta * fps)`` frames, clamped to the episode's first/last frame, with
``{key}_is_pad`` True exactly where the query fell outside the episode (LeRobot's rules).
Video features: with ``video_backend="pyav"`` (the ``[video]`` extra) ``sample[key]`` is the
decoded uint8 frame (or window of frames) closest to ``from_timestamp`` + the frame's timestamp
within ``tolerance_s``; without a backend it is ``{"path": mp4 path, "timestamp": seconds in that
file}``, so any decoder can be plugged in.
``get_batch(indices)`` does the same for many frames with numpy fancy indexing only.

Where the values come from: a **frame store** (``episodekit prep frames ROOT``: the fixed-width
columns decoded once into memory-mapped ``.npy`` files, shared by every process of a node through
the page cache) when a fresh one exists, else the data parquet through a bounded cache of decoded
row groups. Image and string columns always come from parquet. Random access over parquet whose
decoded size exceeds ``cache_mb`` decodes a row group per few frames: that case warns once and
names the command that builds the store.
"""

from __future__ import annotations

import operator
import os
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, as_dataset
from episodekit.core.words import plural
from episodekit.loaders.batch_dicts import _no_rows, _squeeze
from episodekit.loaders.frame_columns import (  # noqa: F401 (python_valued: re-exported)
    DEFAULT_SPEED,
    _row_shape,
    _speed_buckets,
    python_valued,
)
from episodekit.loaders.kinds import looks_like_mixture, mixture_part
from episodekit.loaders.options import AUTO, DEFAULT_TOLERANCE_S, ReadOptions
from episodekit.loaders.reader import (
    DEFAULT_CACHE_MB,
    DEFAULT_FOOTER_MB,
    PoolRows,
    RowGroupReader,
)
from episodekit.loaders.store import FrameStore, find_store, frames_command, warn_once
from episodekit.loaders.video import PyAVBackend, make_backend, resolve_backend
from episodekit.loaders.windows import (
    clamp_to_episode,
    clamped_window,
    consecutive,
    delta_offsets,
    int_indices,
)


class FrameDataset:
    """Map-style frames of a prepared root or of a mixture: ``len()``, ``ds[i]`` (one sample),
    ``get_batch(indices)`` (a batch), all read through one :class:`ReadOptions`.

    One class for both: a dataset is its sources (``datasets``, each a
    :class:`RootFrameDataset`), frames source after source. A root (path, URL, hub id or opened
    ``Dataset``) is one source whose samples are its own (no renaming, padding or masks; its
    reader's attributes, ``ds``, ``fps``, ``store``, ``locate``, ``get_frames``..., are the
    dataset's); a mixture plan, its folder or a mixture spec is one source per root, with the
    mixture's names, padding and masks plus ``source`` and ``source_index``
    (:mod:`episodekit.loaders.mixture`). ``is_mixture`` says which.
    """

    options: ReadOptions
    is_mixture = False

    def __init__(
        self,
        root: Any,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episodes: Sequence[int] | np.ndarray | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        speed: bool | str = True,
        footer_mb: float = DEFAULT_FOOTER_MB,
        video_backend: str | PyAVBackend | None = "auto",
        store: str | os.PathLike | None = AUTO,
    ):
        self.options = ReadOptions(
            delta_timestamps, tolerance_s, cache_mb, speed, footer_mb, video_backend, store
        )
        self.delta_timestamps = dict(self.options.delta_timestamps or {})
        if looks_like_mixture(root):
            if episodes is not None:
                raise ValueError(
                    "a mixture selects episodes per source (sources[i].episodes/tasks)"
                )
            self.is_mixture = True
            self.spec, self.features, self.datasets = mixture_part("open_sources")(
                root, self.options
            )
            self.source_names = self.spec.names
        else:
            self._root = RootFrameDataset.open(root, self.options, episodes)
            self.datasets = [self._root]
        sizes = [len(f) for f in self.datasets]
        self.source_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def __getattr__(self, name: str) -> Any:
        # a root's frames answer what its one source knows (ds, fps, store, locate, ...)
        root = self.__dict__.get("_root")
        if root is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(root, name)

    def __len__(self) -> int:
        return int(self.source_offsets[-1])

    def __repr__(self) -> str:
        if self.is_mixture:
            return f"FrameDataset(sources={self.source_names}, frames={len(self)})"
        return repr(self._root)

    def source_of(self, indices: np.ndarray) -> np.ndarray:
        """The source of each dataset index."""
        return np.searchsorted(self.source_offsets, indices, side="right") - 1

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Sample ``i`` (numpy values, ``task`` a string)."""
        if not self.is_mixture:
            return self._root[i]
        n = len(self)
        i = int(int_indices(np.asarray(i)).ravel()[0]) if not isinstance(i, int) else i
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"frame index {i} out of range for {plural(n, 'frame')}")
        s = int(self.source_of(np.array([i]))[0])
        item = self.datasets[s][i - int(self.source_offsets[s])]
        return self.features.convert(s, item, None)

    def get_batch(self, indices: np.ndarray | Sequence[int]) -> dict[str, Any]:
        """Samples ``indices`` as one batch (a leading batch axis; strings as lists)."""
        if not self.is_mixture:
            return self._root.get_batch(indices)
        idx = int_indices(indices).ravel()
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"frame index out of range for {plural(n, 'frame')}")
        src = self.source_of(idx)
        parts = []
        for s in np.unique(src).tolist():
            rows = np.flatnonzero(src == s)
            local = idx[rows] - self.source_offsets[s]
            parts.append(
                (rows, self.features.convert(s, self.datasets[s].get_batch(local), len(rows)))
            )
        if not parts:
            raise ValueError("get_batch needs at least one index")
        return mixture_part("assemble")(parts, len(idx))


class RootFrameDataset:
    """The frames of one LeRobot root: a source of a :class:`FrameDataset` (see the module
    docstring for the sample layout), also what the loaders read through.

    ``episodes`` selects episode indices (len() = their frames, in episode order);
    ``cache_mb`` bounds the decoded row-group pool, ``footer_mb`` the parsed footers of open
    files (files beyond it are closed and reopened when needed); ``speed=False`` skips the speed
    artifact (every sample then has speed 50), ``speed="memory"`` computes a missing one in
    memory without writing it (also ``EPISODEKIT_SPEED_IN_MEMORY=1``; by default it is written
    once, announced in one line); ``video_backend``: ``"auto"`` (the default)
    decodes video features when PyAV is installed, ``"pyav"`` or a
    :class:`~episodekit.loaders.video.PyAVBackend` (resize, CHW, open-file bound) always,
    ``"paths"`` (or None) returns their path and timestamp. ``store``: ``"auto"`` reads the
    fixed-width columns from the dataset's frame store when a fresh one exists (see
    :func:`episodekit.loaders.store.find_store`), ``None`` always from parquet, a path from that
    store (an error if it is missing or stale). It warns once when, without a store,
    the frames do not fit ``cache_mb`` (random access would thrash). Loaders that open frames
    themselves pass their :class:`ReadOptions` down (:meth:`open`; streams, which decode each
    row group once per epoch, turn that warning off with ``ReadOptions.warn_cache``).
    """

    def __init__(
        self,
        root: str | os.PathLike | Dataset,
        options: ReadOptions,
        episodes: Sequence[int] | np.ndarray | None = None,
    ):
        self._open(root, options, episodes)

    @classmethod
    def open(
        cls,
        root: str | os.PathLike | Dataset,
        options: ReadOptions,
        episodes: Sequence[int] | np.ndarray | None = None,
    ) -> RootFrameDataset:
        """The frames of ``root``'s ``episodes`` read with ``options`` (what loaders call)."""
        return cls(root, options, episodes)

    def _open(
        self,
        root: str | os.PathLike | Dataset,
        options: ReadOptions,
        episodes: Sequence[int] | np.ndarray | None,
    ) -> None:
        self.options = options
        self.delta_timestamps = dict(options.delta_timestamps or {})
        delta_timestamps, tolerance_s = options.delta_timestamps, options.tolerance_s
        cache_mb, store = options.cache_mb, options.store
        if episodes is not None:
            episodes = int_indices(episodes, "episodes")
            if episodes.size == 0:
                raise ValueError("episodes is empty: select at least one episode (or None: all)")
        ds = as_dataset(root)
        self.ds = ds
        # Video hook: None keeps {"path", "timestamp"}; "pyav" decodes (see loaders/video.py).
        backend = resolve_backend(options.video_backend, ds)
        self.video_backend = make_backend(backend, tolerance_s) if ds.video_keys else None
        self.fps = ds.fps
        features = ds.features
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
        self._listed = {k for k in self._plain if python_valued(features[k])}
        self._windows = [(k, off) for k, off in self.offsets.items() if k not in self.video_keys]
        self._video_windows = [(k, off) for k, off in self.offsets.items() if k in self.video_keys]
        self.reader = RowGroupReader(
            ds,
            columns,
            file_ids=ds.column("file_id")[rows],
            cache_mb=cache_mb,
            footer_mb=options.footer_mb,
        )
        self._ep_rg = self.reader.single_row_group(self._from, self._from + self._len)
        # True (a mixture's stream): columns held in an arena come back as PoolRows
        self.defer_pool_rows = False
        self.store: FrameStore | None = find_store(ds, store)
        if options.warn_cache and self.store is None and isinstance(store, str) and store == AUTO:
            self._warn_if_thrashing(columns, cache_mb)  # (streams read a row group once)
        stored = set(self.store.columns) if self.store is not None else set()
        self._store_base = self.store.base if self.store is not None else 0
        # ds[i] from the store: its columns by plain indexing, the others (images, strings)
        # through the parquet reader
        self._plain_pq = [c for c in self._plain if c not in stored]
        self._windows_pq = [(k, off) for k, off in self._windows if k not in stored]
        # stored windows of consecutive frames are gathered as blocks (see _store_window)
        self._block_windows = {
            k
            for k, off in self._windows
            if k in stored and len(off) <= len(self.store.columns[k]) and consecutive(off)
        }

        self._speed = _speed_buckets(ds, options.speed)[rows]
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
                [ds.safe_join(ds.video_path(key, int(c), int(f))) for c, f in pairs], dtype=object
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

    def _warn_if_thrashing(self, columns: Mapping[str, tuple[int, ...]], cache_mb: float) -> None:
        """Warn once when the decoded columns cannot fit the row-group cache (no store)."""
        row_bytes = 0
        for c, shape in columns.items():
            try:
                itemsize = np.dtype(self.ds.features.get(c, {}).get("dtype", "float32")).itemsize
            except TypeError:  # image / string features: their size is not known up front
                continue
            row_bytes += itemsize * int(np.prod(shape or (1,)))
        need = self._n * row_bytes
        if need > cache_mb * 2**20:
            warn_once(
                str(self.ds.root),
                "thrash",
                f"{self._n:,} frames (~{need / 2**20:,.0f} MiB decoded) do not fit "
                f"cache_mb={cache_mb:g}: random access will decode a parquet row group per few "
                f"frames. Build the frame store once with `{frames_command(self.ds)}` "
                "(FrameDataset then memory-maps it), or raise cache_mb.",
            )

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
        idx = int_indices(indices)
        idx = np.where(idx < 0, idx + self._n, idx)
        bad = (idx < 0) | (idx >= self._n)
        if bad.any():
            raise IndexError(
                f"frame index {int(np.asarray(indices).ravel()[np.flatnonzero(bad.ravel())[0]])} "
                f"out of range for {plural(self._n, 'frame')}"
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
            raise IndexError(f"frame index {i} out of range for {plural(n, 'frame')}")
        k = bisect_right(self._cum_l, i) - 1
        s = self._from_l[k]
        g = s + i - self._cum_l[k]
        if self.store is not None:
            return self._item_from_store(k, s, g)
        rg = self._ep_rg_l[k]
        reader = self.reader
        if rg < 0:  # episode split across row groups: the general path
            return _squeeze(self._batch(np.array([g]), np.array([k])))
        slot = int(reader.slot[rg])
        if slot < 0 or not reader.complete(np.array([rg]))[0]:
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
                qc, pad = clamp_to_episode(off + g, s, e)
                out[key] = np.take(pool[key], qc + base, axis=0)
                out[f"{key}_is_pad"] = pad
        ti = int(pool["task_index"][p]) if self._frame_task else int(self._ep_task_index[k])
        out["task"] = self._task_of.get(ti, "")
        out["speed"] = self._speed_l[k]
        for key, (paths, start) in self._video.items():
            win = next((off for vk, off in self._video_windows if vk == key), None)
            if win is None:
                ts = start[k] + float(pool["timestamp"][p])
            else:
                qc, out[f"{key}_is_pad"] = clamp_to_episode(win + g, s, e)
                ts = start[k] + pool["timestamp"][qc + base].astype(np.float64)
            out[key] = self._video_value(paths[k], ts, start[k], self._len_l[k])
        return out

    def _video_value(self, paths: Any, ts: Any, ep_start: Any, ep_len: Any) -> Any:
        """Video hook: decoded uint8 frames with a backend (told the episode's start in the file
        and its length), else ``{"path", "timestamp"}``."""
        if self.video_backend is None:
            return {"path": paths, "timestamp": ts}
        return self.video_backend.decode(paths, ts, ep_start, ep_len)

    def _item_from_store(self, k: int, s: int, g: int) -> dict[str, Any]:
        """``ds[i]`` through the store: plain indexing of memory-mapped arrays (columns it does
        not hold come from parquet)."""
        cols = self.store.columns
        p = g - self._store_base
        out: dict[str, Any] = {}
        e = s + self._len_l[k]
        if self._plain_pq or self._windows_pq:  # images, strings: from parquet
            requests = [(c, np.array([g])) for c in self._plain_pq]
            for key, off in self._windows_pq:
                q, _ = clamped_window(np.array([g]), off, np.array([[s]]), np.array([[e]]))
                requests.append((key, q))
            got = self._gather_parquet(requests, np.array([k]))
            from_pq = {c: v[0] for (c, _), v in zip(requests, got)}
            for c in self._plain:
                v = cols[c][p] if c in cols else from_pq[c]
                out[c] = v.copy() if isinstance(v, np.ndarray) and c in cols else v
        else:
            for c in self._plain:
                v = cols[c][p]
                out[c] = v.copy() if isinstance(v, np.ndarray) else v
        for key, off, lo, hi in self._windows_fast:
            if key not in cols:
                out[key] = from_pq[key]
                out[f"{key}_is_pad"] = clamp_to_episode(off + g, s, e)[1]
                continue
            if s <= g + lo and g + hi < e:  # the whole window lies inside the episode
                if key in self._block_windows:  # consecutive frames: one slice
                    out[key] = cols[key][p + lo : p + hi + 1].copy()
                else:
                    out[key] = np.take(cols[key], off + p, axis=0)
                out[f"{key}_is_pad"] = np.zeros(len(off), dtype=bool)
            else:
                qc, pad = clamp_to_episode(off + g, s, e)
                out[key] = np.take(cols[key], qc - self._store_base, axis=0)
                out[f"{key}_is_pad"] = pad
        ti = int(out["task_index"]) if self._frame_task else int(self._ep_task_index[k])
        out["task"] = self._task_of.get(ti, "")
        out["speed"] = self._speed_l[k]
        for key, (paths, start) in self._video.items():
            win = next((off for vk, off in self._video_windows if vk == key), None)
            if win is None:
                (t,) = self._gather([("timestamp", np.array([g]))], np.array([k]))
                ts = start[k] + float(t[0])
            else:
                qc, out[f"{key}_is_pad"] = clamp_to_episode(win + g, s, e)
                (t,) = self._gather([("timestamp", qc)], np.array([k]))
                ts = start[k] + t.astype(np.float64)
            out[key] = self._video_value(paths[k], ts, start[k], self._len_l[k])
        return out

    # -- batches -----------------------------------------------------------------------------

    def get_batch(self, indices: np.ndarray | Sequence[int]) -> dict[str, Any]:
        """Frames ``indices`` as one batch: arrays with a leading batch axis, ``task`` a list."""
        k, g = self.locate(int_indices(indices).ravel())
        return self._batch(g, k)

    def get_frames(self, frames: np.ndarray | Sequence[int]) -> dict[str, Any]:
        """Like :meth:`get_batch` but by global frame index (``dataset_from_index`` space)."""
        g = int_indices(frames, "global frame indices").ravel()
        k = np.searchsorted(self._from, g, side="right") - 1
        km = np.maximum(k, 0)
        bad = (k < 0) | (g >= self._from[km] + self._len[km])
        if bad.any():
            raise IndexError(f"global frame {int(g[bad][0])} is not in the selected episodes")
        return self._batch(g, k)

    def _batch(self, g: np.ndarray, k: np.ndarray) -> dict[str, Any]:
        if g.size == 0 and len(self):  # an empty batch: a one-frame batch's arrays, 0 rows long
            one = self._batch(self._from[:1].copy(), np.zeros(1, dtype=np.int64))
            return {n: _no_rows(v) for n, v in one.items()}
        s = self._from[k][:, None]
        e = s + self._len[k][:, None]
        requests: list[tuple[str, np.ndarray]] = [(c, g) for c in self._plain]
        pads: dict[str, np.ndarray] = {}
        blocks: dict[str, np.ndarray] = {}
        for key, off in self._windows:
            if key in self._block_windows:
                blocks[key], pads[f"{key}_is_pad"] = self._store_window(key, off, g, s, e)
                requests.append((key, None))
                continue
            q, pads[f"{key}_is_pad"] = clamped_window(g, off, s, e)
            requests.append((key, q))
        video_req: dict[str, int] = {}
        for key in self.video_keys:
            win = next((off for vk, off in self._video_windows if vk == key), None)
            if win is None:
                frames = g
            else:
                frames, pads[f"{key}_is_pad"] = clamped_window(g, win, s, e)
            video_req[key] = len(requests)
            requests.append(("timestamp", frames))
        values = self._gather([r for r in requests if r[1] is not None], k)
        if blocks:  # put the store's window blocks back in request order
            it = iter(values)
            values = [blocks[c] if f is None else next(it) for c, f in requests]
        out: dict[str, Any] = {}
        for (c, _), v in zip(requests[: len(self._plain) + len(self._windows)], values):
            out[c] = v.tolist() if c in self._listed else v
        out.update(pads)
        ti = out["task_index"] if self._frame_task else self._ep_task_index[k]
        out["task"] = self._task_strings(ti)
        out["speed"] = self._speed[k]
        for key, (paths, start) in self._video.items():
            ts = values[video_req[key]].astype(np.float64)
            ts = ts + (start[k] if ts.ndim == 1 else start[k][:, None])
            out[key] = self._video_value(paths[k], ts, start[k], self._len[k])
        return out

    def _store_window(
        self, key: str, off: np.ndarray, g: np.ndarray, s: np.ndarray, e: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """A contiguous window (offsets a, a+1, ..., b) of a stored column for every frame: one
        block copy per frame through a sliding-window view of the mapped array, then the rows
        whose window leaves the episode are redone clamped (LeRobot's padding)."""
        arr = self.store.columns[key]
        base = self._store_base
        view = self.store.window_view(key, len(off))
        start = g + int(off[0])
        vals = view[np.clip(start - base, 0, len(view) - 1)]
        pad = np.zeros((len(g), len(off)), dtype=bool)
        rows = np.flatnonzero((start < s[:, 0]) | (start + (len(off) - 1) >= e[:, 0]))
        if rows.size:
            qc, pad[rows] = clamp_to_episode(g[rows, None] + off, s[rows], e[rows])
            vals[rows] = np.take(arr, qc - base, axis=0)
        return vals, pad

    def _task_strings(self, task_index: np.ndarray) -> list[str]:
        pos = np.searchsorted(self._task_ids, task_index)
        pos = np.minimum(pos, len(self._task_ids) - 1)
        known = self._task_ids[pos] == task_index if len(self._task_ids) else task_index < -1
        return np.where(known, self._task_names[pos], "").tolist() if len(pos) else []

    def _gather(self, requests: list[tuple[str, np.ndarray]], k: np.ndarray) -> list[np.ndarray]:
        """Values of each ``(column, global frames)`` request: from the store for the columns it
        holds (one ``np.take`` each), the rest from parquet."""
        if self.store is None:
            defer = len(self._plain) + len(self._windows) if self.defer_pool_rows else 0
            return self._gather_parquet(requests, k, defer)
        cols, base = self.store.columns, self._store_base
        out: list[Any] = [None] * len(requests)
        rest = []
        for j, (c, f) in enumerate(requests):
            a = cols.get(c)
            if a is None:
                rest.append(j)
            else:
                out[j] = np.take(a, f - base if base else f, axis=0)
        if rest:
            for j, v in zip(rest, self._gather_parquet([requests[j] for j in rest], k)):
                out[j] = v
        return out

    def _gather_parquet(
        self, requests: list[tuple[str, np.ndarray]], k: np.ndarray, defer: int = 0
    ) -> list[Any]:
        """Pool gather; vectorized fast path when each frame's episode sits in one row group.

        In that path, the first ``defer`` requests on columns whose pool is an arena region
        come back as :class:`PoolRows` (indices, not values): the caller gathers them."""
        reader = self.reader
        rgk = self._ep_rg[k]
        if len(rgk) and (rgk >= 0).all():
            first = self._from[k] - reader.rg_start[rgk]  # each frame's episode, local rows
            r0, r1 = int(rgk.min()), int(rgk.max())
            if r0 == r1:  # one row group (most batches of a stream): one range to check
                lo, hi = int(first.min()), int((first + self._len[k]).max())
                ok = reader.covers(np.array([r0]), lo, hi)[0]
                missing = rgk[:0] if ok else np.array([r0])
            else:
                missing = rgk[~reader.covers(rgk, first, first + self._len[k])]
            if missing.size:
                reader.load(missing)
            slots = reader.slot[rgk]
            if (slots >= 0).all():
                base = slots - reader.rg_start[rgk]
                pool, shared = reader.pool, reader.pool_base
                out: list[Any] = []
                for j, (c, f) in enumerate(requests):
                    if j < defer and c in shared and c != "task_index":
                        arr, offset = shared[c]  # gathered later, with the other sources' rows
                        at = base + offset
                        out.append(PoolRows(arr, f + (at if f.ndim == 1 else at[:, None])))
                    else:
                        rows = f + (base if f.ndim == 1 else base[:, None])
                        out.append(np.take(pool[c], rows, axis=0))
                return out
        return reader.gather(requests)
