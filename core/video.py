"""mp4 video through PyAV (the optional ``[video]`` extra): probe, decode in pts order, encode.

One place for the three things every layer needs: ``probe`` demuxes a file without decoding it
(stream facts + every packet's pts and keyframe flag: what validation and the decoders plan with);
``VideoFile`` keeps one container open and decodes the frames at given pts in ascending order with
one seek per run (a seek only when a keyframe lies between the decoder's position and the next
wanted frame, so a run of nearby frames is decoded forward, never re-sought); ``VideoWriter``
encodes RGB frames the way LeRobot's recorder does (time base 1/(fps*512), yuv420p, forced
keyframe at each episode start; :mod:`episodekit.core.video_writer`). The mp4 sample tables are
read by :mod:`episodekit.core.mp4`. Without PyAV every entry point raises
:class:`EnvironmentProblem` naming what to install.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from episodekit.core.errors import EnvironmentProblem
from episodekit.core.lazy import lazy_getattr
from episodekit.core.mp4 import SampleTable, VideoError, mp4_sample_table, mp4_samples

INSTALL_HINT = "video needs PyAV: pip install 'episodekit[video]' (or: pip install av)"
TICKS_PER_FRAME = 512  # LeRobot's files: time_base 1/15360 at 30 fps
SEEK_COST_FRAMES = 1  # a seek (demuxer reposition + decoder flush) costs about one frame decode
ENCODERS = {"av1": "libsvtav1", "h264": "libx264"}
# Encoder and decoder names that mean the same codec as info.json's ``video.codec``.
CODEC_ALIASES = {
    "libsvtav1": "av1",
    "libaom-av1": "av1",
    "libdav1d": "av1",
    "librav1e": "av1",
    "libx264": "h264",
    "libopenh264": "h264",
    "libx265": "hevc",
    "h265": "hevc",
    "libvpx-vp9": "vp9",
}


class FrameTimestampError(VideoError):
    """No frame within ``tolerance_s`` of a query (LeRobot's FrameTimestampError)."""


_AV: Any = None


def require_av() -> Any:
    """The ``av`` module, or :class:`EnvironmentProblem` saying what to install."""
    global _AV
    if _AV is not None:
        return _AV
    try:
        import av
        import av.video.reformatter
    except ImportError as exc:  # a third-party optional dependency, not our own module
        raise EnvironmentProblem(INSTALL_HINT) from exc
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its whole config otherwise
    av.logging.set_level(av.logging.ERROR)
    # A decoder left in a reference cycle is freed by whichever process collects it: in a
    # forked child (a DataLoader worker) its codec's threads do not exist, and freeing it
    # blocks for ever (dav1d waits on them: a CI run hung). Collect in the parent, before
    # every fork, where those threads still run.
    os.register_at_fork(before=gc.collect)
    _AV = av
    return av


def have_av() -> bool:
    """Whether PyAV can be imported."""
    try:
        require_av()
    except EnvironmentProblem:
        return False
    return True


def canonical_codec(name: str | None) -> str | None:
    """``libsvtav1``/``libdav1d``/``av1`` -> ``av1``, ``libx264`` -> ``h264`` (lower case)."""
    if name is None:
        return None
    n = str(name).lower()
    return CODEC_ALIASES.get(n, n)


@dataclass
class VideoIndex:
    """What demuxing a file tells without decoding: stream facts, every packet's pts (stream
    ticks, ascending) and keyframe flag, and the packets' timestamps in seconds."""

    path: str
    codec: str
    width: int
    height: int
    pix_fmt: str | None
    fps: float
    time_base: Fraction
    pts: np.ndarray
    keyframe: np.ndarray
    has_audio: bool
    undecided: tuple[str, ...] = ()  # facts its boxes did not settle (mp4_stream.probe_boxes)

    @property
    def seconds(self) -> np.ndarray:
        return self.pts * float(self.time_base)

    @property
    def num_frames(self) -> int:
        return len(self.pts)


def _open(path: str, fileobj: Any = None) -> Any:
    av = require_av()
    try:
        return av.open(path if fileobj is None else fileobj)
    except FileNotFoundError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise VideoError(f"cannot open video: {exc}", path) from exc


def _video_stream(container: Any, path: str) -> Any:
    if not container.streams.video:
        raise VideoError("no video stream", path)
    return container.streams.video[0]


def _index_of(
    container: Any, stream: Any, path: str, samples: tuple[np.ndarray, np.ndarray] | None = None
) -> VideoIndex:
    """The file's :class:`VideoIndex`: from ``samples`` (the mp4 sample tables) when they agree
    with the stream's frame count, else by demuxing every packet."""
    av = require_av()
    if samples is not None and len(samples[0]) == stream.frames:
        p, k = samples
    else:
        pts, key = [], []
        try:
            for packet in container.demux(stream):
                if packet.size == 0 or packet.pts is None:
                    continue
                pts.append(packet.pts)
                key.append(packet.is_keyframe)
        except (av.error.FFmpegError, OSError) as exc:
            raise VideoError(f"cannot demux video: {exc}", path) from exc
        p = np.asarray(pts, dtype=np.int64)
        k = np.asarray(key, dtype=bool)
    order = np.argsort(p, kind="stable")
    ctx = stream.codec_context
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return VideoIndex(
        path=path,
        codec=canonical_codec(ctx.codec.canonical_name) or "",
        width=int(ctx.width),
        height=int(ctx.height),
        pix_fmt=ctx.pix_fmt,
        fps=float(rate) if rate else 0.0,
        time_base=Fraction(stream.time_base),
        pts=p[order],
        keyframe=k[order],
        has_audio=bool(container.streams.audio),
    )


def probe(path: str | os.PathLike, fileobj: Any = None, demux: bool = False) -> VideoIndex:
    """Stream facts and every frame's pts and keyframe flag of ``path``, without decoding: read
    from the mp4 sample tables (no packet is read; ``demux=True`` or a file those tables do not
    describe: by demuxing every packet). ``fileobj``: read from this open binary file instead
    (e.g. an fsspec file; ``path`` then only names it). Raises :class:`VideoError` when the file
    is not a readable video (cut short, no video stream, not a container FFmpeg reads)."""
    path = os.fspath(path)
    samples = None
    if not demux:
        with contextlib.ExitStack() as stack:
            fh = fileobj if fileobj is not None else stack.enter_context(open(path, "rb"))
            try:
                samples = mp4_samples(fh, path)
            except (ValueError, TypeError, struct.error, IndexError):
                samples = None  # not an mp4 these tables describe: demux instead
            fh.seek(0)
    container = _open(path, fileobj)
    try:
        return _index_of(container, _video_stream(container, path), path, samples)
    finally:
        container.close()


def _to_array(
    frame: Any, fmt: str, size: tuple[int, int] | None, reformatter: Any = None
) -> np.ndarray:
    """``frame`` as a uint8 array through FFmpeg's default conversion (LeRobot's); a reused
    ``reformatter`` keeps one conversion context instead of one per frame (~5x faster), and one
    swscale thread (the same pixels; its default thread pool costs 2-5x more per frame at
    96x128 and is no faster at 640x480 on a busy machine)."""
    h, w = (None, None) if size is None else size
    if reformatter is None:
        return frame.to_ndarray(format=fmt, width=w, height=h)
    return reformatter.reformat(frame, format=fmt, width=w, height=h, threads=1).to_ndarray()


class VideoFile:
    """One open mp4 whose frames are decoded in ascending pts order, restarting the decoder only
    when a keyframe lies between its position and the next wanted frame.

    A plain mp4 is read through its own packet index (:class:`SampleTable`: byte offset, size,
    pts and keyframe flag of every packet): a jump flushes the decoder and feeds it the packets
    from the keyframe before the wanted frame, read from a memory map of the file, so there is no
    demuxer seek and no container re-open. Other files (fragmented, several edits) go through
    the demuxer (seek + decode), with the same decisions and results.

    ``threads``: decoder threads (1 suits random access, small frames and DataLoader workers;
    0 = FFmpeg's choice, for sequential passes). ``size``: optional (height, width) resize.
    Frames are uint8 HWC in ``fmt``.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        threads: int = 1,
        size: tuple[int, int] | None = None,
        fmt: str = "rgb24",
        packets: bool = True,
    ):
        self.path = os.fspath(path)
        self.size = size
        self.fmt = fmt
        self.threads = threads
        table = None
        with open(self.path, "rb") as fh:
            try:
                table = mp4_sample_table(fh, self.path)
            except (ValueError, TypeError, struct.error, IndexError):
                table = None
            file_size = fh.seek(0, os.SEEK_END)
        self.container = _open(self.path)
        stream = _video_stream(self.container, self.path)
        if table is not None and not (
            len(table.pts) == stream.frames
            and len(table.pts)
            and (table.offset >= 0).all()
            and int((table.offset + table.size).max()) <= file_size
        ):
            table = None  # tables that do not describe this stream: demux instead
        samples = None if table is None else (table.pts, table.keyframe)
        self.index = _index_of(self.container, stream, self.path, samples)
        self._seconds = self.index.seconds
        stream.codec_context.thread_count = threads
        if threads != 1:
            stream.thread_type = "AUTO"
        self.stream = stream
        self._ctx = stream.codec_context
        self._reformatter = require_av().video.reformatter.VideoReformatter()
        self.seeks = 0
        self.decoded = 0
        self.table = table if packets else None
        self._map: Any = None
        if self.table is not None:
            with open(self.path, "rb") as fh:
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            # index.pts is table.pts sorted: the decode position of the i-th frame in pts order
            self._dec_of = np.argsort(self.table.pts, kind="stable")
            key_dec = np.flatnonzero(self.table.keyframe)
            # decode position of the keyframe each decode position restarts from
            at = np.searchsorted(key_dec, np.arange(len(self.table.pts)), side="right") - 1
            self._key_of = key_dec[np.maximum(at, 0)] if len(key_dec) else np.zeros(0, np.int64)
            self._tb = stream.time_base
            self._next = -1  # decode position of the next packet to feed (-1: must restart)
            self._last_out = -1  # highest pts the decoder returned since the last restart
        else:
            self.container.seek(0, stream=stream)
            self._frames: Any = None  # the decode generator since the last seek
            self._pos = -1  # pts of the last decoded frame (-1: must seek)
            self._key_pos = np.flatnonzero(self.index.keyframe)

    def close(self) -> None:
        self.container.close()
        if self._map is not None:
            self._map.close()
            self._map = None

    def reset(self) -> None:
        """Forget the decoder's position: the next read restarts at a keyframe (what a random
        access pays; used to time it)."""
        if self.table is not None:
            self._next = -1
        else:
            self._pos = -1

    @property
    def mean_gop(self) -> float:
        """Frames per keyframe (1: all intra; LeRobot's AV1: 2)."""
        return self.index.num_frames / max(1, int(self.index.keyframe.sum()))

    def nearest(
        self, seconds: np.ndarray | Sequence[float], tolerance_s: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """pts of the frame closest to each query time, and |that frame's time - query| (seconds).
        Raises :class:`FrameTimestampError` when one is farther than ``tolerance_s``."""
        q = np.asarray(seconds, dtype=np.float64)
        t = self._seconds
        n = len(t)
        if n == 0:
            raise FrameTimestampError("video has no frames", self.path)
        j = np.searchsorted(t, q)
        left, right = np.maximum(j - 1, 0), np.minimum(j, n - 1)
        pick = np.where(np.abs(t[left] - q) <= np.abs(t[right] - q), left, right)
        dist = np.abs(t[pick] - q)
        bad = dist > tolerance_s
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise FrameTimestampError(
                f"no frame within tolerance_s={tolerance_s:g} of t={q[b]:.6f}s "
                f"(closest {t[pick[b]]:.6f}s; {len(t)} frames, {t[0]:.4f}..{t[-1]:.4f}s)",
                self.path,
            )
        return self.index.pts[pick], dist

    # -- the packet path: our own index, packets fed by byte offset -----------------------------

    def _packet(self, j: int) -> Any:
        av = _AV
        t = self.table
        off = int(t.offset[j])
        packet = av.Packet(self._map[off : off + int(t.size[j])])
        packet.pts, packet.dts = int(t.pts[j]), int(t.dts[j])
        packet.time_base = self._tb
        packet.is_keyframe = bool(t.keyframe[j])
        return packet

    def _must_restart(self, target: int, d: int, k: int) -> bool:
        """Restart at keyframe ``k`` (decode position) for frame ``target`` (pts; decode position
        ``d``) when the decoder has no position, has already passed the frame, or would decode
        more unwanted frames going forward than from ``k`` (plus one frame for the flush)."""
        if self._next < 0 or target <= self._last_out:
            return True
        if d < self._next or k < self._next:
            return False  # fed already (still in the decoder's delay), or same keyframe run
        return k - self._next > SEEK_COST_FRAMES

    def _decode_packets(self, positions: list[int], drain: bool) -> dict[int, Any]:
        """Frames at ``positions`` (ascending, in pts order) by pts, fed from the packet index."""
        av = _AV
        all_pts, dec_of, key_of = self.index.pts, self._dec_of, self._key_of
        want = [int(all_pts[j]) for j in positions]
        decode_pos = [int(dec_of[j]) for j in positions]
        keys = [int(key_of[d]) for d in decode_pos]
        wanted = set(want)
        got: dict[int, Any] = {}
        ctx, n = self._ctx, len(all_pts)
        # the last decode position any wanted frame from here on needs
        need = list(decode_pos)
        for i in range(len(need) - 2, -1, -1):
            need[i] = max(need[i], need[i + 1])
        for i, (target, d, k) in enumerate(zip(want, decode_pos, keys)):
            if target in got:
                continue
            if self._must_restart(target, d, k):
                ctx.flush_buffers()
                self._next, self._last_out = k, -1
                self.seeks += 1
            while target not in got:
                # With ``drain``, once every wanted packet is in, drain the decoder's delay
                # (reordering, frame threads) rather than decode unwanted frames to push the
                # wanted ones out; without, keep feeding (the next read continues from here).
                flush = self._next >= n or (drain and self._next > need[i])
                try:
                    if flush:
                        frames = ctx.decode(None)
                        ctx.flush_buffers()
                        self._next = -1
                    else:
                        frames = ctx.decode(self._packet(self._next))
                        self._next += 1
                except av.error.FFmpegError as exc:
                    self._next = -1
                    raise VideoError(f"cannot decode: {exc}", self.path) from exc
                for frame in frames:
                    self.decoded += 1
                    fp = frame.pts
                    if fp is None:
                        self._next = -1
                        raise VideoError("decoder returned a frame without pts", self.path)
                    self._last_out = max(self._last_out, fp)
                    if fp in wanted:
                        got[fp] = frame
                if target not in got and (self._next < 0 or self._last_out > target):
                    self._next = -1
                    raise VideoError(
                        f"frame at pts {target} not decoded (decoder reached pts {self._last_out})",
                        self.path,
                    )
        return got

    # -- the demuxer path (files the packet index does not describe) ----------------------------

    def _must_seek(self, target: int) -> bool:
        """Seek when going back, or when decoding forward would pass more unwanted frames than
        seeking to the last keyframe before ``target`` (plus one frame for the seek itself):
        consecutive frames are never re-sought, far jumps are."""
        if self._pos < 0 or target <= self._pos:
            return True
        pts = self.index.pts
        here = int(np.searchsorted(pts, self._pos))
        there = int(np.searchsorted(pts, target))
        k = int(np.searchsorted(self._key_pos, there, side="right")) - 1
        if k < 0 or self._key_pos[k] <= here:
            return False  # no keyframe in between: forward is the only way
        return there - here - 1 > there - int(self._key_pos[k]) + SEEK_COST_FRAMES

    def _seek(self, target: int) -> None:
        av = require_av()
        try:
            self.container.seek(int(target), stream=self.stream, backward=True, any_frame=False)
        except av.error.FFmpegError as exc:
            raise VideoError(f"cannot seek to pts {target}: {exc}", self.path) from exc
        self._frames = self.container.decode(self.stream)
        self._pos = -1
        self.seeks += 1

    def _decode_demuxed(self, want: list[int]) -> dict[int, Any]:
        av = _AV
        out: dict[int, Any] = {}
        for target in want:
            if self._must_seek(target):
                self._seek(target)
            while True:
                try:
                    frame = next(self._frames)
                except StopIteration:
                    self._pos = -1
                    raise VideoError(f"frame at pts {target} not found", self.path) from None
                except av.error.FFmpegError as exc:
                    self._pos = -1
                    raise VideoError(f"cannot decode: {exc}", self.path) from exc
                self.decoded += 1
                fp = frame.pts if frame.pts is not None else -1
                self._pos = fp
                if fp == target:
                    out[target] = frame
                    break
                if fp > target:
                    self._pos = -1
                    raise VideoError(f"frame at pts {target} not decoded (got {fp})", self.path)
        return out

    # -- reading ------------------------------------------------------------------------------

    def decode_pts(self, pts: Iterable[int], drain: bool | None = None) -> dict[int, Any]:
        """Decoded ``av.VideoFrame`` objects at the given pts (each must be in ``index.pts``),
        decoded in ascending order, each at most once. ``drain``: once the last wanted packet is
        in, flush the decoder's delay out instead of decoding further packets (right when no
        read continues from here, e.g. a whole episode; the next read then restarts at a
        keyframe); None: when the decoder is frame-threaded (``threads != 1``)."""
        want = sorted(set(int(p) for p in pts))
        if not want:
            return {}
        all_pts = self.index.pts
        pos = np.minimum(np.searchsorted(all_pts, want), len(all_pts) - 1)
        bad = all_pts[pos] != np.asarray(want)
        if bad.any():
            raise VideoError(f"no frame at pts {want[int(np.argmax(bad))]}", self.path)
        return self._decode_positions(pos.tolist(), drain)

    def _decode_positions(self, positions: list[int], drain: bool | None) -> dict[int, Any]:
        if self.table is not None:
            return self._decode_packets(positions, self.threads != 1 if drain is None else drain)
        return self._decode_demuxed([int(self.index.pts[j]) for j in positions])

    def to_array(self, frame: Any) -> np.ndarray:
        """``frame`` as uint8 HWC in ``fmt`` at ``size`` (FFmpeg's default conversion)."""
        return _to_array(frame, self.fmt, self.size, self._reformatter)

    def read_pts(self, pts: Iterable[int]) -> dict[int, np.ndarray]:
        """Frames at the given pts (each must be in ``index.pts``), decoded in ascending order."""
        return {p: self.to_array(f) for p, f in self.decode_pts(pts).items()}

    def positions(self, seconds: Sequence[float], tolerance_s: float) -> list[int]:
        """Index positions (pts order) of the frame closest to each query time, as
        :meth:`nearest` picks them (scalar code: the per-item path queries one to a few times)."""
        t = self._seconds
        n = len(t)
        if n == 0:
            self.nearest(seconds, tolerance_s)  # raises: no frames
        out = []
        for q in seconds:
            q = float(q)
            j = int(t.searchsorted(q))
            if j >= n or j == 0:
                p = min(j, n - 1)
            else:
                p = j - 1 if q - t[j - 1] <= t[j] - q else j
            if abs(t[p] - q) > tolerance_s:
                self.nearest(seconds, tolerance_s)  # raises with the full message
            out.append(p)
        return out

    def read_seconds(self, seconds: Sequence[float], tolerance_s: float) -> list[np.ndarray]:
        """Frames closest to each query time (LeRobot's tolerance rule), in query order; each
        distinct frame decoded and converted once."""
        pos = self.positions(seconds, tolerance_s)
        uniq = sorted(set(pos))
        frames = self._decode_positions(uniq, None)
        pts = self.index.pts
        arrays = {j: self.to_array(frames[int(pts[j])]) for j in uniq}
        return [arrays[j] for j in pos]


def psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two uint8 images in dB (inf when equal). The squared differences are summed
    in int64: an int32 sum wraps past 2**31 (a 1080p frame off by 200 everywhere gave NaN,
    which no ``q < MIN_PSNR_DB`` refuses)."""
    d = (a.astype(np.int64) - b.astype(np.int64)).ravel()
    mse = float(np.dot(d, d)) / max(d.size, 1)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


def container_comment(path: str | os.PathLike) -> str | None:
    """The container's ``comment`` tag (where ``prep videos`` records its settings)."""
    container = _open(os.fspath(path))
    try:
        return container.metadata.get("comment")
    finally:
        container.close()


def random_access_seconds(
    path: str | os.PathLike, frames: int = 16, seed: int = 0, threads: int = 1
) -> float:
    """Measured seconds per frame when ``frames`` random frames of ``path`` are read one at a time
    (each sought: the access pattern of a shuffled epoch), RGB conversion included."""
    vf = VideoFile(path, threads=threads)
    try:
        rng = np.random.default_rng(seed)
        picks = rng.choice(vf.index.pts, size=min(frames, vf.index.num_frames), replace=False)
        t0 = time.perf_counter()
        for p in picks.tolist():
            vf.reset()  # force the restart a random access pays
            vf.read_pts([p])
        return (time.perf_counter() - t0) / max(1, len(picks))
    finally:
        vf.close()


def decode_all(path: str | os.PathLike, threads: int = 0, fileobj: Any = None) -> int:
    """Decode every frame of ``path`` (no conversion); the count. :class:`VideoError` on failure."""
    av = require_av()
    path = os.fspath(path)
    container = _open(path, fileobj)
    try:
        stream = _video_stream(container, path)
        stream.codec_context.thread_count = threads
        stream.thread_type = "AUTO"
        n = 0
        for _ in container.decode(stream):
            n += 1
        return n
    except av.error.FFmpegError as exc:
        raise VideoError(f"cannot decode: {exc}", path) from exc
    finally:
        container.close()


# The encoder lives in its own module (it imports this one); its names stay importable here.
__getattr__ = lazy_getattr(
    "episodekit.core.video",
    {
        "VideoWriter": "episodekit.core.video_writer",
        "EncodeOptions": "episodekit.core.video_writer",
    },
)
__all__ = [
    "FrameTimestampError",
    "SampleTable",
    "VideoError",
    "VideoFile",
    "VideoIndex",
    "mp4_sample_table",
    "mp4_samples",
    "probe",
    "psnr_db",
    "require_av",
]
