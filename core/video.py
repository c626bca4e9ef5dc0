"""mp4 video through PyAV (the optional ``[video]`` extra): probe, decode in pts order, encode.

One place for the three things every layer needs: ``probe`` demuxes a file without decoding it
(stream facts + every packet's pts and keyframe flag: what validation and the decoders plan with);
``VideoFile`` keeps one container open and decodes the frames at given pts in ascending order with
one seek per run (a seek only when a keyframe lies between the decoder's position and the next
wanted frame, so a run of nearby frames is decoded forward, never re-sought); ``VideoWriter``
encodes RGB frames the way LeRobot's recorder does (time base 1/(fps*512), yuv420p, forced
keyframe at each episode start). Without PyAV every entry point raises
:class:`EnvironmentProblem` naming what to install.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from episodekit.core.errors import DatasetError, EnvironmentProblem

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


class VideoError(DatasetError):
    """A video file that cannot be opened, demuxed or decoded, or lacks a requested frame."""


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


def _boxes(buf: bytes, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """ISO-BMFF boxes in buf[start:end]: (type, payload start, box end)."""
    pos = start
    while pos + 8 <= end:
        size, typ = struct.unpack_from(">I4s", buf, pos)
        head = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", buf, pos + 8)
            head = 16
        elif size == 0:
            size = end - pos
        if size < head or pos + size > end:
            raise ValueError(f"box {typ!r} at {pos} overruns its parent")
        yield typ, pos + head, pos + size
        pos += size


def _child(buf: bytes, start: int, end: int, typ: bytes) -> tuple[int, int] | None:
    return next(((a, b) for t, a, b in _boxes(buf, start, end) if t == typ), None)


def _read_moov(fh: Any, name: str) -> bytes | None:
    """The ``moov`` payload, walking top-level boxes by their headers only. None for a
    fragmented file; :class:`VideoError` for a file cut short (a box past the end)."""
    fh.seek(0, os.SEEK_END)
    total = fh.tell()
    pos, moov = 0, None
    while pos + 8 <= total:
        fh.seek(pos)
        head = fh.read(16)
        size, typ = struct.unpack_from(">I4s", head, 0)
        hlen = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", head, 8)
            hlen = 16
        elif size == 0:
            size = total - pos
        if size < hlen:
            raise VideoError(f"bad box header at byte {pos}", name)
        if pos + size > total:
            raise VideoError(
                f"file is truncated: box {typ.decode('latin-1')!r} ends at byte {pos + size}, "
                f"the file has {total}",
                name,
            )
        if typ == b"moof":
            return None
        if typ == b"moov":
            fh.seek(pos + hlen)
            moov = fh.read(size - hlen)
        pos += size
    return moov


def _u32(buf: bytes, start: int, count: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=">u4", count=count, offset=start).astype(np.int64)


def mp4_samples(fh: Any, name: str = "") -> tuple[np.ndarray, np.ndarray] | None:
    """(pts in stream ticks, keyframe flags), in decode order, of the first video track of an
    mp4 read from its sample tables (stts, ctts, stss, elst) with numpy: no packet is read.
    None when the file is not a plain mp4 this reader understands (fragmented, several edits),
    so callers fall back to demuxing. Raises :class:`VideoError` for a truncated file."""
    moov = _read_moov(fh, name)
    if moov is None:
        return None
    for typ, a, b in _boxes(moov, 0, len(moov)):
        if typ != b"trak":
            continue
        mdia = _child(moov, a, b, b"mdia")
        hdlr = mdia and _child(moov, *mdia, b"hdlr")
        if not hdlr or moov[hdlr[0] + 8 : hdlr[0] + 12] != b"vide":
            continue
        stbl = _child(moov, *_child(moov, *mdia, b"minf"), b"stbl")
        stts = _child(moov, *stbl, b"stts")
        (n,) = struct.unpack_from(">I", moov, stts[0] + 4)
        pairs = _u32(moov, stts[0] + 8, 2 * n).reshape(-1, 2)
        deltas = np.repeat(pairs[:, 1], pairs[:, 0])
        dts = np.concatenate([[0], np.cumsum(deltas)[:-1]]) if len(deltas) else deltas
        pts = dts.copy()
        ctts = _child(moov, *stbl, b"ctts")
        if ctts:
            (n,) = struct.unpack_from(">I", moov, ctts[0] + 4)
            raw = np.frombuffer(moov, dtype=">u4", count=2 * n, offset=ctts[0] + 8).reshape(-1, 2)
            off = raw[:, 1].astype(np.uint32).view(np.int32).astype(np.int64)  # v1: signed
            pts = pts + np.repeat(off, raw[:, 0].astype(np.int64))[: len(pts)]
        edts = _child(moov, a, b, b"edts")
        elst = edts and _child(moov, *edts, b"elst")
        if elst:
            version = moov[elst[0]]
            (n,) = struct.unpack_from(">I", moov, elst[0] + 4)
            if n != 1:
                return None
            fmt = ">Qq" if version == 1 else ">Ii"
            _, media_time = struct.unpack_from(fmt, moov, elst[0] + 8)
            pts = pts - max(0, media_time)
        stss = _child(moov, *stbl, b"stss")
        key = np.ones(len(pts), dtype=bool)
        if stss:
            (n,) = struct.unpack_from(">I", moov, stss[0] + 4)
            key[:] = False
            key[_u32(moov, stss[0] + 8, n) - 1] = True
        return pts, key
    return None


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
    ``reformatter`` keeps one conversion context instead of one per frame (~5x faster)."""
    h, w = (None, None) if size is None else size
    if reformatter is None:
        return frame.to_ndarray(format=fmt, width=w, height=h)
    return reformatter.reformat(frame, format=fmt, width=w, height=h).to_ndarray()


