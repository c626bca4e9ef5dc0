"""prep/remux.py: episodes cut and joined by packet copy decode to exactly the source's frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from episodekit.core.video import VideoError, VideoWriter, have_av
from episodekit.prep.remux import (
    CutNotOnKeyframe,
    Segment,
    remux,
    signature_difference,
    stream_signature,
)

pytestmark = pytest.mark.skipif(not have_av(), reason="needs PyAV")

VID24 = Path(__file__).parents[1] / "fixtures" / "lerobot" / "vid24"
KEY = "observation.images.top"


def _frames(path: str | Path) -> list[tuple[float, np.ndarray]]:
    """Every decoded frame as (seconds, its planes in the native pixel format: bit-exact)."""
    import av

    with av.open(str(path)) as c:
        tb = float(c.streams.video[0].time_base)
        return [(f.pts * tb, f.to_ndarray()) for f in c.decode(video=0)]


def _window(frames, lo: float, hi: float, fps: float = 30.0) -> list[np.ndarray]:
    half = 0.5 / fps
    return [a for t, a in frames if lo - half <= t < hi - half]


def _vid24_segments(drop: set[int]) -> tuple[list[Segment], list[int]]:
    eps = pl.read_parquet(VID24 / "meta/episodes/chunk-000/file-000.parquet")
    segs, lengths = [], []
    for r in eps.iter_rows(named=True):
        if r["episode_index"] in drop:
            continue
        chunk, file = r[f"videos/{KEY}/chunk_index"], r[f"videos/{KEY}/file_index"]
        src = VID24 / f"videos/{KEY}/chunk-{chunk:03d}/file-{file:03d}.mp4"
        segs.append(
            Segment(str(src), r[f"videos/{KEY}/from_timestamp"], r[f"videos/{KEY}/to_timestamp"])
        )
        lengths.append(r["length"])
    return segs, lengths


def _assert_frame_exact(segs, placed, lengths, out: Path) -> None:
    out_frames = _frames(out)
    assert len(out_frames) == sum(lengths)
    cache: dict[str, list] = {}
    for seg, p, n in zip(segs, placed, lengths, strict=True):
        if seg.src not in cache:
            cache[seg.src] = _frames(seg.src)
        src = cache[seg.src]
        want = _window(src, seg.from_ts, seg.to_ts)
        got = _window(out_frames, p.from_ts, p.to_ts)
        assert p.frames == len(want) == len(got) == n
        assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


def test_lerobot_av1_episodes_dropped_across_files_are_frame_exact(tmp_path):
    segs, lengths = _vid24_segments(drop={3, 12, 13})
    assert len({s.src for s in segs}) == 2  # joins both of LeRobot's files
    placed = remux(segs, tmp_path / "out.mp4")
    assert placed[0].from_ts == 0.0
    for a, b in zip(placed, placed[1:]):
        assert b.from_ts == pytest.approx(a.to_ts)  # back to back, no gap
    assert not any(p.reencoded for p in placed)
    _assert_frame_exact(segs, placed, lengths, tmp_path / "out.mp4")
    assert stream_signature(tmp_path / "out.mp4") == stream_signature(segs[0].src)


def _h264(path: Path, episodes: list[int], gop: int = 50) -> list[Segment]:
    """An h264 file (B-frames, long GOP) with a forced keyframe at each episode start."""
    rng = np.random.default_rng(0)
    segs, t = [], 0.0
    with VideoWriter(path, 64, 48, 30, codec="h264", gop=gop, crf=18, threads=1) as w:
        for n in episodes:
            base = rng.integers(0, 255, (1, 48, 64, 3), dtype=np.uint8)
            frames = np.clip(base + np.arange(n)[:, None, None, None] * 3, 0, 255)
            w.write(frames.astype(np.uint8), keyframe_first=True)
            segs.append(Segment(str(path), t, t + n / 30))
            t += n / 30
    return segs


def test_h264_with_reordered_frames_reversed_order(tmp_path):
    segs = _h264(tmp_path / "src.mp4", [40, 25, 33])
    chosen = [segs[2], segs[0]]
    placed = remux(chosen, tmp_path / "out.mp4")
    _assert_frame_exact(chosen, placed, [33, 40], tmp_path / "out.mp4")


def test_cut_not_on_a_keyframe_is_refused(tmp_path):
    segs = _h264(tmp_path / "src.mp4", [40])
    with pytest.raises(CutNotOnKeyframe, match="keyframe"):
        remux([Segment(segs[0].src, 10 / 30, 40 / 30)], tmp_path / "out.mp4")


def test_empty_segment_and_missing_source(tmp_path):
    segs = _h264(tmp_path / "src.mp4", [20])
    with pytest.raises(VideoError, match="no frame"):
        remux([Segment(segs[0].src, 5.0, 6.0)], tmp_path / "out.mp4")
    with pytest.raises(VideoError):
        stream_signature(tmp_path / "missing.mp4")


def test_signature_difference_names_what_differs(tmp_path):
    h264 = stream_signature(_h264(tmp_path / "a.mp4", [5])[0].src)
    av1 = stream_signature(_vid24_segments(drop=set())[0][0].src)
    assert signature_difference(av1, av1) is None
    diff = signature_difference(av1, h264)
    assert "codec av1 vs h264" in diff and "width 128 vs 64" in diff
    with pytest.raises(VideoError, match="codec av1 vs h264"):
        remux(
            [_vid24_segments(set())[0][0], Segment(str(tmp_path / "a.mp4"), 0, 5 / 30)],
            tmp_path / "out.mp4",
        )
