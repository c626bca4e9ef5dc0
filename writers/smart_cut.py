"""Smart cut: mp4 episodes cut at any frame, re-encoding only the groups of pictures (GOPs) a
cut falls in and copying every other packet unchanged.

Each output episode is a :class:`Piece`: the kept frame ranges of one source episode. A kept
range that starts on a keyframe is copied packet by packet (its decoded frames are
bit-identical to the source's); one that starts inside a GOP has its frames up to the next
keyframe decoded (from that GOP's keyframe) and encoded anew with the stream's codec, size,
pixel format and time base, starting with a keyframe, then the rest is copied. So every
episode, and every kept range, starts on a keyframe. A range that ends inside a GOP is copied
up to the cut when the stream reorders no frame across it (AV1 as LeRobot writes it, H.264
without B-frames); else that last GOP is re-encoded too.

Re-encoded frames are checked before anything is muxed: each is decoded again and compared
with the source frame (PSNR of the RGB pictures a loader gets, FFmpeg's default conversion);
the encoder's quality ladder is climbed until every frame reaches :data:`TARGET_PSNR`; a GOP
that only reaches :data:`MIN_PSNR` keeps the best encoding, one below it refuses the cut. The
quality is well above the source's (re-encoding at the source's CRF gives ~41 dB against the
decoded source): a GOP or two per cut costs a few kB more, never a visible step. Output
frames sit back to back: frame ``j`` of an episode at ``offset + j`` frame durations.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from episodekit.core.errors import EnvironmentProblem, os_problem
from episodekit.core.video import VideoError, canonical_codec, psnr_db, require_av
from episodekit.prep.remux import Placed, signature_difference, stream_signature

MIN_PSNR = 40.0  # dB: the floor for a re-encoded frame against the source frame
TARGET_PSNR = 45.0  # dB: what the quality ladder aims for
# encoder and quality ladder per codec (the first setting reaching TARGET_PSNR is used)
ENCODERS = {
    "av1": ("libsvtav1", [{"crf": c, "preset": "8"} for c in ("6", "1")]),
    # H.264: no B-frames (no reordering to fit between copied GOPs), and parameter sets with
    # id 1, sent in band: the copied packets keep using the source's (id 0, in the avcC)
    "h264": ("libx264", [{"crf": c, "x264-params": "bframes=0:sps-id=1"} for c in ("8", "2")]),
}


def _length_prefixed(data: bytes, size: int) -> bytes:
    """An Annex B access unit (start codes, what libx264 emits) as mp4 stores H.264: each NAL
    unit prefixed with its length in ``size`` bytes."""
    import re

    starts = [m.end() for m in re.finditer(b"\x00\x00\x01", data)]
    out = bytearray()
    for i, a in enumerate(starts):
        b = starts[i + 1] - 3 if i + 1 < len(starts) else len(data)
        nal = data[a:b]
        if i + 1 < len(starts) and nal.endswith(b"\x00"):  # a 4-byte start code's zero
            nal = nal[:-1]
        out += len(nal).to_bytes(size, "big") + nal
    return bytes(out)


def _as_stored(stream: Any, codec: str, packets: list[Any], delay: int) -> list[Any]:
    """Encoder packets made muxable next to the source's: H.264 NAL units length-prefixed as
    the source's avcC says, and every decode timestamp ``delay`` ticks before its pts, as the
    source's (so decode times keep increasing across a re-encoded GOP)."""
    av = require_av()
    extradata = bytes(stream.codec_context.extradata or b"")
    convert = codec == "h264" and extradata[:1] == b"\x01"
    out = []
    for p in packets:
        if convert:
            new = av.Packet(_length_prefixed(bytes(p), (extradata[4] & 3) + 1))
            new.pts, new.is_keyframe = p.pts, p.is_keyframe
            new.time_base = p.time_base
            p = new
        p.dts = p.pts - delay
        out.append(p)
    return out


@dataclass(frozen=True)
class Piece:
    """One output episode: frames ``ranges`` ([a, b) of the episode's frames, ascending) of the
    episode that starts at ``from_ts`` seconds in the local mp4 ``src`` and has ``length``
    frames."""

    src: str
    from_ts: float
    length: int
    ranges: tuple[tuple[int, int], ...]
    episode: int = -1  # the source episode_index, for messages


