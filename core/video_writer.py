"""Encoding: :class:`VideoWriter` writes RGB frames into an mp4 the way LeRobot's recorder does,
with the encoder settings in :class:`EncodeOptions`."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from episodekit.core.errors import EnvironmentProblem
from episodekit.core.video import ENCODERS, INSTALL_HINT, TICKS_PER_FRAME, require_av


@dataclass(frozen=True)
class EncodeOptions:
    """Encoder settings of a :class:`VideoWriter`.

    ``codec``: ``av1`` (libsvtav1) or ``h264`` (libx264), or an FFmpeg encoder name; ``gop``:
    keyframe interval; ``crf``; ``pix_fmt``; ``faststart`` moves the index to the front (random
    access over HTTP starts without reading the file's end); ``preset``: the encoder's (default
    10 for av1, veryfast for h264); ``time_base`` (default 1/(fps*512)); ``comment``: the
    container's comment tag; ``threads``: encoder threads (0: FFmpeg's choice)."""

    codec: str = "av1"
    gop: int = 2
    crf: int = 30
    pix_fmt: str = "yuv420p"
    faststart: bool = False
    preset: str | None = None
    time_base: Fraction | None = None
    comment: str | None = None
    threads: int = 0


# LeRobot 0.6.1's encoder: rgb_encoder_defaults() (lerobot/configs/video.py)
LEROBOT_RGB = EncodeOptions(codec="av1", gop=2, crf=30, pix_fmt="yuv420p", preset="12")
MIN_TIMESCALE = 10_000  # the mp4 muxer's smallest video time scale (movenc)


def ticks_per_frame(fps: float) -> int:
    """Stream ticks per frame of the files we encode: LeRobot's 512 (time base 1/(512 fps)),
    doubled until the time scale reaches :data:`MIN_TIMESCALE` (below 20 fps)."""
    ticks = TICKS_PER_FRAME
    while int(fps) * ticks < MIN_TIMESCALE:
        ticks *= 2
    return ticks


class VideoWriter:
    """Encode RGB uint8 frames into an mp4 the way LeRobot's recorder does: time base
    1/(fps*512), one packet per frame, ``keyframe=True`` forces a keyframe (episode starts).

    Settings in ``options`` (:class:`EncodeOptions`); keyword ``overrides`` replace single fields
    (``VideoWriter(path, w, h, fps, codec="h264", gop=2)``). Use as a context manager.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        width: int,
        height: int,
        fps: int,
        options: EncodeOptions | None = None,
        **overrides: Any,
    ):
        opts = replace(options or EncodeOptions(), **overrides)
        codec, gop, crf, pix_fmt = opts.codec, opts.gop, opts.crf, opts.pix_fmt
        faststart, preset, threads = opts.faststart, opts.preset, opts.threads
        time_base, comment = opts.time_base, opts.comment
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
        # The mp4 muxer raises a time scale under 10,000 (it doubles it), and then rejects the
        # DTS of reordered frames (h264 B-frames, AV1 below 20 fps): ticks per frame doubled
        # until the scale is at least that (LeRobot's 512 from 20 fps up: same files there).
        self.ticks = ticks_per_frame(fps) if time_base is None else TICKS_PER_FRAME
        stream.time_base = time_base or Fraction(1, int(fps) * self.ticks)
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
        self.bytes = 0  # encoded bytes muxed so far (a file's size as it grows, no flush lag)

    def write(self, frames: np.ndarray, keyframe_first: bool = True) -> None:
        """Append frames (N, H, W, 3 uint8); the first becomes a keyframe when asked."""
        av = self._av
        for j, img in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            frame.pts = self._n * self.ticks
            frame.time_base = self.stream.time_base
            if j == 0 and keyframe_first:
                frame.pict_type = av.video.frame.PictureType.I
            for packet in self.stream.encode(frame):
                self._mux(packet)
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
            self._mux(packet)
        self._n += 1

    def _mux(self, packet: Any) -> None:
        self.bytes += packet.size
        self.container.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode():
            self._mux(packet)
        self.container.close()

    def abort(self) -> None:
        """Close after an error (the file is discarded): the encoder is still told that the
        stream ended, else libsvtav1 prints ``Svt[error]: deinit called without sending EOS!``
        under the error message; whatever fails here is dropped, the first error stands."""
        with contextlib.suppress(Exception):
            for _packet in self.stream.encode():
                pass
        with contextlib.suppress(Exception):
            self.container.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
