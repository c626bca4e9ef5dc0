"""One camera's video of an import, encoded in a process of its own (the episode sink's
cameras run side by side, and beside the reading and the data files).

:class:`CameraProcess` (the sink's side) starts a 'spawn' child tied to this process
(:func:`episodekit.core.lifeline.follow`: it dies with it) and hands it each episode's frames
as raw bytes through a pipe (``send_bytes``: one copy, no pickling per frame). The child does
what the sink did in turn for each camera: appends the frames to the camera's current mp4 (a
new one, keyframe first, past ``video_files_size_in_mb`` or :data:`MAX_FILE_FRAMES` frames:
:func:`encode_episode`; each file it closes is read back, :func:`_close`) and computes LeRobot's
image stats of the episode, and answers with the episode's ``videos/*`` values and stats, in
order. Same frames, same encoder, same settings: the same bytes as one process.

The sink sends episode ``e`` and then takes the answer for ``e - 1``: while the children encode
``e`` the sink reads and writes ``e + 1``. A child reads the next episode only once it answered
the last, so at most one episode waits in each pipe (memory: two episodes per camera).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from episodekit.core.errors import DatasetError
from episodekit.core.layout.files import chunk_file, file_path
from episodekit.core.layout.rules import VIDEO_PATH_V3

STOP_S = 10.0  # how long a child is given to exit before it is killed
# Frames in one mp4 before the next episode starts a new one, whatever its bytes. FFmpeg's mp4
# muxer keeps an index entry per frame (~70 bytes measured) until it writes the moov box at
# close (a plain, not fragmented, mp4 as LeRobot's): a camera process grows with its current
# file's frames. 2**16 frames bound that to ~4.5 MiB; LeRobot's size rule (200 MB) comes first
# at any frame over ~3 KB encoded (640x480 AV1: tens of KB), so only small images meet it.
MAX_FILE_FRAMES = 2**16


@dataclass
class Camera:
    """A camera's files: the current one (``file_no``), frames in it (``in_file``), every
    file's frames (``counts``: rel -> frames); ``writer`` only in the encoding process."""

    feature: Any  # writers.sink.SinkFeature
    writer: Any = None
    file_no: int = -1
    in_file: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    chunks_size: int = 1000

    def rel(self) -> str:
        where = chunk_file(self.file_no, self.chunks_size)
        return file_path(VIDEO_PATH_V3, *where, video_key=self.feature.name)


def episode_frames(feature: Any, images: Any, n: int, source: str) -> np.ndarray:
    """One episode's frames of a camera (an ``importers.episode.Images``, decoded here) as one
    ``(N, H, W, C)`` array, checked against the feature's shape."""
    frames = np.stack(list(images.frames())) if n else np.zeros((0, *feature.shape), np.uint8)
    if frames.shape != (n, *feature.shape):
        raise DatasetError(
            f"episode {source}: key {feature.name!r}: images of shape {frames.shape[1:]}, the "
            f"first episode's were {feature.shape} (one video stream needs one size)"
        )
    return frames


def is_full(cam: Camera, limit: float) -> bool:
    """The camera's current mp4 takes no more episodes: ``limit`` bytes or
    :data:`MAX_FILE_FRAMES` frames reached."""
    return cam.writer is not None and (cam.writer.bytes >= limit or cam.in_file >= MAX_FILE_FRAMES)


def encode_episode(
    cam: Camera, frames: np.ndarray, folder: Path, fps: int, limit: float
) -> tuple[tuple[int, int, float, float], dict[str, np.ndarray]]:
    """One episode's RGB ``frames`` appended to the camera's current mp4 (a new one once the
    current reached ``limit`` bytes or :data:`MAX_FILE_FRAMES` frames), keyframe first; its
    ``videos/*`` values (chunk, file, from and to timestamps) and LeRobot's image stats (its
    sampled, downsampled frames)."""
    from episodekit.core.video_writer import LEROBOT_RGB, VideoWriter
    from episodekit.metadata.lerobot_image_stats import (
        downsample_step,
        lerobot_image_stats,
        sample_indices,
    )

    f, n = cam.feature, len(frames)
    if cam.writer is None or is_full(cam, limit):
        if cam.writer is not None:
            cam.writer.close()
        cam.file_no, cam.in_file = cam.file_no + 1, 0
        path = folder / cam.rel()
        path.parent.mkdir(parents=True, exist_ok=True)
        h, w = f.shape[:2]
        preset = None if f.video == "h264" else LEROBOT_RGB.preset
        cam.writer = VideoWriter(path, w, h, fps, LEROBOT_RGB, codec=f.video, preset=preset)
    cam.writer.write(frames, keyframe_first=True)
    start = cam.in_file / fps
    cam.in_file += n
    rel = cam.rel()
    cam.counts[rel] = cam.counts.get(rel, 0) + n
    sample = frames[sample_indices(n)]
    step = downsample_step(sample.shape[1], sample.shape[2])
    stats = lerobot_image_stats(sample[:, ::step, ::step])
    chunk, file = chunk_file(cam.file_no, cam.chunks_size)
    return (int(chunk), int(file), start, cam.in_file / fps), stats


