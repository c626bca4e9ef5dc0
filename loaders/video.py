"""Decoded video frames for the loaders (the optional ``[video]`` extra, PyAV).

- :class:`PyAVBackend` is what ``FrameDataset(..., video_backend="pyav")`` uses: it returns uint8
  frames (HWC, or CHW with ``channels_first``) closest to each query time within ``tolerance_s``
  (LeRobot's rule; farther raises :class:`FrameTimestampError`), from a bounded per-process cache
  of open files whose decoders continue forward instead of seeking again when the next query lies
  in the same keyframe run (a window, or a neighbouring sample).
- :func:`decode_episode` decodes the frames one episode needs in timestamp order, one seek per
  run of frames that share a keyframe interval: what a stream over whole episodes should use
  instead of a seek per frame.
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
    ):
        require_av()
        self.tolerance_s = tolerance_s
        self.max_open = max(1, int(max_open))
        self.size = tuple(size) if size is not None else None
        self.channels_first = channels_first
        self.threads = threads
        self._files: OrderedDict[str, VideoFile] = OrderedDict()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_files"] = OrderedDict()  # open files do not cross process boundaries
        return state

    def file(self, path: str) -> VideoFile:
        """The open :class:`VideoFile` for ``path`` (opened, and the oldest closed, on a miss)."""
        if os.getpid() != self._pid:  # forked (DataLoader worker): never share decoders
            self._files = OrderedDict()
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

    def decode(self, path: str | np.ndarray, seconds: float | np.ndarray) -> np.ndarray:
        """Frames at ``seconds`` of ``path``: one path and a scalar -> (H, W, 3); one path and
        (n,) -> (n, H, W, 3); B paths and (B,) or (B, n) times -> a leading batch axis."""
        t = np.asarray(seconds, dtype=np.float64)
        if isinstance(path, str):
            frames = self.file(path).read_seconds(t.reshape(-1).tolist(), self.tolerance_s)
            out = np.stack(frames)
            return self._finish(out[0] if t.ndim == 0 else out.reshape(*t.shape, *out.shape[1:]))
        paths = np.asarray(path, dtype=object)
        flat_t = t.reshape(len(paths), -1)
        result: list[np.ndarray | None] = [None] * flat_t.size
        for p in dict.fromkeys(paths.tolist()):
            rows = np.flatnonzero(paths == p)
            q = flat_t[rows].reshape(-1)
            frames = self.file(p).read_seconds(q.tolist(), self.tolerance_s)
            slots = (rows[:, None] * flat_t.shape[1] + np.arange(flat_t.shape[1])).reshape(-1)
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
