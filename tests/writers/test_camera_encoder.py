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
