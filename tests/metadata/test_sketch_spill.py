"""The stats pass's per-episode sketches go to disk as the data files' results arrive (memory:
one file's points, not every episode's), come back in episode order whatever order the files
finished in, publish as the sidecar, and a version-1 sidecar (one packed column per feature)
is still read."""

from __future__ import annotations

import gc
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import DatasetError, open_dataset
from episodekit.metadata.stats import compute_stats, feature_values, numeric_features
from episodekit.metadata.stats.episode_sketch import (
    SKETCHES_FILE,
    SKETCHES_KEY,
    EpisodeSketches,
    _layout,
    read_episode_sketches,
    sketch_ranks,
    write_sketches,
)
from episodekit.metadata.stats.sketch_spill import SketchSpill, SpilledSketches


def _expected(root, points: int) -> dict[str, np.ndarray]:
    """Each feature's points computed here from the data: every episode's sorted values at
    the ranks :func:`sketch_ranks` names, episode after episode."""
    ds = open_dataset(str(root))
    table = pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)
    ep = table["episode_index"].to_numpy()
    out = {}
    for name, dims in numeric_features(ds.info).items():
        x = feature_values(table[name], dims, name)
        cols = []
        for e in np.unique(ep):
            v = np.sort(x[ep == e], axis=0)
            ranks, _ = sketch_ranks(np.array([len(v)]), points)
            cols.append(v[ranks].T)
        out[name] = np.concatenate(cols, axis=1)
    return out


@pytest.fixture
def multi_file_root(make_sample):
    root = make_sample(episodes=12, tasks=3, seed=3, data_files_size_in_mb=0.2)
    assert len(open_dataset(str(root)).data_files) > 1
    return root


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_pass_spills_the_sketches_and_they_are_the_episodes_order_statistics(
    multi_file_root, tmp_path, jobs
):
    spill = tmp_path / "spill"
    spill.mkdir()
    res = compute_stats(multi_file_root, jobs=jobs, spill_dir=str(spill))
    assert isinstance(res.sketches, SpilledSketches)  # on disk, not held in memory
    assert res.sketches.path.startswith(str(spill))
    ds = open_dataset(str(multi_file_root))
    np.testing.assert_array_equal(res.sketches.episode_index, np.sort(ds.column("episode_index")))
    loaded = res.sketches.load()
    for name, pts in _expected(multi_file_root, res.sketches.points_per_episode).items():
        np.testing.assert_array_equal(loaded.points[name], pts.astype(loaded.points[name].dtype))
    folder = res.sketches._owner.name
    del res, loaded
    gc.collect()
    assert not any(spill.iterdir()), f"left behind: {folder}"


def test_a_failed_pass_leaves_no_spill(multi_file_root, tmp_path):
    ds = open_dataset(str(multi_file_root))
    (multi_file_root / ds.data_files[-1]).write_bytes(b"not parquet")
    spill = tmp_path / "spill"
    spill.mkdir()
    with pytest.raises(DatasetError):
        compute_stats(multi_file_root, jobs=1, spill_dir=str(spill))
    assert not any(spill.iterdir())


def _parts() -> list[EpisodeSketches]:
    rng = np.random.default_rng(0)
    lengths = np.array([5, 40, 1, 17, 9, 30])
    k = np.minimum(lengths, 8)
    pts = np.sort(rng.standard_normal((2, int(k.sum()))).astype(np.float32), axis=1)
    whole = EpisodeSketches(np.arange(6) * 2, lengths, {"x": pts}, 8)
    return [whole.select(np.array(r)) for r in ([4, 5], [0, 1, 2], [3])]


@pytest.mark.parametrize("order", [[1, 2, 0], [2, 0, 1]])
def test_files_finishing_out_of_order_come_back_in_episode_order(tmp_path, order):
    parts = _parts()
    info = {"features": {"x": {"dtype": "float32", "shape": [2]}}}
    with SketchSpill({"x": 2}, info, {"fingerprint": "f"}, 8, str(tmp_path)) as spill:
        for i in order:
            spill.add(parts[i])
        got = spill.finish()
    want = _parts()[1].points["x"], _parts()[2].points["x"], _parts()[0].points["x"]
    np.testing.assert_array_equal(got.episode_index, np.arange(6) * 2)
    np.testing.assert_array_equal(got.load().points["x"], np.concatenate(want, axis=1))


def test_the_published_sidecar_has_the_same_bytes_whatever_order_files_finished(tmp_path):
    """Files finishing in another order (more jobs, Ray) must not change the sidecar's bytes:
    the in-order spill is published as it is, an out-of-order one is rewritten in order (its
    lists once came back with another child name: 12 bytes more, and prepare on Ray differed
    from local)."""
    info = {"features": {"x": {"dtype": "float32", "shape": [2]}}}
    published = []
    for n, order in enumerate(([1, 2, 0], [0, 1, 2], [2, 0, 1])):
        with SketchSpill({"x": 2}, info, {"fingerprint": "f"}, 8, str(tmp_path)) as spill:
            for i in order:
                spill.add(_parts()[i])
            got = spill.finish()
        dest = tmp_path / f"sidecar{n}.parquet"
        got.write(dest, {"fingerprint": "f"})
        published.append(dest.read_bytes())
    assert published[0] == published[1] == published[2]


