"""Decoded video frames for the loaders (the optional ``[video]`` extra, PyAV).

- By default (``video_backend="auto"``) every loader decodes video features when PyAV is
  installed and the root is local; ``video_backend="paths"`` (or None) returns
  ``{"path", "timestamp"}`` instead (:func:`resolve_backend`).
- :class:`PyAVBackend` is what ``FrameDataset(..., video_backend="pyav")`` uses: it returns uint8
  frames (HWC, or CHW with ``channels_first``) closest to each query time within ``tolerance_s``
  (LeRobot's rule; farther raises :class:`FrameTimestampError`), from a bounded per-process cache
  of open files. Each file decodes from its own packet index (no demuxer seek, no re-open) and
  continues forward instead of restarting when the next query lies in the same keyframe run (a
  window, or a neighbouring sample); each needed frame is decoded at most once per call.
- The stream: ``ShardedLoader(..., video_backend="pyav")`` (an episode cache of
  :data:`STREAM_EPISODE_CACHE_MB`; or ``PyAVBackend(episode_cache_mb=N)``) decodes each
  episode of a pool once, whole, in one sequential pass (one restart, decoder threads unless
  pinned), keeps its frames unconverted (yuv) in an LRU bounded by ``N`` and serves the pool's
  shuffled frames from it; the loader bounds its pool to what that cache holds. If episodes are
  still evicted before they are served (one episode larger than the cache), the backend warns
  once and decodes per batch instead.
- :func:`decode_episode` decodes the frames one episode needs in timestamp order, one restart per
  run of frames that share a keyframe interval.

PyAV opens local files: a hub root is decoded after ``prepare --out DIR --videos``.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from episodekit.core.errors import EnvironmentProblem
from episodekit.core.paths import MIB
from episodekit.core.video import FrameTimestampError, VideoError, VideoFile, require_av

__all__ = [
    "BACKENDS",
    "FrameTimestampError",
    "PyAVBackend",
    "VideoError",
    "decode_episode",
    "make_backend",
    "resolve_backend",
    "stream_backend",
]

BACKENDS = ("pyav",)
AUTO, PATHS = "auto", "paths"  # the default (decode when PyAV is installed), paths on request
DEFAULT_MAX_OPEN = 32  # open files per process (a container, its index and a decoder each)
STREAM_EPISODE_CACHE_MB = 256  # the stream's default: whole episodes decoded once, kept as yuv
THRASH_LIMIT = 8  # episodes evicted mostly unserved before the episode cache turns itself off


def frame_bytes(frame) -> int:
    """Bytes an ``av.VideoFrame`` holds (its planes)."""
    return sum(p.buffer_size for p in frame.planes)


class _Episode:
    """One episode decoded whole: its frames (pts -> ``av.VideoFrame``, not yet converted), their
    bytes, and how many distinct frames were served (the thrash guard)."""

    __slots__ = ("frames", "nbytes", "served")

    def __init__(self, frames: dict):
        self.frames = frames
        self.nbytes = sum(frame_bytes(f) for f in frames.values())
        self.served: set[int] = set()


class PyAVBackend:
    """Decode video frames with PyAV from a bounded LRU of open files (per process).

    ``tolerance_s``: LeRobot's tolerance between a query and the closest frame; ``max_open``:
    files kept open (each holds its packet index, a memory map and a decoder); ``size``: optional
    (height, width) resize; ``channels_first``: CHW instead of HWC; ``threads``: decoder threads
    per file; None (default) = one thread for random reads (a restart flushes frame threads) and
    FFmpeg's choice for whole-episode passes; an int pins both (1 in DataLoader workers that
    should not oversubscribe cores). ``episode_cache_mb``: see the module docstring (the stream).
    """

    name = "pyav"

    def __init__(
        self,
        tolerance_s: float = 1e-4,
        max_open: int = DEFAULT_MAX_OPEN,
        size: tuple[int, int] | None = None,
        channels_first: bool = False,
        threads: int | None = None,
        episode_cache_mb: float = 0,
    ):
        require_av()
        self.tolerance_s = tolerance_s
        self.max_open = max(1, int(max_open))
        self.size = tuple(size) if size is not None else None
        self.channels_first = channels_first
        self.threads = threads
        self._files: OrderedDict[tuple[str, int], VideoFile] = OrderedDict()
        self._pid = os.getpid()
        self.episode_cache_bytes = int(episode_cache_mb * MIB)
        self._episodes: OrderedDict[tuple[str, int], _Episode] = OrderedDict()
        self._episode_bytes = 0
        self._thrash = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_files"] = OrderedDict()  # open files do not cross process boundaries
        state["_episodes"], state["_episode_bytes"] = OrderedDict(), 0
        return state

    @property
    def episode_cache(self) -> bool:
        """Whether whole episodes are decoded and kept (on with ``episode_cache_mb`` until the
        thrash guard turns it off)."""
        return self.episode_cache_bytes > 0 and self._thrash < THRASH_LIMIT

    def pool_rows(self, ds, keys: Sequence[str]) -> int:
        """Frames (rows) whose decoded video, all cameras in ``keys``, fits the episode cache: the
        stream's pool must not hold more, or episodes are evicted before their frames are
        served. A frame's bytes are measured on the first frame of each camera's first file (as
        kept: the decoder's planes, padding included). Without the cache: no bound."""
        if self.episode_cache_bytes <= 0:
            return 2**62
        per_row = sum(self._camera_frame_bytes(ds, key) for key in keys)
        return max(1, self.episode_cache_bytes // max(per_row, 1))

    def _camera_frame_bytes(self, ds, key: str) -> int:
        info = (ds.features.get(key) or {}).get("info") or {}
        shape = list((ds.features.get(key) or {}).get("shape") or [1, 1, 3])
        nominal = int(info.get("video.height", shape[0])) * int(info.get("video.width", shape[1]))
        try:
            chunk = int(ds.column(f"videos/{key}/chunk_index")[0])
            file_index = int(ds.column(f"videos/{key}/file_index")[0])
            vf = VideoFile(ds.safe_join(ds.video_path(key, chunk, file_index)))
            try:
                (frame,) = vf.decode_pts([int(vf.index.pts[0])]).values()
                return frame_bytes(frame)
            finally:
                vf.close()
        except (VideoError, OSError, KeyError, IndexError):
            return 3 * nominal  # yuv420p is 1.5 bytes a pixel; allow for the decoder's padding

    def file(self, path: str, threads: int | None = None) -> VideoFile:
        """The open :class:`VideoFile` for ``path`` with ``threads`` decoder threads (default:
        the random-access setting), opened, and the oldest closed, on a miss."""
        if os.getpid() != self._pid:  # forked (DataLoader worker): never share decoders
            self._files = OrderedDict()
            self._episodes, self._episode_bytes = OrderedDict(), 0
            self._pid = os.getpid()
        if threads is None:
            threads = 1 if self.threads is None else int(self.threads)
        key = (path, threads)
        vf = self._files.get(key)
        if vf is not None:
            self._files.move_to_end(key)
            return vf
        vf = VideoFile(path, threads=threads, size=self.size)
        self._files[key] = vf
        while len(self._files) > self.max_open:
            _, old = self._files.popitem(last=False)
            old.close()
        return vf

    def close(self) -> None:
        for vf in self._files.values():
            vf.close()
        self._files.clear()
        self._episodes.clear()
        self._episode_bytes = 0

    def _finish(self, frames: np.ndarray) -> np.ndarray:
        return np.moveaxis(frames, -1, -3) if self.channels_first else frames

    def _episode(self, path: str, start_s: float, n: int) -> _Episode:
        """All ``n`` frames of the episode starting at ``start_s`` in ``path``, decoded once in
        one sequential pass (one restart, threaded unless pinned) and kept, unconverted, in an
        LRU bounded by ``episode_cache_mb``."""
        vf = self.file(path)
        (p0,), _ = vf.nearest([start_s], self.tolerance_s)
        key = (path, int(p0))
        ep = self._episodes.get(key)
        if ep is not None:
            self._episodes.move_to_end(key)
            return ep
        j0 = int(np.searchsorted(vf.index.pts, p0))
        seq = self.file(path, 0 if self.threads is None else int(self.threads))
        ep = _Episode(seq.decode_pts(vf.index.pts[j0 : j0 + int(n)].tolist(), drain=True))
        self._episodes[key] = ep
        self._episode_bytes += ep.nbytes
        while self._episode_bytes > self.episode_cache_bytes and len(self._episodes) > 1:
            _, old = self._episodes.popitem(last=False)
            self._episode_bytes -= old.nbytes
            if 2 * len(old.served) < len(old.frames):
                self._thrash += 1  # evicted before half its frames were asked for
                if self._thrash == THRASH_LIMIT:
                    warnings.warn(
                        f"video episode cache ({self.episode_cache_bytes / 2**20:.0f} MiB) is "
                        "smaller than the stream's pool: episodes are evicted before their "
                        "frames are served; decoding per batch from now on (raise "
                        "episode_cache_mb, or lower the loader's cache_mb)",
                        stacklevel=2,
                    )
                    self._episodes.clear()
                    self._episode_bytes = 0
        return ep

    def _read(self, path: str, q: list[float], episode: tuple[float, int] | None) -> list:
        vf = self.file(path)
        if episode is None or not self.episode_cache:
            return vf.read_seconds(q, self.tolerance_s)
        pts, _ = vf.nearest(q, self.tolerance_s)
        ep = self._episode(path, float(episode[0]), int(episode[1]))
        if all(int(p) in ep.frames for p in pts):
            ep.served.update(pts.tolist())
            return [vf.to_array(ep.frames[int(p)]) for p in pts]
        return vf.read_seconds(q, self.tolerance_s)

    def decode(
        self,
        path: str | np.ndarray,
        seconds: float | np.ndarray,
        episode_start: float | np.ndarray | None = None,
        episode_frames: int | np.ndarray | None = None,
    ) -> np.ndarray:
        """Frames at ``seconds`` of ``path``: one path and a scalar -> (H, W, 3); one path and
        (n,) -> (n, H, W, 3); B paths and (B,) or (B, n) times -> a leading batch axis.

        ``episode_start``/``episode_frames`` (per path): the episode the query belongs to (its
        first frame's time in the file, its length); with ``episode_cache_mb`` the whole episode
        is decoded once in timestamp order and its frames served from memory (the stream)."""
        t = np.asarray(seconds, dtype=np.float64)
        with_ep = episode_start is not None and episode_frames is not None
        if isinstance(path, str):
            ep = (float(episode_start), int(episode_frames)) if with_ep else None
            frames = self._read(path, t.reshape(-1).tolist(), ep)
            out = np.stack(frames)
            return self._finish(out[0] if t.ndim == 0 else out.reshape(*t.shape, *out.shape[1:]))
        paths = np.asarray(path, dtype=object)
        flat_t = t.reshape(len(paths), -1)
        result: list[np.ndarray | None] = [None] * flat_t.size
        width = flat_t.shape[1]
        if with_ep:
            starts = np.asarray(episode_start, dtype=np.float64).reshape(-1)
            counts = np.asarray(episode_frames, dtype=np.int64).reshape(-1)
            groups = dict.fromkeys(zip(paths.tolist(), starts.tolist(), counts.tolist()))
        else:
            groups = dict.fromkeys((p, None, None) for p in paths.tolist())
        for p, s0, n in groups:
            sel = paths == p if s0 is None else (paths == p) & (starts == s0)
            rows = np.flatnonzero(sel)
            frames = self._read(
                p, flat_t[rows].reshape(-1).tolist(), None if s0 is None else (s0, n)
            )
            slots = (rows[:, None] * width + np.arange(width)).reshape(-1)
            for s, f in zip(slots.tolist(), frames):
                result[s] = f
        out = np.stack(result)
        return self._finish(out.reshape(*t.shape, *out.shape[1:]))


def resolve_backend(backend: str | PyAVBackend | None, ds: Any) -> str | PyAVBackend | None:
    """What ``video_backend`` means for root ``ds``: ``"auto"`` (the default) is ``"pyav"``
    when PyAV is installed and the root is local, else paths with one warning saying why;
    ``"paths"`` and None are paths (no decoding); a name or an instance stays as given."""
    if backend is None or backend == PATHS:
        return None
    if not (isinstance(backend, str) and backend == AUTO):
        return backend
    if not ds.video_keys:
        return None
    from episodekit.loaders.store import warn_once

    why = ""
    if not ds.is_local:
        why = "PyAV decodes local files only (prepare's --out DIR --videos makes a local copy)"
    elif not _av_imports():
        why = "PyAV is not installed (pip install 'episodekit[video]' decodes them)"
    if why:
        warn_once(
            str(ds.root),
            "video-paths",
            f"{ds.root}: video features come back as {{path, timestamp}}: {why}; "
            "video_backend='paths' asks for paths without this warning",
        )
        return None
    return "pyav"


def _av_imports() -> bool:
    try:
        require_av()
    except EnvironmentProblem:
        return False
    return True


def make_backend(backend: str | PyAVBackend | None, tolerance_s: float) -> PyAVBackend | None:
    """``None`` or ``"paths"`` (no decoding), a backend name from :data:`BACKENDS`, or a backend
    instance (``"auto"`` is resolved first: :func:`resolve_backend`)."""
    if backend is None or backend == PATHS or isinstance(backend, PyAVBackend):
        return None if backend == PATHS else backend
    if backend == "pyav":
        return PyAVBackend(tolerance_s=tolerance_s)
    raise ValueError(
        f"video_backend must be 'auto', 'pyav', 'paths' (or None) or a PyAVBackend, got {backend!r}"
    )


def stream_backend(backend: str | PyAVBackend | None, tolerance_s: float) -> PyAVBackend | None:
    """The stream's backend: a name gets an episode cache of :data:`STREAM_EPISODE_CACHE_MB`
    (each episode of a pool decoded once, in one sequential pass); an instance is used as given."""
    if isinstance(backend, str) and backend in BACKENDS:
        return PyAVBackend(tolerance_s=tolerance_s, episode_cache_mb=STREAM_EPISODE_CACHE_MB)
    return make_backend(backend, tolerance_s)


def decode_episode(
    path: str | VideoFile,
    seconds: Sequence[float] | np.ndarray,
    tolerance_s: float = 1e-4,
    size: tuple[int, int] | None = None,
    threads: int = 1,
) -> np.ndarray:
    """Frames (N, H, W, 3 uint8, in query order) of one file at ``seconds``, decoded in timestamp
    order: one seek per run of frames between keyframes, each frame decoded at most once.

    ``path`` may be an open :class:`VideoFile` (e.g. from :meth:`PyAVBackend.file`), so a stream
    decoding consecutive episodes of one mp4 keeps its decoder position.
    """
    vf = path if isinstance(path, VideoFile) else VideoFile(path, threads=threads, size=size)
    try:
        return np.stack(vf.read_seconds(np.asarray(seconds, dtype=np.float64), tolerance_s))
    finally:
        if vf is not path:
            vf.close()