@dataclass
class CutStats:
    """What a smart cut did: frames copied and re-encoded, GOPs re-encoded, worst PSNR."""

    copied: int = 0
    reencoded: int = 0
    gops: int = 0
    min_psnr: float = float("inf")
    seconds: float = 0.0  # spent decoding, re-encoding and checking GOPs
    video_seconds: float = 0.0  # the whole video stage: packet copy plus the above
    cameras: dict[str, CutStats] = field(default_factory=dict)  # the same, per video key

    def add(self, key: str, cam: CutStats) -> None:
        """Count camera ``key``'s cut (its own stats) in the totals."""
        self.cameras[key] = cam
        self.copied += cam.copied
        self.reencoded += cam.reencoded
        self.gops += cam.gops
        self.min_psnr = min(self.min_psnr, cam.min_psnr)
        self.seconds += cam.seconds

    def counts(self) -> dict:
        worst = round(self.min_psnr, 2) if self.gops else None
        return {"frames_copied": self.copied, "frames_reencoded": self.reencoded,
                "gops_reencoded": self.gops, "min_psnr_db": worst}  # fmt: skip

    def as_dict(self) -> dict:
        d = {**self.counts(), "reencode_seconds": round(self.seconds, 3),
             "video_seconds": round(self.video_seconds, 3)}  # fmt: skip
        if self.cameras:
            d["cameras"] = {k: c.counts() for k, c in self.cameras.items()}
        return d


def _episode_packets(
    container: Any, stream: Any, piece: Piece, fps: float
) -> tuple[list[Any], np.ndarray]:
    """The packets an episode needs, in decode order, and each one's display index in the
    episode: its own (pts within half a frame of its span) ``0..length-1``; packets of the GOP
    it starts inside, decoded before it, ``-1`` (needed to decode, never copied); packets of
    the next episode decoded before its last one (reordering) ``length``."""
    tb = Fraction(stream.time_base)
    frame = Fraction(1) / Fraction(fps).limit_denominator(1_000_000) / tb
    lo = Fraction(piece.from_ts) / tb - frame / 2
    hi = lo + frame * piece.length
    container.seek(max(0, int(lo) - 1), stream=stream, backward=True, any_frame=False)
    out: list[Any] = []
    for packet in container.demux(stream):
        if packet.size == 0 or packet.pts is None:
            continue
        if packet.pts >= hi and packet.dts is not None and packet.dts >= hi:
            break
        if packet.pts < lo and packet.is_keyframe:
            out = []  # a later keyframe before the episode: decoding starts there
        out.append(packet)
    pts = np.array([int(p.pts) for p in out], dtype=np.int64)
    inside = (pts >= lo) & (pts < hi)
    if not inside.any():
        return [], np.zeros(0, dtype=np.int64)
    last = int(np.flatnonzero(inside)[-1])
    out, pts, inside = out[: last + 1], pts[: last + 1], inside[: last + 1]
    rank = np.where(pts < lo, -1, piece.length).astype(np.int64)
    order = np.argsort(pts[inside], kind="stable")
    own = np.empty(len(order), dtype=np.int64)
    own[order] = np.arange(len(order))
    rank[inside] = own
    return out, rank


def _plan_range(a: int, b: int, key: np.ndarray, rank: np.ndarray) -> list[tuple[str, int, int]]:
    """``[a, b)`` as ("copy" | "encode", first, end) runs in display order. ``key``: display
    indices of the keyframes; ``rank``: each packet's display index, in decode order."""
    runs: list[tuple[str, int, int]] = []
    start = a
    if a not in set(key.tolist()):
        nxt = key[key > a]
        start = min(int(nxt[0]) if len(nxt) else b, b)
        runs.append(("encode", a, start))
    if start < b:
        # copy [start, b) unless a packet decoded before the last kept one shows a frame >= b
        last = int(np.flatnonzero(rank < b).max())
        first = int(np.flatnonzero(rank == start)[0])
        if np.any(rank[first:last] >= b):
            k0 = int(key[key <= b - 1].max())
            if k0 > start:
                runs.append(("copy", start, k0))
            runs.append(("encode", max(k0, start), b))
        else:
            runs.append(("copy", start, b))
    return runs


