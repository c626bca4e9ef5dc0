"""Issue 37: the stats of a frame cut cost only the cut episodes. Their rows are reduced while
the writer streams them (no stats pass over the output), the kept whole episodes keep their
source's per-episode stats, image/video stats are computed from the cut episodes' sampled frames
only, and the dataset quantiles come from sketches (reused or streamed) within the bound."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import episodekit.metadata.image_stats as image_stats
import episodekit.metadata.stats as stats_pkg
from episodekit.core.dataset import open_dataset
from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, feature_values
from episodekit.metadata.stats.episode_sketch import read_episode_sketches
from episodekit.writers import stats_quantiles
from episodekit.writers.edit import EditSpec, edit
from episodekit.writers.frames import parse_frame_spec
from episodekit.writers.sources import episode_meta

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CUT = {3: (11, 21), 9: (40, 47)}  # episode: [start, end) dropped
SPEC = "3:11-20,9:40-46"


def _no_stats_pass(*args, **kwargs):
    raise AssertionError("a stats pass over the output ran")


@pytest.fixture
def no_stats_pass(monkeypatch):
    monkeypatch.setattr(stats_pkg, "compute_stats", _no_stats_pass)
    monkeypatch.setattr(stats_quantiles, "compute_stats", _no_stats_pass)


def _rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    return pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)


def _episode_row(root: Path, e: int) -> dict:
    return episode_meta(open_dataset(str(root))).slice(e, 1).to_pylist()[0]


def test_a_cut_of_a_lerobot_recording_reads_no_stats_pass(no_stats_pass, tmp_path):
    """rec40 has no sketches: only the cut episodes are reduced while it streams (their stats
    exact over the kept rows), the others' stats are the source's, the dataset quantiles exact
    (counted while streaming, selected in one pass over the output) and no sidecar is written."""
    src = tmp_path / "rec40"
    shutil.copytree(FIXTURES / "rec40", src)
    r = edit(str(src), tmp_path / "out", EditSpec(drop_frames=parse_frame_spec(SPEC)))
    assert r.write.stats.startswith("computed while writing (2 episodes cut inside)")
    out = tmp_path / "out"
    table = _rows(out)
    ep = table["episode_index"].to_numpy()
    act = feature_values(table["action"], 14, "action").astype(np.float64)
    for e in CUT:
        x, row = act[ep == e], _episode_row(out, e)
        np.testing.assert_array_equal(row["stats/action/min"], x.min(0))
        np.testing.assert_array_equal(row["stats/action/max"], x.max(0))
        np.testing.assert_allclose(row["stats/action/std"], x.std(0), rtol=1e-9)
        for key, q in zip(QUANTILE_KEYS, QUANTILES):
            np.testing.assert_allclose(row[f"stats/action/{key}"], np.quantile(x, q, axis=0))
        assert row["stats/action/count"] == [len(x)]
        assert row["stats/frame_index/max"] == [len(x) - 1]
    for e in (0, 5, 39):  # whole episodes: LeRobot's own stats, carried over
        mine, theirs = _episode_row(out, e), _episode_row(src, e)
        for key in ("min", "max", "mean", "std", "count", *QUANTILE_KEYS):
            assert mine[f"stats/action/{key}"] == theirs[f"stats/action/{key}"], key
    stats = json.loads((out / "meta/stats.json").read_text())
    n = len(act)
    assert stats["action"]["count"] == [n]
    # the whole episodes' means and stds are LeRobot's (float32 sums): merged, close to the data's
    np.testing.assert_allclose(stats["action"]["mean"], act.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats["action"]["std"], act.std(0), rtol=1e-5)
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        np.testing.assert_array_equal(stats["action"][key], np.quantile(act, q, axis=0))
    assert read_episode_sketches(open_dataset(str(out))) is None


def test_a_cut_of_a_sketched_source_reuses_the_kept_episodes_sketches(tmp_path, monkeypatch):
    """With fresh sketches in the source, only the cut episodes and the renumbered columns are
    reduced while streaming; every other episode's sketch is the source's."""
    from episodekit.metadata.stats import compute_stats, write_stats
    from episodekit.writers import stream_stats

    src = tmp_path / "rec40"
    shutil.copytree(FIXTURES / "rec40", src)
    write_stats(compute_stats(str(src)), str(src))
    before = read_episode_sketches(open_dataset(str(src)))
    reduced: dict[str, set[int]] = {}
    real = stream_stats.StreamedStats.add

    def add(self, group):
        ep = group.column("episode_index").to_numpy()
        for name in self.want.features:
            reduced.setdefault(name, set()).update(ep[self.want.want[name][ep]].tolist())
        return real(self, group)

    monkeypatch.setattr(stream_stats.StreamedStats, "add", add)
    monkeypatch.setattr(stats_pkg, "compute_stats", _no_stats_pass)
    monkeypatch.setattr(stats_quantiles, "compute_stats", _no_stats_pass)
    edit(str(src), tmp_path / "out", EditSpec(drop_frames=parse_frame_spec(SPEC)))
    assert reduced["action"] == set(CUT) and reduced["observation.state"] == set(CUT)
    assert reduced["index"] == reduced["task_index"] == set(range(40))
    after = read_episode_sketches(open_dataset(str(tmp_path / "out")))
    whole = [e for e in range(40) if e not in CUT]
    np.testing.assert_array_equal(
        after.select(np.array(whole)).points["action"],
        before.select(np.array(whole)).points["action"],
    )


def test_a_video_cut_samples_only_the_cut_episodes_frames(no_stats_pass, tmp_path, monkeypatch):
    """vid24: the image stats of the cut episode come from its own sampled frames (count: the
    samples of its new length); the other episodes keep the source's."""
    src = tmp_path / "vid24"
    shutil.copytree(FIXTURES / "vid24", src)
    asked: list = []
    real = image_stats.compute_image_stats

    def spy(ds, *args, **kwargs):
        asked.append(kwargs.get("episodes"))
        return real(ds, *args, **kwargs)

    monkeypatch.setattr(image_stats, "compute_image_stats", spy)
    ds = open_dataset(str(src))
    key = ds.video_keys[0]
    edit(str(src), tmp_path / "out", EditSpec(drop_frames=parse_frame_spec("2:5-14")))
    assert len(asked) == 1 and asked[0].tolist() == [2]
    out = tmp_path / "out"
    n = int(open_dataset(str(out)).column("length")[2])
    cut = _episode_row(out, 2)
    assert cut[f"stats/{key}/count"] == [len(image_stats.sample_indices(n))]
    assert cut[f"stats/{key}/mean"] != _episode_row(src, 2)[f"stats/{key}/mean"]
    for e in (0, 1, 3, 23):
        mine, theirs = _episode_row(out, e), _episode_row(src, e)
        for k in ("min", "max", "mean", "std", "count", "q50"):
            assert mine[f"stats/{key}/{k}"] == theirs[f"stats/{key}/{k}"], (e, k)
    stats = json.loads((out / "meta/stats.json").read_text())
    assert np.asarray(stats[key]["mean"]).shape == (3, 1, 1)