def test_episodes_interleaved_between_files_are_sorted(tmp_path):
    parts = _parts()
    info = {"features": {"x": {"dtype": "float32", "shape": [2]}}}
    a = parts[1].select(np.array([0, 2]))  # episodes 0 and 4 in one file
    b = parts[1].select(np.array([1]))  # episode 2 in another
    with SketchSpill({"x": 2}, info, {"fingerprint": "f"}, 8, str(tmp_path)) as spill:
        spill.add(a)
        spill.add(b)
        got = spill.finish()
    np.testing.assert_array_equal(got.episode_index, [0, 2, 4])
    np.testing.assert_array_equal(got.load().points["x"], parts[1].points["x"])


def test_published_sidecar_is_the_same_from_spill_or_memory(multi_file_root, tmp_path):
    res = compute_stats(multi_file_root, jobs=1)
    ds = open_dataset(str(multi_file_root))
    meta = {"fingerprint": res.fingerprint, "data_state": res.state}
    other = tmp_path / "other"
    shutil.copytree(multi_file_root, other)
    write_sketches(multi_file_root, res.sketches, res.info, meta)  # the spilled file, copied
    write_sketches(other, res.sketches.load(), res.info, meta)  # from memory
    a = read_episode_sketches(ds)
    b = read_episode_sketches(open_dataset(str(other)))
    for n in a.points:
        np.testing.assert_array_equal(a.points[n], b.points[n])
    # other metadata than the spill recorded: rewritten row group by row group
    write_sketches(multi_file_root, res.sketches, res.info, {**meta, "stats": "quantiles"})
    schema = pq.read_schema(multi_file_root / SKETCHES_FILE)
    assert json.loads(schema.metadata[SKETCHES_KEY])["stats"] == "quantiles"
    c = read_episode_sketches(ds)
    for n in a.points:
        np.testing.assert_array_equal(c.points[n], a.points[n])
    write_sketches(multi_file_root, res.sketches, res.info, meta)  # linked (same file system)
    del res
    gc.collect()  # the spill folder goes: the published sidecar stays whole
    d = read_episode_sketches(ds)
    for n in a.points:
        np.testing.assert_array_equal(d.points[n], a.points[n])


def test_a_version_1_sidecar_is_still_read(multi_file_root):
    """Version 1 (last release) stored one ``points/{feature}`` list per feature, each
    episode's ``(D, k)`` points dimension-major."""
    res = compute_stats(multi_file_root, jobs=1)
    ds = open_dataset(str(multi_file_root))
    sk = res.sketches.load()
    k = np.minimum(sk.length, sk.points_per_episode)
    start = np.cumsum(k) - k
    cols = {"episode_index": pa.array(sk.episode_index), "length": pa.array(sk.length)}
    for n, pts in sk.points.items():
        flat = pts.reshape(-1)[_layout(start, k, pts.shape[0], pts.shape[1])]
        offsets = pa.array(np.r_[0, np.cumsum(k * pts.shape[0])].astype(np.int32))
        cols[f"points/{n}"] = pa.ListArray.from_arrays(offsets, pa.array(flat))
    record = {
        "version": 1,
        "points": sk.points_per_episode,
        "features": {n: int(p.shape[0]) for n, p in sk.points.items()},
        "fingerprint": ds.fingerprint,
    }
    table = pa.table(cols).replace_schema_metadata({SKETCHES_KEY: json.dumps(record)})
    pq.write_table(table, multi_file_root / SKETCHES_FILE)
    back = read_episode_sketches(ds)
    for n, pts in sk.points.items():
        np.testing.assert_array_equal(back.points[n], pts)


def test_the_spill_keeps_no_view_of_a_files_result(tmp_path):
    """With Ray a file's result is one object in the store, mapped by the driver; a view of its
    episode indices kept until the end of the pass kept every file's result resident (the
    driver's memory grew with the frames: 447 -> 797 MiB at 2M -> 8M frames)."""
    result = {"episodes": np.arange(6, dtype=np.int64) * 2, "count": np.full(6, 3, np.int64)}
    pts = np.zeros((2, 18), np.float32)
    part = EpisodeSketches(result["episodes"][:6], result["count"][:6], {"x": pts}, 8)
    info = {"features": {"x": {"dtype": "float32", "shape": [2]}}}
    with SketchSpill({"x": 2}, info, {"fingerprint": "f"}, 8, str(tmp_path)) as spill:
        spill.add(part)
        for kept in (*spill.episode_index, *spill.length):
            assert not np.shares_memory(kept, result["episodes"])
            assert not np.shares_memory(kept, result["count"])
        spill.finish()
