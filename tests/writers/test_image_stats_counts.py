"""LeRobot's per-episode image stats from per-channel value counts and float32 cumsums
(``metadata.lerobot_image_stats``) are bit for bit those of the float32 path
(``lerobot_stats.episode_stats`` on every pixel, histograms of the pixels themselves)."""

from __future__ import annotations

import numpy as np
import pytest

from episodekit.metadata.lerobot_image_stats import _image_stats, lerobot_image_stats


def _frames() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    out = [
        rng.integers(0, 256, (20, 64, 64, 3)),  # sums past 2**24: float32 rounding matters
        np.full((100, 120, 160, 3), 255),  # every partial sum rounded
        rng.integers(250, 256, (7, 33, 17, 3)),
        np.clip(rng.normal(128, 30, (12, 48, 40, 3)), 0, 255),
        np.zeros((1, 1, 2, 3)),  # two pixels: the smallest the counts take
        np.full((3, 5, 5, 3), 9),  # one value: min == max
        np.concatenate(  # one channel of one value beside two of many: linspace's step 0
            [np.full((4, 16, 16, 1), 255), rng.integers(0, 256, (4, 16, 16, 2))], axis=-1
        ),
    ]
    for _ in range(30):
        n, h, w = (int(x) for x in rng.integers(1, 40, 3))
        out.append(rng.integers(int(rng.integers(0, 200)), 256, (n, h, w, 3)))
    return [f.astype(np.uint8) for f in out]


@pytest.mark.parametrize("frames", _frames(), ids=lambda f: "x".join(map(str, f.shape)))
def test_counts_give_the_float32_paths_bits(frames: np.ndarray) -> None:
    want = _image_stats(frames.reshape(-1, 3).astype(np.float32), len(frames), 3)
    got = lerobot_image_stats(frames)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert got[k].tobytes() == want[k].tobytes(), (k, got[k].ravel(), want[k].ravel())


def test_one_pixel_and_other_dtypes_take_the_float32_path() -> None:
    one = np.array([[[[10, 20, 30]]]], dtype=np.uint8)
    assert lerobot_image_stats(one)["mean"].ravel().tolist() == pytest.approx(
        [10 / 255, 20 / 255, 30 / 255]
    )
    wide = np.arange(24, dtype=np.uint16).reshape(2, 2, 2, 3)
    got = lerobot_image_stats(wide)
    want = _image_stats(wide.reshape(-1, 3).astype(np.float32), 2, 3)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