def _serve(conn: Any, parent: int, cam: Camera, folder: str, fps: int, limit: float) -> None:
    """The child: episodes in, answers out, until told to stop (or the parent is gone). A
    thread takes the messages off the pipe as they come (the sink's send returns without
    waiting for the episode before to be encoded: the sink bounds what is in flight)."""
    from episodekit.core import lifeline

    lifeline.follow(parent)
    root = Path(folder)
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_read, args=(conn, inbox), daemon=True).start()
    while True:
        item = inbox.get()
        if item is None:  # the sink is gone: nothing to finish
            os._exit(1)
        msg, data = item
        kind = msg[0]
        if kind in ("episode", "encoded"):
            try:
                if kind == "episode":
                    frames = np.frombuffer(data, dtype=np.uint8).reshape(msg[1])
                else:  # the images still encoded: decoded here, beside the other cameras
                    frames = episode_frames(cam.feature, msg[1], msg[3], msg[4])
                if msg[2] == "bgr":
                    frames = frames[..., ::-1]
                # a full mp4 is closed and read back here (else encode_episode closes it)
                closed = _close(cam, root) if is_full(cam, limit) else None
                videos, stats = encode_episode(cam, frames, root, fps, limit)
                conn.send(("ok", videos, stats, cam.file_no, cam.rel(), len(frames), closed))
            except Exception as exc:  # the sink raises it (as it is, when it pickles)
                _send_error(conn, exc)
            frames = data = None
        elif kind in ("close", "quit"):  # a checkpoint (the current mp4 ends here), the end
            conn.send(("closed", _close(cam, root)))
            if kind == "quit":
                # the files are closed; skip the interpreter's teardown, where SVT-AV1 (PyAV
                # 18) was seen to hang now and then after its last packet
                os._exit(0)
        elif kind == "restore":
            cam.file_no = int(msg[1])


def _close(cam: Camera, root: Path) -> tuple[str, int] | str | None:
    """Close the camera's current mp4 and read back its frame count from its stts and stsz
    boxes (:func:`~episodekit.core.mp4.mp4_frame_count`: a few box headers, not the sample
    index PyAV's demuxer builds, which grew the process by ~100 bytes a frame): ``(rel,
    frames)``, None when no file was open, the error's message when it does not read."""
    from episodekit.core.mp4 import mp4_frame_count

    if cam.writer is None:
        return None
    cam.writer.close()
    cam.writer = None
    path = root / cam.rel()
    try:
        with open(path, "rb") as fh:
            frames = mp4_frame_count(fh, str(path))
    except Exception as exc:
        return f"{cam.rel()}: does not read back ({type(exc).__name__}: {exc})"
    if frames is None:
        return f"{cam.rel()}: does not read back (no moov box, or a fragmented mp4)"
    return cam.rel(), frames


def _send_error(conn: Any, exc: Exception) -> None:
    try:
        conn.send(("error", exc))
    except Exception:  # an exception that does not pickle: its message
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _read(conn: Any, inbox: queue.SimpleQueue) -> None:
    """The child's reader thread: each message (an episode's with its frames' bytes) into
    ``inbox``; None once the pipe is closed."""
    try:
        while True:
            msg = conn.recv()
            inbox.put((msg, conn.recv_bytes() if msg[0] == "episode" else None))
    except (EOFError, OSError):
        inbox.put(None)