class VideoFile:
    """One open mp4 whose frames are decoded in ascending pts order, seeking only when a keyframe
    lies between the decoder's position and the next wanted frame.

    ``threads``: decoder threads (1 suits small frames and DataLoader workers; 0 = FFmpeg's
    choice). ``size``: optional (height, width) resize. Frames are uint8 HWC in ``fmt``.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        threads: int = 1,
        size: tuple[int, int] | None = None,
        fmt: str = "rgb24",
    ):
        self.path = os.fspath(path)
        self.size = size
        self.fmt = fmt
        with open(self.path, "rb") as fh:
            try:
                samples = mp4_samples(fh, self.path)
            except (ValueError, TypeError, struct.error, IndexError):
                samples = None
        self.container = _open(self.path)
        stream = _video_stream(self.container, self.path)
        self.index = _index_of(self.container, stream, self.path, samples)
        self.container.seek(0, stream=stream)
        stream.codec_context.thread_count = threads
        if threads != 1:
            stream.thread_type = "AUTO"
        self.stream = stream
        self._reformatter = require_av().video.reformatter.VideoReformatter()
        self._frames: Any = None  # the decode generator since the last seek
        self._pos = -1  # pts of the last decoded frame (-1: must seek)
        self.seeks = 0
        self.decoded = 0
        self._key_pos = np.flatnonzero(self.index.keyframe)

    def close(self) -> None:
        self.container.close()

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
        t = self.index.seconds
        if len(t) == 0:
            raise FrameTimestampError("video has no frames", self.path)
        j = np.clip(np.searchsorted(t, q), 1, max(1, len(t) - 1))
        left = np.clip(j - 1, 0, len(t) - 1)
        right = np.clip(j, 0, len(t) - 1)
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

    def read_pts(self, pts: Iterable[int]) -> dict[int, np.ndarray]:
        """Frames at the given pts (each must be in ``index.pts``), decoded in ascending order."""
        av = require_av()
        out: dict[int, np.ndarray] = {}
        for target in sorted(set(int(p) for p in pts)):
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
                    out[target] = _to_array(frame, self.fmt, self.size, self._reformatter)
                    break
                if fp > target:
                    self._pos = -1
                    raise VideoError(f"frame at pts {target} not decoded (got {fp})", self.path)
        return out

    def read_seconds(self, seconds: Sequence[float], tolerance_s: float) -> list[np.ndarray]:
        """Frames closest to each query time (LeRobot's tolerance rule), in query order."""
        pts, _ = self.nearest(seconds, tolerance_s)
        frames = self.read_pts(pts.tolist())
        return [frames[int(p)] for p in pts]


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
            vf._pos = -1  # force the seek a random access pays
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


class VideoWriter:
    """Encode RGB uint8 frames into an mp4 the way LeRobot's recorder does: time base
    1/(fps*512), one packet per frame, ``keyframe=True`` forces a keyframe (episode starts).

    ``codec``: ``av1`` (libsvtav1) or ``h264`` (libx264), or an FFmpeg encoder name; ``gop``:
    keyframe interval; ``crf``; ``faststart`` moves the index to the front (random access over
    HTTP starts without reading the file's end); ``threads``: encoder threads (0: FFmpeg's
    choice). Use as a context manager.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        width: int,
        height: int,
        fps: int,
        codec: str = "av1",
        gop: int = 2,
        crf: int = 30,
        pix_fmt: str = "yuv420p",
        faststart: bool = False,
        preset: str | None = None,
        time_base: Fraction | None = None,
        comment: str | None = None,
        threads: int = 0,
    ):
        av = require_av()
        self.path = os.fspath(path)
        encoder = ENCODERS.get(codec, codec)
        if encoder not in av.codecs_available:
            raise EnvironmentProblem(f"this PyAV build has no {encoder} encoder ({INSTALL_HINT})")
        options = {"movflags": "faststart"} if faststart else {}
        self.container = av.open(self.path, "w", format="mp4", options=options)
        if comment is not None:
            self.container.metadata["comment"] = comment
        stream = self.container.add_stream(encoder, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        stream.time_base = time_base or Fraction(1, int(fps) * TICKS_PER_FRAME)
        stream.codec_context.gop_size = gop
        if threads:  # 1: deterministic bytes and in-order packets (small sample videos)
            stream.codec_context.thread_count = int(threads)
        opts = {"crf": str(crf)}
        if encoder == "libsvtav1":
            opts["preset"] = preset or "10"
            # Low-delay prediction: no reordered frames (as in LeRobot's own files), so a forced
            # keyframe at an episode start never leaves the muxer a DTS that goes backwards.
            params = ["pred-struct=1"] + ([f"lp={int(threads)}"] if threads else [])
            opts["svtav1-params"] = ":".join(params)
        elif encoder == "libx264":
            opts["preset"] = preset or "veryfast"
        stream.options = opts
        self.stream = stream
        self._av = av
        self._n = 0

    def write(self, frames: np.ndarray, keyframe_first: bool = True) -> None:
        """Append frames (N, H, W, 3 uint8); the first becomes a keyframe when asked."""
        av = self._av
        for j, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            frame.pts = self._n * TICKS_PER_FRAME
            frame.time_base = self.stream.time_base
            if j == 0 and keyframe_first:
                frame.pict_type = av.video.frame.PictureType.I
            for packet in self.stream.encode(frame):
                self.container.mux(packet)
            self._n += 1

    def write_frame(self, frame: Any, pts: int, keyframe: bool) -> None:
        """Append a decoded ``av.VideoFrame`` at ``pts`` (stream ticks), converted to the stream's
        pixel format when needed; ``keyframe`` forces a keyframe (else the encoder's GOP)."""
        av = self._av
        if frame.format.name != self.stream.pix_fmt:
            frame = frame.reformat(format=self.stream.pix_fmt)
        frame.pts = int(pts)
        frame.time_base = self.stream.time_base
        frame.pict_type = (
            av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        )
        for packet in self.stream.encode(frame):
            self.container.mux(packet)
        self._n += 1

    def close(self) -> None:
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.container.close()
