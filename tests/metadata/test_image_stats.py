"""Image/video stats (``metadata stats --images``): LeRobot's sampling and shapes, values by hand
with numpy over the sampled (decoded) frames, existing image stats kept without ``--images``,
one clear line when a decoder is missing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from episodekit.core.errors import EnvironmentProblem
from episodekit.metadata.image_stats import (
    downsample_step,
    estimate_num_samples,
    pixel_histogram,
    sample_indices,
    stats_from_histogram,
)
from episodekit.metadata.stats import (
    STAT_KEYS,
    SUMMARY_FILE,
    ensure_stats,
    load_lerobot_stats,
    read_summary_meta,
)

pytest.importorskip("PIL", reason="Pillow is not installed (pip install 'episodekit[images]')")

CAM = "observation.images.cam0"
WRIST = "observation.images.wrist"
# Episodes of ~150 frames: LeRobot samples 100 of them (sample_indices), so sampling is exercised.
VIDEO_SPEC = dict(episodes=3, tasks=1, seed=3, mean_length=150, videos=1)
IMAGE_SPEC = dict(episodes=4, tasks=2, seed=5, mean_length=12, images=True)
QS = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
NO_AV = "import sys; sys.modules['av'] = None; from episodekit.cli import main; main()"
NO_PIL = "import sys; sys.modules['PIL'] = None; from episodekit.cli import main; main()"


def _episodes(root: Path):
    return pq.read_table(sorted(root.glob("meta/episodes/*/*.parquet"))[0])


def _by_hand(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """Per-channel stats of (N, H, W, 3) uint8 frames with plain numpy, LeRobot's keys."""
    x = pixels.reshape(-1, 3).astype(np.float64) / 255.0
    out = {
        "min": x.min(0),
        "max": x.max(0),
        "mean": x.mean(0),
        "std": x.std(0),
    }
    out.update({k: np.quantile(x, q, axis=0) for k, q in QS.items()})
    return out


def test_sampling_is_lerobots():
    # the figures of LeRobot's estimate_num_samples docstring (its "~500 -> 100" is 105)
    assert [estimate_num_samples(n) for n in (1, 50, 400, 500, 1000, 2000, 5000, 10000, 20000)] == [
        1, 50, 100, 105, 177, 299, 594, 1000, 1681
    ]  # fmt: skip
    assert sample_indices(10).tolist() == list(range(10))
    idx = sample_indices(1000)
    assert len(idx) == 177 and idx[0] == 0 and idx[-1] == 999
    assert np.array_equal(idx, np.round(np.linspace(0, 999, 177)).astype(int))
    assert (downsample_step(48, 64), downsample_step(299, 299)) == (1, 1)
    assert (downsample_step(480, 640), downsample_step(300, 200)) == (4, 2)


def test_histogram_stats_equal_numpy_over_the_pixels():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(7, 20, 30, 3), dtype=np.uint8)
    frames[..., 2] //= 4  # a channel with another range
    got = stats_from_histogram(pixel_histogram(frames))
    want = _by_hand(frames)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-12, atol=1e-15, err_msg=k)
    big = rng.integers(0, 256, size=(2, 480, 640, 3), dtype=np.uint8)
    np.testing.assert_array_equal(pixel_histogram(big), pixel_histogram(big[:, ::4, ::4]))


def test_video_stats_by_hand_over_the_sampled_frames(make_sample):
    from episodekit.core.dataset import open_dataset
    from episodekit.loaders.video import decode_episode

    root = make_sample(**VIDEO_SPEC)
    res, status = ensure_stats(root, images=True, jobs=1)
    assert status == "written" and res.images is not None
    ds = open_dataset(str(root))
    eps = _episodes(root)
    stamp = {}
    for rel in ds.data_files:
        data = pq.read_table(root / rel, columns=["index", "timestamp"])
        stamp.update(zip(data["index"].to_pylist(), data["timestamp"].to_pylist()))
    all_frames = []
    subsampled = 0
    for r in range(eps.num_rows):
        length = eps["length"][r].as_py()
        picks = sample_indices(length)
        assert len(picks) == estimate_num_samples(length)
        subsampled += len(picks) < length
        start = eps["dataset_from_index"][r].as_py()
        chunk = eps[f"videos/{CAM}/chunk_index"][r].as_py()
        fidx = eps[f"videos/{CAM}/file_index"][r].as_py()
        path = root / ds.video_path(CAM, chunk, fidx)
        t0 = eps[f"videos/{CAM}/from_timestamp"][r].as_py()
        seconds = [t0 + stamp[start + int(p)] for p in picks]
        frames = decode_episode(str(path), seconds)
        assert frames.shape == (len(picks), 48, 64, 3)
        all_frames.append(frames)
        want = _by_hand(frames)
        for k, v in want.items():
            got = np.array(eps[f"stats/{CAM}/{k}"][r].as_py())
            assert got.shape == (3, 1, 1)
            np.testing.assert_allclose(got[:, 0, 0], v, rtol=1e-9, atol=1e-12, err_msg=k)
        assert eps[f"stats/{CAM}/count"][r].as_py() == [len(picks)]
    assert subsampled >= 1  # an episode of >100 frames: 100 sampled
    stats = load_lerobot_stats(root)[CAM]
    want = _by_hand(np.concatenate(all_frames))
    for k, v in want.items():
        assert stats[k].shape == (3, 1, 1)
        np.testing.assert_allclose(stats[k][:, 0, 0], v, rtol=1e-9, atol=1e-12, err_msg=k)
    assert stats["count"].tolist() == [sum(len(f) for f in all_frames)]
    meta = read_summary_meta(root)["images"]
    assert meta["features"] == {CAM: "video"} and meta["sampled_frames"] == stats["count"][0]
    assert "sample_indices" in meta["sampling"]
    assert _stats_findings(root) == []  # shapes, ranges, order, count, merge of the episodes
    # fresh now, with or without images; a forced numeric rewrite keeps the record
    assert ensure_stats(root, images=True)[1] == "fresh"
    ensure_stats(root, force=True, jobs=1)
    assert read_summary_meta(root)["images"] == meta
    assert ensure_stats(root, images=True)[1] == "fresh"


