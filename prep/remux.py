"""Cut and join mp4 videos by packet copy: no frame is decoded or re-encoded.

A LeRobot v3.0 mp4 holds several episodes back to back; an episode is ``[from_timestamp,
to_timestamp)`` seconds inside it. Dropping, merging or converting episodes therefore means: take
each kept episode's packets (its :class:`Segment`), shift their timestamps so the segments sit back
to back in a new file, and mux them unchanged. That is lossless (decoded frames are bit-identical
to the source's) and runs at disk speed, where LeRobot's editor decodes and re-encodes every kept
frame.

A segment must start on a keyframe: LeRobot's recorder and ``prep videos`` force one at every
episode start, so this holds for the files we meet. One that does not is refused
(:class:`CutNotOnKeyframe`) rather than silently re-encoded. All segments of one output must
share the stream parameters (:func:`stream_signature`, :func:`signature_difference`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from episodekit.core.errors import EnvironmentProblem, os_problem
from episodekit.core.video import VideoError, canonical_codec, require_av

# Where a packet belongs: its pts may sit up to half a frame from the nominal timestamp
# (``from_timestamp`` is a float of seconds rounded by the writer).
HALF_FRAME = Fraction(1, 2)


class CutNotOnKeyframe(VideoError):
    """A segment's first frame is not a keyframe, so packet copy cannot start there."""


@dataclass(frozen=True)
class Segment:
    """Frames ``[from_ts, to_ts)`` (seconds) of the local mp4 ``src``: one episode's video."""

    src: str
    from_ts: float
    to_ts: float


@dataclass(frozen=True)
class Placed:
    """Where a :class:`Segment` landed in the output: its ``[from_ts, to_ts)`` seconds there, the
    frames (packets) copied, and whether any was re-encoded (always False: copy only)."""

    from_ts: float
    to_ts: float
    frames: int
    reencoded: bool = False


def stream_signature(path: str | os.PathLike) -> dict[str, Any]:
    """The parameters two files must share for their packets to live in one stream: codec,
    frame size, pixel format, time base and the codec's configuration record (sha256 of the
    extradata: SPS/PPS for H.264, the sequence header for AV1)."""
    av = require_av()
    try:
        with av.open(os.fspath(path)) as container:
            if not container.streams.video:
                raise VideoError("no video stream", os.fspath(path))
            stream = container.streams.video[0]
            ctx = stream.codec_context
            return {
                "codec": canonical_codec(ctx.codec.canonical_name) or ctx.codec.name,
                "width": int(ctx.width),
                "height": int(ctx.height),
                "pix_fmt": ctx.pix_fmt,
                "time_base": str(Fraction(stream.time_base)),
                "extradata": hashlib.sha256(bytes(ctx.extradata or b"")).hexdigest()[:16],
            }
    except av.error.FFmpegError as exc:
        raise VideoError(f"cannot open video: {exc}", os.fspath(path)) from exc


def signature_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """None when packets of streams ``a`` and ``b`` can be joined by copy, else what differs,
    e.g. ``"width 128 vs 256"``. AV1 carries its sequence header in every keyframe, so only
    codecs that keep their parameters out of band (H.264, HEVC) must match in extradata."""
    keys = ["codec", "width", "height", "pix_fmt", "time_base"]
    if a.get("codec") in ("h264", "hevc"):
        keys.append("extradata")
    diffs = [f"{k} {a.get(k)} vs {b.get(k)}" for k in keys if a.get(k) != b.get(k)]
    return ", ".join(diffs) or None


def _ticks(seconds: float, time_base: Fraction) -> Fraction:
    return Fraction(seconds) / time_base


def _segment_packets(container: Any, stream: Any, seg: Segment) -> list[Any]:
    """The packets of ``seg`` in decode order: pts within half a frame of ``[from_ts, to_ts)``."""
    tb = Fraction(stream.time_base)
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    half = HALF_FRAME / Fraction(rate) / tb if rate else Fraction(0)
    lo, hi = _ticks(seg.from_ts, tb) - half, _ticks(seg.to_ts, tb) - half
    container.seek(max(0, int(lo) - 1), stream=stream, backward=True, any_frame=False)
    packets = []
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue
        if packet.pts >= hi and packet.dts is not None and packet.dts >= hi:
            break
        if lo <= packet.pts < hi:
            packets.append(packet)
    return packets


def _first_keyframe_check(packets: list[Any], seg: Segment) -> None:
    if not packets:
        raise VideoError(f"no frame in [{seg.from_ts}, {seg.to_ts}) s", seg.src)
    first = min(packets, key=lambda p: p.pts)
    if not first.is_keyframe:
        raise CutNotOnKeyframe(
            f"the segment starting at {seg.from_ts} s does not start on a keyframe "
            "(packet copy needs one: `prep videos` re-encodes with a keyframe at each "
            "episode start)",
            seg.src,
        )


def _mux_segment(out: Any, ostream: Any, packets: list[Any], offset: int) -> tuple[int, int]:
    """Mux ``packets`` shifted so the first pts lands on ``offset`` (stream ticks); returns
    (first pts in the output, end pts = last pts + its duration)."""
    start = min(p.pts for p in packets)
    shift = offset - start
    end = offset
    for packet in packets:
        duration = packet.duration or 0
        end = max(end, packet.pts + shift + duration)
        packet.pts += shift
        if packet.dts is not None:
            packet.dts += shift
        packet.stream = ostream
        out.mux(packet)
    return offset, end


def remux(
    segments: list[Segment], out_path: str | os.PathLike, faststart: bool = False
) -> list[Placed]:
    """Write ``out_path`` (an mp4) holding ``segments`` back to back by packet copy, and return
    where each landed. The caller stages and publishes the file (write a temp name, verify,
    ``os.replace``). Raises :class:`VideoError` for an unreadable source or a segment with no
    frames, :class:`CutNotOnKeyframe` for a cut that packet copy cannot make, and
    :class:`VideoError` naming the difference when sources cannot share one stream."""
    if not segments:
        raise ValueError("remux needs at least one segment")
    av = require_av()
    signature = stream_signature(segments[0].src)
    options = {"movflags": "faststart"} if faststart else {}
    placed: list[Placed] = []
    sources: dict[str, Any] = {}
    try:
        with av.open(os.fspath(out_path), "w", format="mp4", options=options) as out:
            ostream = None
            offset = 0
            for seg in segments:
                if seg.src not in sources:
                    diff = signature_difference(signature, stream_signature(seg.src))
                    if diff:
                        raise VideoError(f"cannot join by packet copy: {diff}", seg.src)
                    sources[seg.src] = av.open(seg.src)
                container = sources[seg.src]
                stream = container.streams.video[0]
                if ostream is None:
                    ostream = out.add_stream_from_template(stream, opaque=True)
                    tb = Fraction(stream.time_base)
                packets = _segment_packets(container, stream, seg)
                _first_keyframe_check(packets, seg)
                first, end = _mux_segment(out, ostream, packets, offset)
                placed.append(Placed(float(first * tb), float(end * tb), len(packets)))
                offset = end
    except av.error.FFmpegError as exc:
        problem = os_problem(exc, out_path, "write") if isinstance(exc, OSError) else None
        if isinstance(problem, EnvironmentProblem):  # disk full, read-only: not the video's fault
            raise problem from exc
        raise VideoError(f"cannot copy video packets: {exc}", os.fspath(out_path)) from exc
    finally:
        for container in sources.values():
            container.close()
    return placed
