"""Decoded video frames for the loaders (the optional ``[video]`` extra, PyAV).

- :class:`PyAVBackend` is what ``FrameDataset(..., video_backend="pyav")`` uses: it returns uint8
  frames (HWC, or CHW with ``channels_first``) closest to each query time within ``tolerance_s``
  (LeRobot's rule; farther raises :class:`FrameTimestampError`), from a bounded per-process cache
  of open files whose decoders continue forward instead of seeking again when the next query lies
  in the same keyframe run (a window, or a neighbouring sample). With ``episode_cache_mb`` (the
  stream: ``ShardedLoader(..., video_backend=PyAVBackend(episode_cache_mb=N))``) a file with long
  GOPs has each episode decoded once, whole, in timestamp order, and its frames served from memory.
- :func:`decode_episode` decodes the frames one episode needs in timestamp order, one seek per
  run of frames that share a keyframe interval: what a stream over whole episodes should use
  instead of a seek per frame.

PyAV opens local files: a hub root is decoded after ``prepare --out DIR --videos``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from episodekit.core.video import FrameTimestampError, VideoError, VideoFile, require_av

__all__ = [
    "BACKENDS",
    "FrameTimestampError",
    "PyAVBackend",
    "VideoError",
    "decode_episode",
    "make_backend",
]

BACKENDS = ("pyav",)
SHORT_GOP = 4  # mean frames per keyframe up to which the episode cache is not used
DEFAULT_MAX_OPEN = 32  # open files per process (a container, its index and a decoder each)


class PyAVBackend:
    """Decode video frames with PyAV from a bounded LRU of open files (per process).

    ``tolerance_s``: LeRobot's tolerance between a query and the closest frame; ``max_open``:
    files kept open (each holds a demuxed index and a decoder); ``size``: optional (height,
    width) resize; ``channels_first``: CHW instead of HWC; ``threads``: decoder threads per file
    (1 suits small frames and DataLoader workers).
    """

    name = "pyav"

    def __init__(
        self,
        tolerance_s: float = 1e-4,
        max_open: int = DEFAULT_MAX_OPEN,
        size: tuple[int, int] | None = None,
        channels_first: bool = False,
        threads: int = 1,
        episode_cache_mb: float = 0,
    ):
        require_av()
        self.tolerance_s = tolerance_s
        self.max_open = max(1, int(max_open))
        self.size = tuple(size) if size is not None else None
        self.channels_first = channels_first
        self.threads = threads
        self._files: OrderedDict[str, VideoFile] = OrderedDict()
        self._pid = os.getpid()
        self.episode_cache_bytes = int(episode_cache_mb * 1024 * 1024)
        self._episodes: OrderedDict[tuple[str, int], dict[int, np.ndarray]] = OrderedDict()
        self._episode_bytes = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_files"] = OrderedDict()  # open files do not cross process boundaries
        state["_episodes"], state["_episode_bytes"] = OrderedDict(), 0
        return state

    def file(self, path: str) -> VideoFile:
        """The open :class:`VideoFile` for ``path`` (opened, and the oldest closed, on a miss)."""
        if os.getpid() != self._pid:  # forked (DataLoader worker): never share decoders
            self._files = OrderedDict()
            self._episodes, self._episode_bytes = OrderedDict(), 0
            self._pid = os.getpid()
        vf = self._files.get(path)
        if vf is not None:
            self._files.move_to_end(path)
            return vf
        vf = VideoFile(path, threads=self.threads, size=self.size)
        self._files[path] = vf
        while len(self._files) > self.max_open:
            _, old = self._files.popitem(last=False)
            old.close()
        return vf

    def close(self) -> None:
        for vf in self._files.values():
            vf.close()
        self._files.clear()

    def _finish(self, frames: np.ndarray) -> np.ndarray:
        return np.moveaxis(frames, -1, -3) if self.channels_first else frames

    def _episode_frames(self, path: str, start_s: float, n: int) -> dict[int, np.ndarray]:
        """All ``n`` frames of the episode starting at ``start_s`` in ``path`` (pts -> frame),
        decoded once in timestamp order and kept in an LRU bounded by ``episode_cache_mb``."""
        vf = self.file(path)
        (p0,), _ = vf.nearest([start_s], self.tolerance_s)
        key = (path, int(p0))
        frames = self._episodes.get(key)
        if frames is not None:
            self._episodes.move_to_end(key)
            return frames
        j0 = int(np.searchsorted(vf.index.pts, p0))
        frames = vf.read_pts(vf.index.pts[j0 : j0 + int(n)].tolist())
        self._episodes[key] = frames
        self._episode_bytes += sum(f.nbytes for f in frames.values())
        while self._episode_bytes > self.episode_cache_bytes and len(self._episodes) > 1:
            _, old = self._episodes.popitem(last=False)
            self._episode_bytes -= sum(f.nbytes for f in old.values())
        return frames

    def _read(self, path: str, q: list[float], episode: tuple[float, int] | None) -> list:
        vf = self.file(path)
        if episode is None or self.episode_cache_bytes <= 0 or vf.mean_gop <= SHORT_GOP:
            # Short GOPs: a random frame costs at most a few decodes; whole episodes buy nothing.
            return vf.read_seconds(q, self.tolerance_s)
        pts, _ = vf.nearest(q, self.tolerance_s)
        cached = self._episode_frames(path, float(episode[0]), int(episode[1]))
        if all(int(p) in cached for p in pts):
            return [cached[int(p)] for p in pts]
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


def make_backend(backend: str | PyAVBackend | None, tolerance_s: float) -> PyAVBackend | None:
    """``None`` (no decoding), a backend name from :data:`BACKENDS`, or a backend instance."""
    if backend is None or isinstance(backend, PyAVBackend):
        return backend
    if backend == "pyav":
        return PyAVBackend(tolerance_s=tolerance_s)
    raise ValueError(f"video_backend must be one of {BACKENDS} or None, got {backend!r}")


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
