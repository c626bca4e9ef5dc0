"""Each camera of an import encoded in its own process (writers.camera_encoder): the same mp4
bytes, ``videos/*`` values and stats as encoding in this process; errors come back as raised."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from episodekit.core.errors import DatasetError
from episodekit.importers.episode import ArrayImages, EncodedImages, SourceError
from episodekit.importers.rlds import decode_image
from episodekit.writers.camera_encoder import Camera, CameraProcess, encode_episode
from episodekit.writers.sink import SinkFeature

pytest.importorskip("av")
FEATURE = SinkFeature("observation.images.top", "image", "video", (24, 32, 3), None, "av1")


def _episodes() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    base = rng.integers(0, 256, (24, 32, 3))
    return [
        np.clip(base + rng.normal(0, 12, (n, 24, 32, 3)), 0, 255).astype(np.uint8)
        for n in (5, 1, 9)
    ]


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def test_the_child_writes_what_this_process_writes(tmp_path: Path) -> None:
    """Raw frames, BGR frames and PNG files (decoded in the child) through the child give the
    bytes, ``videos/*`` values and image stats of :func:`encode_episode` here."""
    eps = _episodes()
    here = Camera(FEATURE)
    want = [encode_episode(here, eps[0], tmp_path / "here", 15, 1e12)]
    want.append(encode_episode(here, eps[1][..., ::-1], tmp_path / "here", 15, 1e12))
    want.append(encode_episode(here, eps[2], tmp_path / "here", 15, 1e12))
    here.writer.close()

    cam = Camera(FEATURE)
    child = CameraProcess(cam, tmp_path / "child", 15, 1e12)
    assert child.proc.pid != os.getpid()
    child.send_images(ArrayImages(eps[0]), "rgb", "ep0", 5)
    child.send_images(ArrayImages(eps[1]), "bgr", "ep1", 1)
    pngs = EncodedImages([_png(f) for f in eps[2]], "png", decode_image_rgb)
    child.send_images(pngs, "rgb", "ep2", 9)
    got = [child.answer() for _ in range(3)]
    child.finish()
    assert child.proc.exitcode == 0
    rel = here.rel()
    assert cam.counts == here.counts == {rel: 15}
    assert (tmp_path / "child" / rel).read_bytes() == (tmp_path / "here" / rel).read_bytes()
    for (v1, s1), (v2, s2) in zip(want, got):
        assert v1 == v2
        assert s1.keys() == s2.keys()
        for k in s1:
            assert s1[k].dtype == s2[k].dtype and s1[k].tobytes() == s2[k].tobytes()


def decode_image_rgb(blob: bytes) -> np.ndarray:
    return decode_image(blob, 3, "the test's source: episode ep2")


def test_an_image_that_does_not_decode_raises_its_source_error(tmp_path: Path) -> None:
    child = CameraProcess(Camera(FEATURE), tmp_path, 15, 1e12)
    try:
        bad = EncodedImages([b"\x89PNG\r\n\x1a\n not a png"], "png", decode_image_rgb)
        child.send_images(bad, "rgb", "ep0", 1)
        with pytest.raises(SourceError, match="episode ep2: an image does not decode"):
            child.answer()
    finally:
        child.stop()


def test_a_killed_child_is_one_clear_error(tmp_path: Path) -> None:
    child = CameraProcess(Camera(FEATURE), tmp_path, 15, 1e12)
    child.proc.kill()
    child.proc.join()
    with pytest.raises(DatasetError, match="the encoding process ended .exit code -9"):
        child.send_images(ArrayImages(_episodes()[0]), "rgb", "ep0", 5)
        child.answer()
    child.stop()
    assert not child.proc.is_alive()


def test_an_mp4_ends_at_max_file_frames(tmp_path: Path, monkeypatch) -> None:
    """The mp4 muxer keeps an index entry per frame until the file closes: a file takes no new
    episode past ``MAX_FILE_FRAMES`` frames, whatever its bytes; each file closed is read back
    without PyAV's demuxer (whose sample index grows with the frames)."""
    import episodekit.core.video as video
    from episodekit.writers import camera_encoder

    monkeypatch.setattr(camera_encoder, "MAX_FILE_FRAMES", 6)
    monkeypatch.setattr(video, "probe", None)  # the read-back must not need it
    cam = Camera(FEATURE)
    got = [encode_episode(cam, ep, tmp_path, 15, 1e12)[0] for ep in _episodes()]
    assert [v[:2] for v in got] == [(0, 0), (0, 0), (0, 1)]  # 5 + 1 frames, then 9
    assert camera_encoder._close(cam, tmp_path) == (cam.rel(), 9)
    assert cam.counts == {"videos/observation.images.top/chunk-000/file-000.mp4": 6, cam.rel(): 9}


def test_the_child_reads_back_every_mp4_it_closes(tmp_path: Path) -> None:
    """Files rolled over between checkpoints (here: every episode, a 1-byte limit) are read
    back by the child as it closes them, not left to the sink's final check."""
    cam = Camera(FEATURE)
    child = CameraProcess(cam, tmp_path, 15, 1)
    try:
        for i, ep in enumerate(_episodes()):
            child.send(ep, "rgb", f"ep{i}")
            child.answer()
        child.finish()
    finally:
        child.stop()
    assert cam.counts == {
        f"videos/{FEATURE.name}/chunk-000/file-00{i}.mp4": n for i, n in enumerate((5, 1, 9))
    }
    assert child.checked == set(cam.counts)
