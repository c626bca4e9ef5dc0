"""VideoWriter at every frame rate robot data is recorded at: below 20 fps the mp4 muxer raised
LeRobot's time scale (512 ticks a frame) and then refused reordered frames' DTS (h264
B-frames; AV1 at 10 and 15 fps): an import of 10 Hz RLDS data failed on its first video."""

from __future__ import annotations

import numpy as np
import pytest

av = pytest.importorskip("av")

from episodekit.core.video_writer import VideoWriter, ticks_per_frame  # noqa: E402


@pytest.mark.parametrize("fps", [5, 10, 15, 20, 30, 50])
@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_frames_1_over_fps_apart_at_any_rate(tmp_path, fps, codec):
    path = tmp_path / "v.mp4"
    rng = np.random.default_rng(fps)
    with VideoWriter(path, 32, 32, fps, codec=codec) as w:
        for _ in range(3):  # three episodes, each starting on a keyframe
            w.write(rng.integers(0, 255, (7, 32, 32, 3), dtype=np.uint8))
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        pts = sorted(p.pts for p in c.demux(s) if p.pts is not None)
        assert float(s.time_base) * ticks_per_frame(fps) * fps == pytest.approx(1.0)
    assert pts == [k * ticks_per_frame(fps) for k in range(21)]


def test_lerobot_ticks_kept_from_20_fps():
    assert ticks_per_frame(30) == 512 and ticks_per_frame(20) == 512
    assert ticks_per_frame(10) == 1024 and fps_scale(5) >= 10_000


def fps_scale(fps: int) -> int:
    return fps * ticks_per_frame(fps)
