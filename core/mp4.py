"""mp4 sample tables read from the file's boxes (no PyAV): every packet's byte offset, size,
pts and keyframe flag of the first video track, what :class:`~episodekit.core.video.VideoFile`
decodes from and what validation and repair plan with; :class:`VideoError` for a file that
cannot be read."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from episodekit.core.errors import DatasetError


class VideoError(DatasetError):
    """A video file that cannot be opened, demuxed or decoded, or lacks a requested frame."""


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
    """The ``moov`` payload, walking top-level boxes by their headers only (:func:`_walk`).
    None for a fragmented file; :class:`VideoError` for a file cut short (a box past the end)."""
    fh.seek(0, os.SEEK_END)
    moov = None
    for typ, start, end in _walk(fh, 0, fh.tell(), name):
        if typ == b"moof":
            return None
        if typ == b"moov":
            fh.seek(start)
            moov = fh.read(end - start)
    return moov


def _u32(buf: bytes, start: int, count: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=">u4", count=count, offset=start).astype(np.int64)


@dataclass
class SampleTable:
    """The first video track of an mp4 as its sample tables describe it, in decode order: each
    sample's dts and pts (stream ticks, edit list applied), keyframe flag, byte offset in the file
    and size. What a decoder needs to read packets itself, without the demuxer."""

    dts: np.ndarray
    pts: np.ndarray
    keyframe: np.ndarray
    offset: np.ndarray
    size: np.ndarray


def _sample_bytes(moov: bytes, stbl: tuple[int, int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(file offset, size) of each of ``n`` samples from stsz/stz2, stsc and stco/co64."""
    stsz = _child(moov, *stbl, b"stsz")
    if stsz is None:
        raise ValueError("no stsz box")
    fixed, count = struct.unpack_from(">II", moov, stsz[0] + 4)
    size = np.full(count, fixed, np.int64) if fixed else _u32(moov, stsz[0] + 12, count)
    stsc = _child(moov, *stbl, b"stsc")
    (m,) = struct.unpack_from(">I", moov, stsc[0] + 4)
    runs = _u32(moov, stsc[0] + 8, 3 * m).reshape(-1, 3)
    stco = _child(moov, *stbl, b"stco")
    if stco is not None:
        (c,) = struct.unpack_from(">I", moov, stco[0] + 4)
        chunk_off = _u32(moov, stco[0] + 8, c)
    else:
        co64 = _child(moov, *stbl, b"co64")
        (c,) = struct.unpack_from(">I", moov, co64[0] + 4)
        chunk_off = np.frombuffer(moov, ">u8", count=c, offset=co64[0] + 8).astype(np.int64)
    first = runs[:, 0] - 1  # first chunk (0-based) of each run
    chunks_in_run = np.diff(np.r_[first, c])
    per_chunk = np.repeat(runs[:, 1], chunks_in_run)
    if len(size) != n or int(per_chunk.sum()) != n or (chunks_in_run < 0).any():
        raise ValueError("sample tables disagree on the sample count")
    chunk_of = np.repeat(np.arange(c), per_chunk)
    ends = np.cumsum(size)
    starts = ends - size
    chunk_first = np.r_[0, np.cumsum(per_chunk)[:-1]]
    offset = chunk_off[chunk_of] + starts - starts[chunk_first][chunk_of]
    return offset, size


def mp4_sample_table(fh: Any, name: str = "", with_bytes: bool = True) -> SampleTable | None:
    """The :class:`SampleTable` of the first video track of an mp4 read from its sample tables
    (stts, ctts, stss, elst; with ``with_bytes`` also stsz, stsc, stco/co64) with numpy: no packet
    is read. None when the file is not a plain mp4 this reader understands (fragmented, several
    edits), so callers fall back to demuxing. Raises :class:`VideoError` for a truncated file;
    other malformed tables raise ValueError/struct.error/IndexError/TypeError."""
    moov = _read_moov(fh, name)
    if moov is None:
        return None
    for kind, a, b, mdia in _tracks(moov):
        if kind == b"vide":
            return _track_samples(moov, a, b, mdia, with_bytes)
    return None


def _tracks(moov: bytes) -> Iterator[tuple[bytes, int, int, tuple[int, int]]]:
    """(handler type, trak payload start, trak end, its mdia box) of every track in ``moov``."""
    for typ, a, b in _boxes(moov, 0, len(moov)):
        if typ != b"trak":
            continue
        mdia = _child(moov, a, b, b"mdia")
        hdlr = mdia and _child(moov, *mdia, b"hdlr")
        if hdlr:
            yield moov[hdlr[0] + 8 : hdlr[0] + 12], a, b, mdia