def test_parquet_images_shapes_keys_and_values(make_sample):
    root = make_sample(**IMAGE_SPEC)
    ensure_stats(root, images=True, jobs=1)
    raw = json.loads((root / "meta/stats.json").read_text())
    entry = raw[WRIST]
    assert set(entry) == set(STAT_KEYS)
    frames = int(_episodes(root)["length"].to_numpy().sum())
    assert entry["count"] == [frames]  # episodes < 100 frames: every frame is sampled
    # the sample's 2x2 PNG is (200, 30, 30) everywhere
    colour = np.array([200, 30, 30]) / 255.0
    for k in STAT_KEYS:
        if k == "count":
            continue
        arr = np.array(entry[k])
        assert arr.shape == (3, 1, 1) and arr.dtype == np.float64
        np.testing.assert_allclose(arr[:, 0, 0], 0.0 if k == "std" else colour, err_msg=k)
    eps = _episodes(root)
    assert str(eps.schema.field(f"stats/{WRIST}/mean").type) == (
        "list<element: list<element: list<element: double>>>"
    )
    assert eps[f"stats/{WRIST}/count"].to_pylist() == [[n] for n in eps["length"].to_pylist()]
    # numeric features are untouched by images=True
    assert raw["action"]["count"] == [frames]


def test_existing_image_stats_survive_a_rewrite_without_images(make_sample):
    root = make_sample(**IMAGE_SPEC)
    # 1) the sample's own (flat [3]) per-episode image columns, and a hand-set stats.json entry
    stats_path = root / "meta/stats.json"
    raw = json.loads(stats_path.read_text())
    mine = {k: [[[0.25]], [[0.5]], [[0.75]]] for k in STAT_KEYS if k != "count"}
    raw[WRIST] = {**mine, "count": [3]}
    stats_path.write_text(json.dumps(raw))
    before = {c: _episodes(root)[c].to_pylist() for c in _episodes(root).column_names}
    ensure_stats(root, force=True, jobs=1)
    after_eps = _episodes(root)
    img_cols = [c for c in before if c.startswith(f"stats/{WRIST}/")]
    assert len(img_cols) >= 5
    for c in img_cols:
        assert after_eps[c].to_pylist() == before[c], c
    assert json.loads(stats_path.read_text())[WRIST] == {**mine, "count": [3]}
    # 2) stats written with --images survive a later rewrite without it
    ensure_stats(root, force=True, images=True, jobs=1)
    written = json.loads(stats_path.read_text())[WRIST]
    cols = {c: _episodes(root)[c].to_pylist() for c in img_cols}
    assert written != {**mine, "count": [3]}
    ensure_stats(root, force=True, jobs=1)
    assert json.loads(stats_path.read_text())[WRIST] == written
    assert {c: _episodes(root)[c].to_pylist() for c in img_cols} == cols