def _decode(stream: Any, packets: list[Any], rank: np.ndarray, lo: int, hi: int) -> list[Any]:
    """Frames ``[lo, hi)`` (display order) decoded from the keyframe at or before ``lo``."""
    av = require_av()
    key = [i for i, p in enumerate(packets) if p.is_keyframe and rank[i] <= lo]
    first = max(key, key=lambda i: rank[i]) if key else 0
    ctx = av.CodecContext.create(stream.codec_context.name, "r")
    if stream.codec_context.extradata:
        ctx.extradata = stream.codec_context.extradata
    pts_rank = {int(p.pts): int(r) for p, r in zip(packets, rank)}
    got: dict[int, Any] = {}
    for p in packets[first:] + [None]:
        for fr in ctx.decode(p):
            r = pts_rank.get(int(fr.pts)) if fr.pts is not None else None
            if r is not None and lo <= r < hi:
                got[r] = fr
        if len(got) == hi - lo:
            break
    if len(got) != hi - lo:
        raise VideoError(f"could not decode frames {lo}..{hi - 1} of the episode to re-encode")
    return [got[r] for r in range(lo, hi)]


def _encode(
    stream: Any, frames: list[Any], first_pts: int, ticks: Fraction, gop: int, delay: int = 0
) -> tuple[list[Any], float]:
    """``frames`` encoded anew (first one a keyframe) with pts ``first_pts + j * ticks``;
    returns the packets and the worst PSNR of their decoded frames against ``frames``."""
    av = require_av()
    codec = canonical_codec(stream.codec_context.codec.canonical_name) or stream.codec_context.name
    if codec not in ENCODERS:
        raise VideoError(
            f"no smart cut for {codec} video (it re-encodes {', '.join(ENCODERS)}); "
            "cut on keyframes instead"
        )
    name, ladder = ENCODERS[codec]
    src = stream.codec_context
    best: tuple[list[Any], float] | None = None
    for options in ladder:
        enc = av.CodecContext.create(name, "w")
        enc.width, enc.height, enc.pix_fmt = src.width, src.height, src.pix_fmt
        enc.time_base = stream.time_base
        enc.framerate = stream.average_rate or stream.guessed_rate
        enc.gop_size = max(gop, 1)
        enc.options = dict(options)
        packets = []
        for j, fr in enumerate(frames):
            new = fr.reformat()  # a copy: same format, no conversion
            new.pts = first_pts + int(j * ticks)
            new.time_base = stream.time_base
            new.pict_type = (
                av.video.frame.PictureType.I if j == 0 else av.video.frame.PictureType.NONE
            )
            packets += enc.encode(new)
        packets += enc.encode(None)
        dec = av.CodecContext.create(src.name, "r")
        decoded = []
        for p in packets + [None]:
            decoded += dec.decode(p)
        if len(decoded) != len(frames) or not packets[0].is_keyframe:
            continue
        worst = min(
            psnr_db(a.to_ndarray(format="rgb24"), b.to_ndarray(format="rgb24"))
            for a, b in zip(frames, decoded)
        )
        if best is None or worst > best[1]:
            best = (_as_stored(stream, codec, packets, delay), worst)
        if worst >= TARGET_PSNR:
            break
    if best is None or best[1] < MIN_PSNR:
        got = f"{best[1]:.1f} dB PSNR" if best else "no decodable frames"
        raise VideoError(f"re-encoding a group of pictures reached {got}, below {MIN_PSNR:g} dB")
    return best


