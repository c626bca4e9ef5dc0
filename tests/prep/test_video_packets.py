"""The packet index (mp4 sample tables: offsets, sizes, pts, dts, keyframes) equals what the
demuxer reads, and decoding from it (packets fed by byte offset, no demuxer seek) returns the
frames a plain sequential decode returns, pixel for pixel: random single frames, windows across
episode edges, the file's last frame (the decoder's delay drained), threaded sequential passes;
with B-frames (h264 medium) and without (LeRobot's AV1)."""

from __future__ import annotations

import numpy as np
import pytest

av = pytest.importorskip("av")

from episodekit.core.video import VideoError, VideoFile, VideoWriter, mp4_sample_table  # noqa: E402
from episodekit.sample import read_frame_code, synthetic_frames  # noqa: E402

N, EPISODE = 120, 23  # frames; episodes of 23 frames, each starting on a keyframe
CASES = [("av1", "10", 2, False), ("h264", "medium", 50, True), ("h264", "veryfast", 7, False)]
IDS = ["av1_gop2", "h264_bframes_gop50_faststart", "h264_gop7"]


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def video(request, tmp_path_factory):
    codec, preset, gop, faststart = request.param
    path = tmp_path_factory.mktemp("packets") / f"{codec}_{preset}.mp4"
    with VideoWriter(
        path, 64, 48, 30, codec=codec, gop=gop, preset=preset, faststart=faststart
    ) as w:
        for a in range(0, N, EPISODE):
            w.write(synthetic_frames(np.arange(a, min(N, a + EPISODE)), 48, 64), True)
    container = av.open(str(path))
    truth = {f.pts: f.to_ndarray(format="rgb24") for f in container.decode(video=0)}
    container.close()
    return path, truth


def test_packet_index_equals_the_demuxer(video):
    path, _ = video
    with open(path, "rb") as fh:
        table = mp4_sample_table(fh, str(path))
    container = av.open(str(path))
    packets = [p for p in container.demux(video=0) if p.size]
    container.close()
    np.testing.assert_array_equal(table.pts, [p.pts for p in packets])
    np.testing.assert_array_equal(table.dts, [p.dts for p in packets])
    np.testing.assert_array_equal(table.keyframe, [p.is_keyframe for p in packets])
    np.testing.assert_array_equal(table.offset, [p.pos for p in packets])
    np.testing.assert_array_equal(table.size, [p.size for p in packets])
    data = path.read_bytes()
    for off, size, p in zip(table.offset.tolist(), table.size.tolist(), packets):
        assert data[off : off + size] == bytes(p)
    assert table.keyframe[np.arange(0, N, EPISODE)].all()


def test_random_frames_match_a_plain_decode_pixel_for_pixel(video):
    path, truth = video
    fast, slow = VideoFile(path), VideoFile(path, packets=False)
    assert fast.table is not None and slow.table is None
    order = np.random.default_rng(0).permutation(fast.index.pts)
    for p in order.tolist():
        want = truth[p]
        np.testing.assert_array_equal(fast.read_pts([p])[p], want)
        np.testing.assert_array_equal(slow.read_pts([p])[p], want)
    assert read_frame_code(fast.read_pts([int(order[0])])[int(order[0])]) == int(order[0]) // 512
    fast.close()
    slow.close()


def test_windows_across_episode_edges_and_the_last_frame(video):
    path, truth = video
    vf = VideoFile(path)
    pts = vf.index.pts
    for a in [*range(EPISODE, N, EPISODE), N - 1]:
        window = pts[max(0, a - 2) : a + 2].tolist()  # frames of two episodes
        got = vf.read_pts(window[::-1])  # any order in, ascending decode
        assert sorted(got) == sorted(window)
        for p in window:
            np.testing.assert_array_equal(got[p], truth[p])
    # The file's last frame alone, then again (the decoder's delay drained, then restarted).
    last = int(pts[-1])
    np.testing.assert_array_equal(vf.read_pts([last])[last], truth[last])
    np.testing.assert_array_equal(vf.read_pts([last])[last], truth[last])
    vf.close()


def test_sequential_pass_decodes_each_frame_once_with_threads(video):
    path, truth = video
    vf = VideoFile(path, threads=0)  # FFmpeg's threads: frame delay, drained at the end
    lo, hi = EPISODE, 2 * EPISODE
    want = vf.index.pts[lo:hi].tolist()
    got = vf.read_pts(want)
    assert vf.seeks == 1 and vf.decoded == hi - lo
    for p in want:
        np.testing.assert_array_equal(got[p], truth[p])
    # The next episode continues from the restart at its own keyframe: one more restart.
    got = vf.read_pts(vf.index.pts[hi : hi + EPISODE].tolist())
    assert vf.seeks == 2 and len(got) == EPISODE
    vf.close()


def test_consecutive_frames_continue_forward_without_a_restart(video):
    path, _ = video
    vf = VideoFile(path)
    pts = vf.index.pts
    for j in range(EPISODE, EPISODE + 5):
        vf.read_pts([int(pts[j])])
    assert vf.seeks == 1 and vf.decoded <= 5 + vf.mean_gop + 3  # one restart, then forward
    vf.close()


def test_unknown_pts_and_a_truncated_file_are_video_errors(video, tmp_path):
    path, _ = video
    vf = VideoFile(path)
    with pytest.raises(VideoError, match="no frame at pts"):
        vf.read_pts([int(vf.index.pts[1]) + 1])
    vf.close()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(path.read_bytes()[:-100])  # the last packets (or the index) cut off
    with pytest.raises(VideoError, match="truncated|cannot open"):
        VideoFile(cut)
