"""Smart cut on vid24 (LeRobot's AV1, a keyframe every 2 frames, two cameras): cuts off a
keyframe re-encode only the GOP they fall in; every other decoded frame is bit-identical to the
source's, re-encoded ones are >= 40 dB PSNR, every episode starts on a keyframe, the output
passes ``validate --deep``; ``--lossless-only`` refuses such a cut (one line, exit 2) and makes
cuts on keyframes by packet copy alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset

av = pytest.importorskip("av")

from episodekit.writers.edit import EditSpec, edit  # noqa: E402
from episodekit.writers.frames import parse_frame_spec  # noqa: E402
from episodekit.writers.smart_cut import MIN_PSNR, _plan_range  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-m", "episodekit.cli"]
KEYS = ("observation.images.top", "observation.images.wrist")
# off keyframes (GOP 2: keyframes on even frames): a start at 3, a middle cut whose rest starts
# at 19, a tail after frame 50 (of 60); episode 22 cut at its start and in the middle
SPEC = "0:0-2,3:11-18,7:51-59,22:0-0,22:40-41"
DROP = {0: [(0, 3)], 3: [(11, 19)], 7: [(51, 60)], 22: [(0, 1), (40, 42)]}


def decoded(ds, key: str, row: int) -> list[tuple[bool, np.ndarray]]:
    """(keyframe, RGB) of every frame of the episode at ``row``, in order."""
    ep = ds.episodes.slice(row, 1).to_pylist()[0]
    rel = ds.video_path(key, ep[f"videos/{key}/chunk_index"], ep[f"videos/{key}/file_index"])
    a, b = ep[f"videos/{key}/from_timestamp"], ep[f"videos/{key}/to_timestamp"]
    with av.open(ds.join(rel)) as c:
        s = c.streams.video[0]
        tb = s.time_base
        return [(fr.key_frame, fr.to_ndarray(format="rgb24")) for fr in c.decode(s)
                if a - 1e-4 <= float(fr.pts * tb) < b - 1e-4]  # fmt: skip


def psnr(x: np.ndarray, y: np.ndarray) -> float:
    mse = np.mean((x.astype(np.float64) - y) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255**2 / mse))


@pytest.fixture(scope="module")
def vid(tmp_path_factory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("smartcut")
    src = tmp / "vid24"
    shutil.copytree(FIXTURES / "vid24", src)
    r = edit(str(src), tmp / "out", EditSpec(drop_frames=parse_frame_spec(SPEC)))
    assert r.write.status == "written"
    return src, tmp / "out"


@pytest.mark.parametrize("key", KEYS)
def test_frames_outside_reencoded_gops_are_bit_identical(vid, key):
    s, o = open_dataset(str(vid[0])), open_dataset(str(vid[1]))
    assert o.num_episodes == s.num_episodes
    changed = 0
    for e in range(s.num_episodes):
        a, b = decoded(s, key, e), decoded(o, key, e)
        keep = np.ones(len(a), dtype=bool)
        for lo, hi in DROP.get(e, []):
            keep[lo:hi] = False
        kept = [f for f, k in zip(a, keep) if k]
        assert len(b) == len(kept) == o.column("length")[e], e
        assert b[0][0], f"episode {e} does not start on a keyframe"
        for j, ((_, x), (_, y)) in enumerate(zip(kept, b)):
            if not np.array_equal(x, y):
                changed += 1
                assert e in DROP, f"episode {e} frame {j} changed but was not cut"
                assert psnr(x, y) >= MIN_PSNR, (e, j, psnr(x, y))
    # re-encoded: frame 3 of ep 0, frame 19 of ep 3, frame 1 of ep 22: one per GOP (the cut
    # before 42 lands on a keyframe; cuts at an end are copied: AV1 reorders no frame)
    assert 0 < changed <= 3


def test_the_cut_output_passes_validate_deep(vid):
    v = subprocess.run([*CLI, "validate", str(vid[1]), "--deep", "--json"], capture_output=True,
                       text=True, timeout=900)  # fmt: skip
    assert v.returncode == 0 and json.loads(v.stdout)["counts"]["error"] == 0, v.stdout


def test_lossless_only_refuses_a_cut_off_a_keyframe(tmp_path):
    r = subprocess.run([*CLI, "edit", str(FIXTURES / "vid24"), "--out", str(tmp_path / "o"),
                        "--drop-frames", "3:11-18", "--lossless-only"], capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert "the cut before frame 19 of episode 3 is not on a keyframe" in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_lossless_only_cuts_on_keyframes_by_packet_copy(tmp_path):
    src = FIXTURES / "vid24"
    r = edit(str(src), tmp_path / "o", EditSpec(drop_frames=parse_frame_spec("3:10-19"),
                                                 lossless_only=True))  # fmt: skip
    assert r.write.status == "written"
    s, o = open_dataset(str(src)), open_dataset(str(tmp_path / "o"))
    a, b = decoded(s, KEYS[0], 3), decoded(o, KEYS[0], 3)
    kept = a[:10] + a[20:]
    assert len(b) == len(kept)
    for (_, x), (_, y) in zip(kept, b):
        np.testing.assert_array_equal(x, y)


def test_plan_range_reencodes_only_what_a_cut_needs():
    key = np.array([0, 2, 4, 6])
    rank = np.arange(8)  # no reordering
    assert _plan_range(0, 8, key, rank) == [("copy", 0, 8)]
    assert _plan_range(3, 7, key, rank) == [("encode", 3, 4), ("copy", 4, 7)]
    assert _plan_range(5, 6, key, rank) == [("encode", 5, 6)]
    # B-frames (display 0 2 1 in decode order): a cut after frame 1 needs frame 2 decoded first
    key = np.array([0, 3])
    rank = np.array([0, 2, 1, 3, 5, 4])
    assert _plan_range(0, 2, key, rank) == [("encode", 0, 2)]
    assert _plan_range(0, 3, key, rank) == [("copy", 0, 3)]
    assert _plan_range(1, 5, key, rank) == [("encode", 1, 3), ("encode", 3, 5)]


@pytest.mark.slow
def test_h264_with_b_frames(tmp_path):
    """H.264 as `prep videos --codec h264` writes it (B-frames, GOP 10): the re-encoded GOPs
    carry their own parameter sets (id 1) and decode times fit between the copied ones."""
    src = tmp_path / "h264"
    p = subprocess.run([*CLI, "prep", "videos", str(FIXTURES / "vid24"), "--codec", "h264",
                        "--gop", "10", "--out", str(src), "--timing-frames", "0"],
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert p.returncode == 0, p.stderr
    s = open_dataset(str(src))
    with av.open(s.join(s.video_path(KEYS[0], 0, 0))) as c:
        pk = [x for x in c.demux(c.streams.video[0]) if x.size][:12]
    assert any(x.pts != x.dts for x in pk)  # frames are reordered
    out = tmp_path / "out"
    r = edit(str(src), out, EditSpec(drop_frames=parse_frame_spec("0:0-2,3:11-14")))
    assert r.write.status == "written"
    o = open_dataset(str(out))
    for e, (lo, hi) in ((0, (0, 3)), (3, (11, 15)), (5, (0, 0))):
        a, b = decoded(s, KEYS[0], e), decoded(o, KEYS[0], e)
        kept = a[:lo] + a[hi:]
        assert len(b) == len(kept) and b[0][0]
        same = [np.array_equal(x, y) for (_, x), (_, y) in zip(kept, b)]
        assert all(psnr(x, y) >= MIN_PSNR for (_, x), (_, y) in zip(kept, b))
        # re-encoded: ep 0 frames 3..9, ep 3 frames 15..19 (to the next keyframe)
        assert same.count(False) <= {0: 7, 3: 5, 5: 0}[e], e


def test_episodes_off_keyframes_get_their_first_gop_reencoded(tmp_path):
    """A source whose episodes do not start on keyframes (one encode of the whole file, GOP 7):
    a whole-episode edit no longer refuses it (CutNotOnKeyframe) but re-encodes the first GOP
    of each such episode; ``--lossless-only`` keeps the refusal."""
    from episodekit.sample import write_sample

    src = write_sample(tmp_path / "s", episodes=4, videos=1, video_codec="h264", mean_length=30)
    mp4 = next((src / "videos").rglob("*.mp4"))
    with av.open(str(mp4)) as c:
        s = c.streams.video[0]
        frames = [(f.pts, f.to_ndarray(format="rgb24")) for f in c.decode(s)]
        tb, rate, (w, h) = s.time_base, s.average_rate, (s.width, s.height)
    with av.open(str(mp4) + ".new.mp4", "w") as out:
        st = out.add_stream("libx264", rate=rate, options={"crf": "18", "g": "7"})
        st.width, st.height, st.pix_fmt, st.time_base = w, h, "yuv420p", tb
        for pts, x in frames:
            f = av.VideoFrame.from_ndarray(x, format="rgb24")
            f.pts, f.time_base = pts, tb
            out.mux(st.encode(f))
        out.mux(st.encode(None))
    Path(str(mp4) + ".new.mp4").replace(mp4)
    r = subprocess.run([*CLI, "edit", str(src), "--out", str(tmp_path / "lossless"),
                        "--drop-episodes", "0", "--lossless-only"], capture_output=True,
                       text=True, timeout=600)  # fmt: skip
    assert r.returncode == 1 and "does not start on a keyframe" in r.stderr, r.stderr
    res = edit(str(src), tmp_path / "out", EditSpec(drop_episodes=(0,)))
    cut = res.as_dict()["video_cut"]
    assert cut["gops_reencoded"] >= 1 and cut["min_psnr_db"] >= MIN_PSNR, cut
    a, b = open_dataset(str(src)), open_dataset(str(tmp_path / "out"))
    key = a.video_keys[0]
    for e in range(3):
        x, y = decoded(a, key, e + 1), decoded(b, key, e)
        assert len(x) == len(y) and y[0][0]
        assert all(psnr(p, q) >= MIN_PSNR for (_, p), (_, q) in zip(x, y))
