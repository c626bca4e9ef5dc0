"""An mp4's stream facts from its boxes alone: codec, size, pixel format, rate, audio, and every
frame's pts and keyframe flag, read from the top-level box headers and the ``moov`` box (no PyAV,
no packet, no byte of ``mdat``).

What ``validate --metadata-only`` compares with info.json on a hub or HTTP root, where reading a
video's packets would cost its whole size. The values are the ones FFmpeg reports for the same
file: codec from the sample entry (``av01``, ``avc1``...), size from the visual sample entry,
the pixel format from the decoder configuration record (``av1C``, ``avcC``'s sequence parameter
set, ``hvcC``, ``vpcC``), the average frame rate as FFmpeg's mov demuxer computes it (samples x
timescale / the sum of the sample durations), the time base 1/timescale. A fact the boxes do not
settle (an unknown sample entry, 4:4:4 content that may be RGB) is None: the caller says it was
not decided, never guesses.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from episodekit.core.mp4 import (  # the box walk of core.mp4, shared
    SampleTable,
    VideoError,
    _boxes,
    _child,
    _read_moov,
    _track_samples,
    _tracks,
    _u32,
)
from episodekit.core.video import VideoIndex

CODECS = {
    b"av01": "av1",
    b"avc1": "h264",
    b"avc3": "h264",
    b"hvc1": "hevc",
    b"hev1": "hevc",
    b"vp09": "vp9",
    b"vp08": "vp8",
}
VISUAL_ENTRY = 78  # bytes of a VisualSampleEntry before its child boxes (ISO 14496-12 12.1.3)
H264_HIGH = {100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135}  # chroma in the SPS


@dataclass
class BoxStream:
    """The first video track of an mp4 as its boxes describe it (None: not settled by them)."""

    codec: str | None
    width: int
    height: int
    pix_fmt: str | None
    timescale: int
    fps: float
    has_audio: bool
    samples: SampleTable


def mp4_stream(fh: Any, name: str = "") -> BoxStream | None:
    """The :class:`BoxStream` of the mp4 open as ``fh`` (reads the top-level box headers and the
    ``moov`` box only). None when the boxes do not describe it (fragmented, several edits);
    :class:`VideoError` for a file cut short or without a video track. Malformed boxes raise
    ValueError/struct.error/IndexError/TypeError."""
    moov = _read_moov(fh, name)
    if moov is None:
        return None
    video, audio = None, False
    for kind, a, b, mdia in _tracks(moov):
        audio = audio or kind == b"soun"
        if kind == b"vide" and video is None:
            video = (a, b, mdia)
    if video is None:
        raise VideoError("no video stream", name)
    a, b, mdia = video
    samples = _track_samples(moov, a, b, mdia, with_bytes=False)
    if samples is None:
        return None
    mdhd = _child(moov, *mdia, b"mdhd")
    (timescale,) = struct.unpack_from(">I", moov, mdhd[0] + (20 if moov[mdhd[0]] == 1 else 12))
    if not timescale:
        return None
    stbl = _child(moov, *_child(moov, *mdia, b"minf"), b"stbl")
    stts = _child(moov, *stbl, b"stts")
    (n,) = struct.unpack_from(">I", moov, stts[0] + 4)
    pairs = _u32(moov, stts[0] + 8, 2 * n).reshape(-1, 2)
    frames, ticks = int(pairs[:, 0].sum()), int((pairs[:, 0] * pairs[:, 1]).sum())
    fps = float(Fraction(timescale * frames, ticks)) if frames and ticks and timescale else 0.0
    stsd = _child(moov, *stbl, b"stsd")
    entry = stsd[0] + 8  # after version, flags and the entry count
    size, fourcc = struct.unpack_from(">I4s", moov, entry)
    width, height = struct.unpack_from(">HH", moov, entry + 8 + 24)
    configs = {t: moov[p:q] for t, p, q in _boxes(moov, entry + 8 + VISUAL_ENTRY, entry + size)}
    return BoxStream(
        codec=CODECS.get(fourcc),
        width=int(width),
        height=int(height),
        pix_fmt=_pix_fmt(fourcc, configs),
        timescale=int(timescale),
        fps=fps,
        has_audio=audio,
        samples=samples,
    )


def _yuv(chroma: str, depth: int) -> str | None:
    """FFmpeg's name of a planar format: ``gray``, ``yuv420p``, ``yuv422p10le``... (4:4:4: None,
    it may be RGB, which only the sequence header says)."""
    base = {"400": "gray", "420": "yuv420p", "422": "yuv422p"}.get(chroma)
    if base is None or depth not in (8, 10, 12):
        return None
    return base if depth == 8 else f"{base}{depth}le"


def _pix_fmt(fourcc: bytes, configs: dict[bytes, bytes]) -> str | None:
    try:
        if fourcc == b"av01" and b"av1C" in configs:
            return _av1_pix_fmt(configs[b"av1C"])
        if fourcc in (b"avc1", b"avc3") and b"avcC" in configs:
            return _h264_pix_fmt(configs[b"avcC"])
        if fourcc in (b"hvc1", b"hev1") and b"hvcC" in configs:
            c = configs[b"hvcC"]
            return _yuv({0: "400", 1: "420", 2: "422"}.get(c[16] & 3, ""), (c[17] & 7) + 8)
        if fourcc == b"vp09" and b"vpcC" in configs and configs[b"vpcC"][0] == 1:
            c = configs[b"vpcC"][4:]  # version 1: after version and flags
            return _yuv({0: "420", 1: "420", 2: "422"}.get((c[2] >> 1) & 7, ""), c[2] >> 4)
    except (IndexError, ValueError):
        return None
    return None


def _av1_pix_fmt(c: bytes) -> str | None:
    """From the AV1CodecConfigurationRecord: bit depth, monochrome, chroma subsampling."""
    high, twelve, mono = (c[2] >> 6) & 1, (c[2] >> 5) & 1, (c[2] >> 4) & 1
    sx, sy = (c[2] >> 3) & 1, (c[2] >> 2) & 1
    depth = 12 if high and twelve else 10 if high else 8
    chroma = "400" if mono else {(1, 1): "420", (1, 0): "422"}.get((sx, sy), "")
    return _yuv(chroma, depth)


class _Bits:
    """An RBSP read bit by bit, with exp-Golomb codes (H.264 7.2, 9.1)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def u(self, n: int) -> int:
        v = 0
        for _ in range(n):
            byte = self.data[self.pos >> 3]  # IndexError past the end: not settled
            v = (v << 1) | ((byte >> (7 - (self.pos & 7))) & 1)
            self.pos += 1
        return v

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("exp-Golomb code too long")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        k = self.ue()
        return (k + 1) // 2 if k & 1 else -(k // 2)


