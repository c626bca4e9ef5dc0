"""An mp4's frame count from its stts and stsz boxes, read by seeking (``mp4_frame_count``: what
an import's camera process checks each mp4 it closes with): equal to PyAV's on LeRobot-written
files and on a long one, reading only box headers and those tables (memory does not grow with
the frames); a file cut short is a ``VideoError``, a file without a ``moov`` None."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from episodekit.core.mp4 import VideoError, mp4_frame_count  # noqa: E402
from episodekit.core.video import probe  # noqa: E402
from episodekit.core.video_writer import VideoWriter  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


class CountingFile(io.BytesIO):
    """A file that counts the bytes read from it."""

    read_bytes = 0

    def read(self, n: int | None = -1) -> bytes:
        out = super().read(n)
        self.read_bytes += len(out)
        return out


@pytest.mark.parametrize(
    "name", sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.mp4"))[:8]
)
def test_lerobot_written_videos(name: str) -> None:
    path = FIXTURES / name
    with open(path, "rb") as fh:
        assert mp4_frame_count(fh, name) == probe(path).num_frames


def test_reads_headers_and_stts_only(tmp_path: Path) -> None:
    path = tmp_path / "long.mp4"
    frames = np.zeros((600, 16, 16, 3), np.uint8)
    with VideoWriter(path, 16, 16, 30, codec="h264", gop=2) as w:
        for i in range(0, 600, 100):
            w.write(frames[i : i + 100] + i % 250, keyframe_first=True)
    data = path.read_bytes()
    fh = CountingFile(data)
    assert mp4_frame_count(fh, "long.mp4") == probe(path).num_frames == 600
    assert fh.read_bytes < 2_000  # the stsz table alone holds 2,400 bytes here

    with pytest.raises(VideoError, match="truncated"):
        mp4_frame_count(io.BytesIO(data[:-100]), "cut.mp4")
    moov_at = data.find(b"moov") - 4
    assert mp4_frame_count(io.BytesIO(data[:moov_at]), "no-moov.mp4") is None