def smart_remux(
    pieces: list[Piece],
    out_path: str | os.PathLike,
    fps: float,
    lossless_only: bool = False,
    stats: CutStats | None = None,
) -> list[Placed]:
    """Write ``out_path`` (an mp4) holding ``pieces`` back to back (see the module docstring)
    and return where each landed. ``lossless_only``: a cut that needs a GOP re-encoded is a
    :class:`ValueError` instead. The caller stages, verifies and publishes the file."""
    if not pieces:
        raise ValueError("smart_remux needs at least one piece")
    av = require_av()
    stats = stats if stats is not None else CutStats()
    signature = stream_signature(pieces[0].src)
    placed: list[Placed] = []
    sources: dict[str, Any] = {}
    try:
        with av.open(os.fspath(out_path), "w", format="mp4") as out:
            ostream, offset = None, 0
            for piece in pieces:
                if piece.src not in sources:
                    diff = signature_difference(signature, stream_signature(piece.src))
                    if diff:
                        raise VideoError(f"cannot join by packet copy: {diff}", piece.src)
                    sources[piece.src] = av.open(piece.src)
                stream = sources[piece.src].streams.video[0]
                if ostream is None:
                    ostream = out.add_stream_from_template(stream, opaque=True)
                    tb = Fraction(stream.time_base)
                    ticks = Fraction(1) / Fraction(fps).limit_denominator(1_000_000) / tb
                gops = stats.gops
                target = _Target(out, ostream, ticks, fps, lossless_only, stats)
                n = _mux_piece(target, stream, sources[piece.src], piece, offset)
                end = offset + int(n * ticks)
                placed.append(Placed(float(offset * tb), float(end * tb), n, stats.gops > gops))
                offset = end
    except av.error.FFmpegError as exc:
        problem = os_problem(exc, out_path, "write") if isinstance(exc, OSError) else None
        if isinstance(problem, EnvironmentProblem):
            raise problem from exc
        raise VideoError(f"cannot cut video: {exc}", os.fspath(out_path)) from exc
    finally:
        for c in sources.values():
            c.close()
    return placed


@dataclass
class _Target:
    """Where pieces go: the output container and stream, a frame's ticks, the fps, whether
    re-encoding is refused, and the running :class:`CutStats`."""

    out: Any
    ostream: Any
    ticks: Fraction
    fps: float
    lossless_only: bool
    stats: CutStats


def _mux_piece(t: _Target, stream: Any, container: Any, piece: Piece, offset: int) -> int:
    """Mux one episode's kept frames from ``offset`` (ticks); returns the frames written."""
    out, ostream, ticks, stats = t.out, t.ostream, t.ticks, t.stats
    packets, rank = _episode_packets(container, stream, piece, t.fps)
    own = (rank >= 0) & (rank < piece.length)
    if int(own.sum()) != piece.length:
        raise VideoError(
            f"{int(own.sum())} video frames at {piece.from_ts:g} s, the episode has {piece.length}",
            piece.src,
        )
    pts = np.array([int(p.pts) for p in packets], dtype=np.int64)
    key = np.sort(rank[[i for i, p in enumerate(packets) if p.is_keyframe and own[i]]])
    gop = int(np.diff(key).max()) if len(key) > 1 else piece.length
    by_rank = np.full(piece.length, -1, dtype=np.int64)  # packet position of each display index
    by_rank[rank[own]] = np.flatnonzero(own)
    # the decode delay of the source (B-frames): kept by re-encoded packets
    first = packets[int(np.flatnonzero(own)[0])]
    delay = int(first.pts - first.dts) if first.dts is not None else 0
    written = 0
    for a, b in piece.ranges:
        for kind, lo, hi in _plan_range(a, b, key, rank):
            first_pts = offset + int(written * ticks)
            if kind == "copy":
                shift = first_pts - int(pts[by_rank[lo]])
                for i in np.flatnonzero((rank >= lo) & (rank < hi)).tolist():
                    p = packets[i]
                    p.pts += shift
                    if p.dts is not None:
                        p.dts += shift
                    p.stream = ostream
                    out.mux(p)
                stats.copied += hi - lo
            else:
                if t.lossless_only:  # a bad argument for this video: exit 2
                    raise ValueError(
                        f"--lossless-only: the cut before frame {lo} of episode "
                        f"{piece.episode} is not on a keyframe of {piece.src} (without "
                        "--lossless-only that group of pictures is re-encoded)"
                    )
                t0 = time.perf_counter()
                frames = _decode(stream, packets, rank, lo, hi)
                new, worst = _encode(stream, frames, first_pts, ticks, gop, delay)
                stats.seconds += time.perf_counter() - t0
                for p in new:
                    p.stream = ostream
                    out.mux(p)
                stats.reencoded += hi - lo
                stats.gops += 1
                stats.min_psnr = min(stats.min_psnr, worst)
            written += hi - lo
    return written