def _rbsp(nal: bytes) -> bytes:
    """A NAL unit's payload without its header byte and emulation prevention bytes."""
    out, zeros = bytearray(), 0
    for byte in nal[1:]:
        if zeros >= 2 and byte == 3:
            zeros = 0
            continue
        out.append(byte)
        zeros = zeros + 1 if byte == 0 else 0
    return bytes(out)


def _h264_pix_fmt(c: bytes) -> str | None:
    """From the first sequence parameter set of an AVCDecoderConfigurationRecord: chroma format,
    bit depth and the full-range flag (FFmpeg's ``yuvj*`` formats for 8-bit full range)."""
    if not c[5] & 0x1F:
        return None
    (length,) = struct.unpack_from(">H", c, 6)
    r = _Bits(_rbsp(c[8 : 8 + length]))
    profile = r.u(8)
    r.u(16)  # constraint flags, level
    r.ue()  # seq_parameter_set_id
    chroma, depth = 1, 8
    if profile in H264_HIGH:
        chroma = r.ue()
        if chroma == 3:
            return None  # 4:4:4, possibly RGB
        depth = r.ue() + 8
        r.ue()  # bit_depth_chroma_minus8
        r.u(1)  # qpprime_y_zero_transform_bypass_flag
        if r.u(1):  # seq_scaling_matrix_present_flag
            for i in range(8):
                if r.u(1):
                    _skip_scaling_list(r, 16 if i < 6 else 64)
    r.ue()  # log2_max_frame_num_minus4
    poc = r.ue()
    if poc == 0:
        r.ue()
    elif poc == 1:
        r.u(1)
        r.se()
        r.se()
        for _ in range(r.ue()):
            r.se()
    r.ue()  # max_num_ref_frames
    r.u(1)  # gaps_in_frame_num_value_allowed_flag
    r.ue()  # pic_width_in_mbs_minus1
    r.ue()  # pic_height_in_map_units_minus1
    if not r.u(1):  # frame_mbs_only_flag
        r.u(1)
    r.u(1)  # direct_8x8_inference_flag
    if r.u(1):  # frame_cropping_flag
        for _ in range(4):
            r.ue()
    full = False
    if r.u(1):  # vui_parameters_present_flag
        if r.u(1) and r.u(8) == 255:  # aspect_ratio_info_present_flag, aspect_ratio_idc
            r.u(32)
        if r.u(1):  # overscan_info_present_flag
            r.u(1)
        if r.u(1):  # video_signal_type_present_flag
            r.u(3)
            full = bool(r.u(1))
    # FFmpeg decodes monochrome H.264 (chroma_format_idc 0) as 4:2:0 with neutral chroma.
    name = _yuv({0: "420", 1: "420", 2: "422"}.get(chroma, ""), depth)
    if name and full and depth == 8:
        return name.replace("yuv", "yuvj")
    return name


def _skip_scaling_list(r: _Bits, size: int) -> None:
    last = nxt = 8
    for _ in range(size):
        if nxt:
            nxt = (last + r.se() + 256) % 256
        last = nxt or last


def probe_boxes(path: str | os.PathLike, fileobj: Any = None) -> VideoIndex | None:
    """What :func:`probe` tells, read from the mp4's boxes alone (top-level box headers and
    ``moov``; no packet, no PyAV): :func:`mp4_stream`. Facts the boxes
    do not settle are named in ``undecided`` (``codec``, ``pix_fmt``); None when the boxes do
    not describe the file (fragmented, several edits, malformed tables). Raises
    :class:`VideoError` for a file cut short or without a video track, as :func:`probe` does."""
    path = os.fspath(path)
    with contextlib.ExitStack() as stack:
        fh = fileobj if fileobj is not None else stack.enter_context(open(path, "rb"))
        try:
            s = mp4_stream(fh, path)
        except (ValueError, TypeError, struct.error, IndexError):
            return None
    if s is None:
        return None
    order = np.argsort(s.samples.pts, kind="stable")
    undecided = tuple(k for k, v in (("codec", s.codec), ("pix_fmt", s.pix_fmt)) if v is None)
    return VideoIndex(
        path=path,
        codec=s.codec or "",
        width=s.width,
        height=s.height,
        pix_fmt=s.pix_fmt,
        fps=s.fps,
        time_base=Fraction(1, s.timescale),
        pts=s.samples.pts[order],
        keyframe=s.samples.keyframe[order],
        has_audio=s.has_audio,
        undecided=undecided,
    )