def _track_samples(
    moov: bytes, a: int, b: int, mdia: tuple[int, int], with_bytes: bool
) -> SampleTable | None:
    """The :class:`SampleTable` of the track ``moov[a:b]`` (None: several edits)."""
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
        dts = dts - max(0, media_time)
    stss = _child(moov, *stbl, b"stss")
    key = np.ones(len(pts), dtype=bool)
    if stss:
        (n,) = struct.unpack_from(">I", moov, stss[0] + 4)
        key[:] = False
        key[_u32(moov, stss[0] + 8, n) - 1] = True
    if with_bytes:
        offset, size = _sample_bytes(moov, stbl, len(pts))
    else:
        offset = size = np.zeros(len(pts), np.int64)
    return SampleTable(dts=dts, pts=pts, keyframe=key, offset=offset, size=size)


def mp4_samples(fh: Any, name: str = "") -> tuple[np.ndarray, np.ndarray] | None:
    """(pts in stream ticks, keyframe flags), in decode order, of the first video track of an
    mp4 read from its sample tables (see :func:`mp4_sample_table`); None when the file is not a
    plain mp4 this reader understands. Raises :class:`VideoError` for a truncated file."""
    table = mp4_sample_table(fh, name, with_bytes=False)
    return None if table is None else (table.pts, table.keyframe)


STREAM_ENTRIES = 65536  # stts runs read at a time by mp4_frame_count (512 KiB)


def _walk(fh: Any, start: int, end: int, name: str) -> Iterator[tuple[bytes, int, int]]:
    """Boxes in the file's ``[start, end)`` read by their headers only (seek + 16 bytes each):
    (type, payload start, box end); :class:`VideoError` for a box past ``end``."""
    pos = start
    while pos + 8 <= end:
        fh.seek(pos)
        head = fh.read(16)
        if len(head) < 8:
            raise VideoError(f"file is truncated at byte {pos}", name)
        size, typ = struct.unpack_from(">I4s", head, 0)
        hlen = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", head, 8)
            hlen = 16
        elif size == 0:
            size = end - pos
        if size < hlen or pos + size > end:
            raise VideoError(
                f"file is truncated or malformed: box {typ.decode('latin-1')!r} at byte {pos} "
                f"ends at byte {pos + size}, its parent at {end}",
                name,
            )
        yield typ, pos + hlen, pos + size
        pos += size


def _find(fh: Any, start: int, end: int, typ: bytes, name: str) -> tuple[int, int] | None:
    return next(((a, b) for t, a, b in _walk(fh, start, end, name) if t == typ), None)


def _u32_blocks(fh: Any, at: int, count: int, name: str, width: int = 1) -> Iterator[np.ndarray]:
    """``count`` entries of ``width`` big-endian u32 from byte ``at``, in blocks of at most
    :data:`STREAM_ENTRIES` entries (memory independent of ``count``)."""
    fh.seek(at)
    while count > 0:
        n = min(count, STREAM_ENTRIES)
        raw = fh.read(4 * width * n)
        if len(raw) != 4 * width * n:
            raise VideoError(f"sample table at byte {at} cut short", name)
        yield np.frombuffer(raw, dtype=">u4").reshape(n, width).astype(np.int64)
        count -= n


def mp4_frame_count(fh: Any, name: str = "") -> int | None:
    """The first video track's frame count read from the file's stts and stsz boxes by
    seeking: only box headers, stsz's header and stts' runs (in blocks) are read, so memory does
    not grow with the frames (unlike :func:`mp4_sample_table`, or opening the file with PyAV,
    whose demuxer indexes every sample). None for a file without a ``moov`` or a fragmented
    one; :class:`VideoError` for a file cut short or whose two tables disagree on the count."""
    fh.seek(0, os.SEEK_END)
    total = fh.tell()
    moov = None
    for typ, a, b in _walk(fh, 0, total, name):
        if typ == b"moof":
            return None
        if typ == b"moov":
            moov = (a, b)
    if moov is None:
        return None
    for typ, a, b in _walk(fh, *moov, name):
        mdia = _find(fh, a, b, b"mdia", name) if typ == b"trak" else None
        hdlr = mdia and _find(fh, *mdia, b"hdlr", name)
        if not hdlr:
            continue
        fh.seek(hdlr[0] + 8)
        if fh.read(4) != b"vide":
            continue
        minf = _find(fh, *mdia, b"minf", name)
        stbl = minf and _find(fh, *minf, b"stbl", name)
        stts = stbl and _find(fh, *stbl, b"stts", name)
        stsz = stbl and _find(fh, *stbl, b"stsz", name)
        if not stts or not stsz:
            raise VideoError("the video track has no stts or stsz box", name)
        fh.seek(stts[0] + 4)
        (runs,) = struct.unpack(">I", fh.read(4))
        frames = sum(int(blk[:, 0].sum()) for blk in _u32_blocks(fh, stts[0] + 8, runs, name, 2))
        fh.seek(stsz[0] + 8)
        (count,) = struct.unpack(">I", fh.read(4))
        if count != frames:
            raise VideoError(f"stts counts {frames} samples, stsz {count}", name)
        return frames
    return None