def test_without_pyav_images_on_a_video_root_is_one_line_exit_2(make_sample, monkeypatch):
    root = make_sample(**VIDEO_SPEC)
    before = (root / "meta/stats.json").read_bytes()
    p = subprocess.run(
        [sys.executable, "-c", NO_AV, "metadata", "stats", str(root), "--images"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "episodekit[video]" in lines[0], p.stderr
    assert (root / "meta/stats.json").read_bytes() == before
    assert not (root / SUMMARY_FILE).exists()
    # the library says the same (EnvironmentProblem), before any numeric work
    import episodekit.core.video as video

    monkeypatch.setattr(video, "_AV", None)
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(EnvironmentProblem, match=r"episodekit\[video\]"):
        ensure_stats(root, images=True)
    # without --images the video root needs no decoder
    assert ensure_stats(root, jobs=1)[1] == "written"


def test_without_pillow_images_in_parquet_is_one_line_exit_2(make_sample):
    root = make_sample(**IMAGE_SPEC)
    p = subprocess.run(
        [sys.executable, "-c", NO_PIL, "metadata", "stats", str(root), "--images"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "episodekit[images]" in lines[0], p.stderr


def test_cli_images_writes_and_reports(make_sample):
    root = make_sample(**IMAGE_SPEC)
    exe = Path(sys.executable).with_name("episodekit")
    p = subprocess.run(
        [str(exe), "metadata", "stats", str(root), "--images", "--json"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["status"] == "written" and report["images"]["features"] == {WRIST: "image"}
    assert np.array(load_lerobot_stats(root)[WRIST]["mean"]).shape == (3, 1, 1)


def test_cli_image_path_leaving_the_root_names_the_file_exit_2(make_sample):
    """A path-only image row pointing out of the root (hub data is untrusted) is refused in one
    line naming the data file, the feature and the row."""
    import pyarrow as pa

    root = make_sample(**IMAGE_SPEC)
    f = sorted((root / "data").rglob("*.parquet"))[0]
    t = pq.read_table(f)
    vals = t.column(WRIST).to_pylist()
    vals[0] = {"bytes": None, "path": "../../../../etc/hostname"}
    i = t.column_names.index(WRIST)
    pq.write_table(t.set_column(i, WRIST, pa.array(vals, type=t.schema.field(WRIST).type)), f)
    exe = Path(sys.executable).with_name("episodekit")
    p = subprocess.run(
        [str(exe), "metadata", "stats", str(root), "--images", "-j", "1"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, p.stderr
    index0 = t.column("index")[0].as_py()
    assert p.stderr.strip() == (
        f"Error: {f}: {WRIST} (index {index0}): path '../../../../etc/hostname' leaves the root"
    )


def _stats_findings(root: Path) -> list:
    from episodekit.validate.runner import validate

    return [f for f in validate(str(root), checks="stats").findings if f.severity == "error"]


def test_validate_accepts_image_stats_and_catches_bad_ones(make_sample):
    root = make_sample(**IMAGE_SPEC)
    assert _stats_findings(root) == []  # the sample's own image columns (flat [3]) pass
    ensure_stats(root, images=True, jobs=1)
    assert _stats_findings(root) == []
    stats_path = root / "meta/stats.json"
    good = json.loads(stats_path.read_text())

    def with_entry(**change) -> list:
        bad = json.loads(json.dumps(good))
        bad[WRIST].update(change)
        stats_path.write_text(json.dumps(bad))
        return sorted({f.check for f in _stats_findings(root)})

    assert with_entry(mean=[0.5, 0.5, 0.5]) == ["stats.shape"]  # LeRobot needs (3, 1, 1)
    # outside [0, 1] (and no longer the merge of the episodes' max)
    assert with_entry(max=[[[1.5]], [[1.0]], [[1.0]]]) == ["stats.consistent", "stats.order"]
    assert with_entry(q01=[[[0.9]], [[0.1]], [[0.1]]]) == ["stats.order"]  # q01 > q10
    # not LeRobot's sampled frames (nor the episodes' sum)
    assert with_entry(count=[5]) == ["stats.consistent", "stats.count"]
    assert with_entry(std=[[[float("nan")]], [[0.0]], [[0.0]]]) == ["stats.finite"]
    stats_path.write_text(json.dumps(good))
    # a per-episode image value out of range, and a column of the wrong shape
    f = sorted(root.glob("meta/episodes/*/*.parquet"))[0]
    t = pq.read_table(f)
    import pyarrow as pa

    c = f"stats/{WRIST}/q90"  # not part of the merge check: only order and range fire
    vals = t[c].to_pylist()
    vals[1] = [[[2.0]], [[0.5]], [[0.5]]]
    pq.write_table(t.set_column(t.column_names.index(c), c, pa.array(vals)), f)
    found = _stats_findings(root)
    assert {x.check for x in found} == {"stats.order"} and found[0].episode is not None
    assert any("outside [0, 1]" in x.message for x in found)
    vals[1] = [[[1.0, 1.0]], [[0.5]], [[0.5]]]
    pq.write_table(t.set_column(t.column_names.index(c), c, pa.array(vals)), f)
    assert [x.check for x in _stats_findings(root)] == ["stats.shape"]


def test_validate_image_stats_consistent_with_their_episodes(make_sample):
    root = make_sample(**IMAGE_SPEC)
    ensure_stats(root, images=True, jobs=1)
    stats_path = root / "meta/stats.json"
    raw = json.loads(stats_path.read_text())
    raw[WRIST]["std"] = [[[0.1]], [[0.0]], [[0.0]]]  # the episodes' are 0 (one colour)
    stats_path.write_text(json.dumps(raw))
    found = _stats_findings(root)
    assert [f.check for f in found] == ["stats.consistent"] and "std" in found[0].message