class CameraProcess:
    """The sink's handle on one camera's encoding child (see the module docstring); keeps the
    camera's files as the child reports them (:attr:`cam`: ``file_no``, ``counts``)."""

    def __init__(self, cam: Camera, folder: Path, fps: int, limit: float) -> None:
        self.cam = cam
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe(duplex=True)
        f = cam.feature  # what the child needs of it (a SinkFeature would load writers.sink)
        plain = SimpleNamespace(name=f.name, shape=tuple(f.shape), video=f.video)
        child_cam = Camera(plain, chunks_size=cam.chunks_size)
        args = (child, os.getpid(), child_cam, str(folder), int(fps), float(limit))
        self.proc = ctx.Process(target=_serve, args=args, daemon=True, name="episodekit-encode")
        self.proc.start()
        child.close()
        self.waiting: list[str] = []  # sources of the episodes sent, not yet answered
        self.open = False  # the child has an mp4 open (episodes answered since the last close)
        self.checked: set[str] = set()  # files closed and read back by the child
        self.in_flight = 0  # bytes of the frames sent, not yet answered
        self.sizes: list[int] = []  # and per episode

    def send(self, frames: np.ndarray, channels: str, source: str) -> None:
        """Hand over one episode's ``(N, H, W, 3)`` uint8 frames (the child queues them: the
        caller bounds :attr:`in_flight`)."""
        frames = np.ascontiguousarray(frames, dtype=np.uint8)
        self._send(("episode", frames.shape, channels))
        self._send(frames.reshape(-1).data, raw=True)
        self.waiting.append(source)
        self.in_flight += frames.nbytes
        self.sizes.append(frames.nbytes)

    def send_images(self, images: Any, channels: str, source: str, n: int) -> int:
        """Hand over one episode's images (an ``importers.episode.Images``): still encoded
        (PNG/JPEG files: the child decodes them) when they are, else decoded here and sent as
        frames. Returns the bytes sent (what the caller's in-flight bound counts)."""
        from episodekit.importers.episode import EncodedImages

        if type(images) is EncodedImages:
            try:  # pickled first, then written: one that does not pickle leaves the pipe as it was
                self._send(("encoded", images, channels, n, source))
            except (pickle.PicklingError, AttributeError, TypeError):
                pass  # (a reader's decode that does not pickle): decoded here
            else:
                self.waiting.append(source)
                size = sum(len(b) for b in images.blobs)
                self.in_flight += size
                self.sizes.append(size)
                return size
        frames = episode_frames(self.cam.feature, images, n, source)
        self.send(frames, channels, source)
        return frames.nbytes

    def answer(self) -> tuple[tuple[int, int, float, float], dict[str, np.ndarray]]:
        """The oldest episode sent: its ``videos/*`` values and image stats."""
        source = self.waiting.pop(0)
        self.in_flight -= self.sizes.pop(0)
        msg = self._recv()
        if msg[0] != "ok" and isinstance(msg[1], Exception):
            raise msg[1]
        if msg[0] != "ok":
            raise DatasetError(
                f"episode {source}: key {self.cam.feature.name!r}: encoding failed: {msg[1]}"
            )
        _, videos, stats, file_no, rel, n, closed = msg
        if closed is not None:  # the file before, full, closed and read back by the child
            self._check_read_back(closed)
        self.cam.file_no, self.open = file_no, True
        self.cam.counts[rel] = self.cam.counts.get(rel, 0) + n
        return videos, stats

    def close_file(self) -> None:
        """End the current mp4, if one is open (every episode sent must have been answered),
        and check its frames as read back (:class:`VerificationError`)."""
        if self.open:
            self._send(("close",))
            self._expect_closed()

    def restore(self, file_no: int) -> None:
        """Carry on after file ``file_no`` (a resumed import: its next episode starts a file)."""
        self.cam.file_no = file_no
        self._send(("restore", int(file_no)))

    def finish(self) -> None:
        """Close the current mp4 (checked as :meth:`close_file` does) and end the child."""
        self._send(("quit",))
        self._expect_closed()
        self.proc.join(STOP_S)
        self.stop()

    def stop(self) -> None:
        """End the child now, whatever it was doing (after an error: its files are discarded);
        returns once it is gone."""
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(STOP_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()

    def _expect_closed(self) -> None:
        msg = self._recv()
        if msg[0] != "closed":
            raise DatasetError(f"key {self.cam.feature.name!r}: encoder answered {msg[0]!r}")
        self.open = False
        self._check_read_back(msg[1])

    def _check_read_back(self, read: tuple[str, int] | str | None) -> None:
        """A closed mp4's frame count as the child read it back (:func:`_close`) against its
        episodes' (:class:`VerificationError`); the file is then :attr:`checked`."""
        from episodekit.core.parquet_write import VerificationError

        if isinstance(read, str):
            raise VerificationError(read)
        if read is not None:
            rel, got = read
            expected = self.cam.counts.get(rel)
            if got != expected:  # verify_videos' message
                raise VerificationError(
                    f"{rel}: {got} frames, its episodes have {expected} ({self.cam.feature.name})"
                )
            self.checked.add(rel)

    def _send(self, obj: Any, raw: bool = False) -> None:
        try:
            self.conn.send_bytes(obj) if raw else self.conn.send(obj)
        except OSError as exc:  # the child is gone (a broken pipe)
            raise self._gone() from exc

    def _recv(self) -> Any:
        try:
            return self.conn.recv()
        except (EOFError, OSError) as exc:
            raise self._gone() from exc

    def _gone(self) -> DatasetError:
        self.proc.join(1.0)
        code = self.proc.exitcode
        return DatasetError(
            f"key {self.cam.feature.name!r}: the encoding process ended (exit code {code})"
        )
