"""An mp4's stream facts from its boxes alone (``probe_boxes``, what ``validate --metadata-only``
judges videos by) equal PyAV's ``probe`` on LeRobot-written files and on files of other codecs,
bit depths, chroma formats and ranges; a fact the boxes do not settle is said so, never guessed;
and only the box headers and ``moov`` are read, never a byte of ``mdat``."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest

av = pytest.importorskip("av")

from episodekit.core.mp4_stream import probe_boxes  # noqa: E402
from episodekit.core.video import probe  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
FACTS = ("codec", "width", "height", "pix_fmt", "fps", "time_base", "has_audio")


def assert_same(path: Path) -> None:
    a, b = probe(path), probe_boxes(path)
    assert b is not None and b.undecided == ()
    assert {k: getattr(b, k) for k in FACTS} == {k: getattr(a, k) for k in FACTS}, path
    assert np.array_equal(a.pts, b.pts) and np.array_equal(a.keyframe, b.keyframe)


@pytest.mark.parametrize(
    "name", sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.mp4"))[:12]
)
def test_lerobot_written_videos(name):
    assert_same(FIXTURES / name)


def encode(path: Path, codec: str, pix_fmt: str, options: dict | None = None) -> Path:
    try:
        c = av.open(str(path), "w", options=options or {})
        s = c.add_stream(codec, rate=25)
        s.width, s.height, s.pix_fmt = 64, 48, pix_fmt
        rng = np.random.default_rng(0)
        for _ in range(12):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (48, 64, 3), np.uint8), "rgb24")
            for p in s.encode(frame):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
        c.close()
    except (av.error.FFmpegError, ValueError) as exc:  # an encoder this FFmpeg lacks
        pytest.skip(f"{codec} {pix_fmt}: {exc}")
    return path


@pytest.mark.parametrize(
    "codec,pix_fmt",
    [
        ("libx264", "yuv420p"),
        ("libx264", "yuvj420p"),  # full range: FFmpeg's yuvj name, from the SPS's VUI
        ("libx264", "yuv422p"),
        ("libx264", "yuv420p10le"),
        ("libx264", "gray"),  # decoded by FFmpeg as 4:2:0
        ("libx265", "yuv420p10le"),
        ("libx265", "gray"),
        ("libvpx-vp9", "yuv420p"),
        ("libsvtav1", "yuv420p10le"),
    ],
)
def test_other_codecs_and_formats(tmp_path, codec, pix_fmt):
    assert_same(encode(tmp_path / "v.mp4", codec, pix_fmt))


def test_what_the_boxes_do_not_settle_is_said(tmp_path):
    b = probe_boxes(encode(tmp_path / "v.mp4", "libx264", "yuv444p"))  # 4:4:4: maybe RGB
    assert b.undecided == ("pix_fmt",) and b.pix_fmt is None
    assert b.codec == "h264" and b.width == 64
    b = probe_boxes(encode(tmp_path / "m.mp4", "mpeg4", "yuv420p"))  # mp4v: not decided
    assert set(b.undecided) == {"codec", "pix_fmt"}
    frag = {"movflags": "frag_keyframe+empty_moov"}
    assert probe_boxes(encode(tmp_path / "f.mp4", "libx264", "yuv420p", frag)) is None


class Counted(io.BytesIO):
    """A file that records the byte ranges read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads: list[tuple[int, int]] = []

    def read(self, n: int = -1) -> bytes:
        start = self.tell()
        out = super().read(n)
        self.reads.append((start, start + len(out)))
        return out


def test_only_box_headers_and_moov_are_read():
    path = next(iter(sorted((FIXTURES / "vid24").rglob("*.mp4"))))
    data = path.read_bytes()
    boxes, pos = {}, 0
    while pos < len(data):
        size, typ = struct.unpack_from(">I4s", data, pos)
        boxes[typ] = (pos, pos + size)
        pos += size
    fh = Counted(data)
    assert probe_boxes(str(path), fh) is not None
    a, b = boxes[b"mdat"]
    inside_mdat = sum(max(0, min(e, b) - max(s, a + 16)) for s, e in fh.reads)
    assert inside_mdat == 0, fh.reads
    moov = boxes[b"moov"][1] - boxes[b"moov"][0]
    assert sum(e - s for s, e in fh.reads) <= moov + 16 * len(boxes)
