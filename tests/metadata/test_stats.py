"""Normalization statistics: values (by hand and against numpy), LeRobot layout, merging,
freshness, read-only roots, and the ``stats.*`` validation checks with their clean twins."""

from __future__ import annotations

import errno
import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core import atomic
from episodekit.core.dataset import DatasetError
from episodekit.metadata.stats import (
    QUANTILE_KEYS,
    QUANTILES,
    STAT_KEYS,
    STATS_FILE,
    SUMMARY_FILE,
    FeatureStats,
    Sketch,
    compute_stats,
    ensure_stats,
    load_lerobot_stats,
    merge_stats,
    read_summary_meta,
    refine_quantiles,
)
from episodekit.validate.runner import validate

STATS_CHECKS = "stats"


def _data_files(root: Path) -> list[Path]:
    return sorted((root / "data").rglob("*.parquet"))


def _set_action(root: Path, fn) -> None:
    """Rewrite every data file's action column with ``fn(episode_index, frame_index) -> (n, D)``
    (float32), keeping the schema and its metadata."""
    for path in _data_files(root):
        t = pq.read_table(path)
        ep = t["episode_index"].to_numpy()
        fi = t["frame_index"].to_numpy()
        d = t.schema.field("action").type.list_size
        values = np.asarray(fn(ep, fi, d), dtype=np.float32).reshape(-1)
        arr = pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), d)
        t = t.set_column(t.schema.get_field_index("action"), t.schema.field("action"), arr)
        pq.write_table(t, path)


def _column(root: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    t = pq.read_table(_data_files(root))
    col = t[name].combine_chunks()
    values = col.values.to_numpy() if pa.types.is_fixed_size_list(col.type) else col.to_numpy()
    return t["episode_index"].to_numpy(), values.reshape(t.num_rows, -1).astype(np.float64)


def _stats_errors(root: Path, deep: bool = False) -> set[str]:
    report = validate(str(root), checks=STATS_CHECKS, deep=deep)
    return {f.check for f in report.errors}


@pytest.fixture
def root(make_sample) -> Path:
    return make_sample(episodes=12, tasks=3, seed=3, data_files_size_in_mb=0.2)


# --------------------------------------------------------------------------------------------
# Values


def test_hand_computed_tiny_dataset(root):
    # dim 0 = frame_index (0..L-1), dim 1 = 2.0, dim 2 = episode_index: stats known in closed form
    def fn(ep, fi, d):
        out = np.zeros((len(ep), d))
        out[:, 0], out[:, 1], out[:, 2] = fi, 2.0, ep
        return out

    _set_action(root, fn)
    res = compute_stats(root, jobs=1)
    ep = res.episode_index
    length = res.episode_count.astype(np.float64)
    a = res.episode["action"]
    np.testing.assert_array_equal(a["min"][:, 0], 0)
    np.testing.assert_array_equal(a["max"][:, 0], length - 1)
    np.testing.assert_allclose(a["mean"][:, 0], (length - 1) / 2)
    np.testing.assert_allclose(a["std"][:, 0], np.sqrt((length**2 - 1) / 12))
    for key, q in zip(QUANTILE_KEYS, QUANTILES):
        np.testing.assert_allclose(a[key][:, 0], q * (length - 1))  # linear rule on 0..L-1
        np.testing.assert_array_equal(a[key][:, 1], 2.0)
        np.testing.assert_array_equal(a[key][:, 2], ep)
    np.testing.assert_array_equal(a["std"][:, 1], 0.0)
    # dataset: dim 2 takes value e with multiplicity L_e
    total = length.sum()
    d = res.dataset["action"]
    assert d.count == total
    assert d.mean[2] == pytest.approx((ep * length).sum() / total)
    assert d.std[2] == pytest.approx(np.sqrt(((ep - d.mean[2]) ** 2 * length).sum() / total))
    assert (d.min[0], d.max[0]) == (0.0, length.max() - 1)
    assert d.to_lerobot()["count"] == [int(total)]
    assert d.to_lerobot()["q50"][1] == 2.0


@pytest.mark.parametrize("style", ["recorded", "edited"])
@pytest.mark.parametrize("batch_rows", [97, 131072])
def test_exact_quantiles_equal_numpy(make_sample, style, batch_rows):
    """Episodes cut across record batches and row groups; every value equals numpy's."""
    root = make_sample(episodes=15, tasks=3, seed=5, style=style, data_files_size_in_mb=0.3)
    res = compute_stats(root, jobs=2, batch_rows=batch_rows, sketch_points=16)
    assert set(res.mode.values()) == {"exact"}
    for name in ("action", "timestamp", "index", "task_index"):
        ep, x = _column(root, name)
        d = res.dataset[name]
        np.testing.assert_array_equal(d.quantiles, np.quantile(x, QUANTILES, axis=0))
        np.testing.assert_allclose(d.mean, x.mean(0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(d.std, x.std(0), rtol=1e-9, atol=1e-12)
        for e in (0, 7, 14):
            xe = x[ep == e]
            i = int(np.searchsorted(res.episode_index, e))
            got = np.stack([res.episode[name][k][i] for k in QUANTILE_KEYS])
            np.testing.assert_array_equal(got, np.quantile(xe, QUANTILES, axis=0))
            np.testing.assert_allclose(res.episode[name]["std"][i], xe.std(0), atol=1e-12)
            assert res.episode_count[i] == len(xe)


@pytest.mark.parametrize("batch_rows", [53, None])
def test_presorted_tied_and_random_dimensions_mixed(make_sample, batch_rows):
    """Dimensions sorted inside episodes (read in place), heavily tied (run-length encoded
    runs: ties straddle the quantile brackets), descending and random in one feature; a NaN-free
    column with every kind still equals numpy per episode and for the dataset."""

    def fn(ep, fi, d):
        rng = np.random.default_rng(11)
        out = rng.standard_normal((len(ep), d))
        out[:, 0] = fi * 0.5  # ascending inside every episode
        out[:, 1] = np.round(rng.random(len(ep)) * 3)  # 4 distinct values
        out[:, 2] = -fi  # descending inside every episode
        out[:, 3] = ep  # constant per episode, ascending over the file
        out[:, 4] = 7.0  # constant
        return out

    root = make_sample(episodes=15, tasks=3, seed=5, style="edited", data_files_size_in_mb=0.3)
    _set_action(root, fn)
    res = compute_stats(root, jobs=1, batch_rows=batch_rows, sketch_points=16)
    ep, x = _column(root, "action")
    d = res.dataset["action"]
    np.testing.assert_array_equal(d.quantiles, np.quantile(x, QUANTILES, axis=0))
    np.testing.assert_array_equal(d.min, x.min(0))
    np.testing.assert_array_equal(d.max, x.max(0))
    for i, e in enumerate(res.episode_index):
        xe = x[ep == e]
        got = np.stack([res.episode["action"][k][i] for k in QUANTILE_KEYS])
        np.testing.assert_array_equal(got, np.quantile(xe, QUANTILES, axis=0))
        np.testing.assert_array_equal(res.episode["action"]["min"][i], xe.min(0))
        np.testing.assert_array_equal(res.episode["action"]["max"][i], xe.max(0))
        np.testing.assert_allclose(res.episode["action"]["mean"][i], xe.mean(0), rtol=1e-12)


def test_spilled_run_searches_match_numpy(tmp_path):
    """The fence + window reads answer exactly what np.searchsorted over the run answers,
    both sides, for keys below, between, equal to (fence values too) and above the values."""
    from episodekit.metadata.stats.spill import FENCE, RunReader, Spill

    rng = np.random.default_rng(0)
    cols = np.sort(
        np.stack(
            [
                rng.standard_normal(3 * FENCE + 17).astype(np.float32),
                np.round(rng.standard_normal(3 * FENCE + 17) * 300).astype(np.float32),
            ]
        ),
        axis=1,
    )
    spill = Spill(str(tmp_path / "runs.bin"))
    runs = spill.add(cols) + spill.add(cols[:, :5])
    spill.close()
    assert [r.counts_offset >= 0 for r in runs] == [False, False, False, False]
    reader = RunReader()
    try:
        for run in runs:
            col = cols[run.dim, : run.length]
            keys = np.r_[col[:: FENCE // 2], col[-1], col[0] - 1, col[-1] + 1, 0.25]
            keys = keys.astype(np.float32)
            for side in ("left", "right"):
                want = np.searchsorted(col, keys, side=side)
                np.testing.assert_array_equal(reader.count(run, keys, side), want)
            np.testing.assert_array_equal(reader.read(run, 3, run.length), col[3:])
    finally:
        reader.close()


def test_tied_runs_are_run_length_encoded(tmp_path):
    from episodekit.metadata.stats.spill import RunReader, Spill

    col = np.sort(np.repeat(np.arange(5, dtype=np.int64), [1, 50, 3, 100, 2]))[None, :]
    spill = Spill(str(tmp_path / "runs.bin"))
    (run,) = spill.add(col)
    spill.close()
    assert run.counts_offset >= 0 and run.length == 5
    reader = RunReader()
    np.testing.assert_array_equal(reader.read(run, 0, 5), np.arange(5))
    np.testing.assert_array_equal(reader.read(run, 0, 5, counts=True), [1, 50, 3, 100, 2])
    reader.close()


def _assert_within(quantiles: np.ndarray, x: np.ndarray, bound: float) -> None:
    """Each quantile's true rank lies within ``bound`` of the one it stands for."""
    n = len(x)
    for j in range(x.shape[1]):
        s = np.sort(x[:, j])
        for i, q in enumerate(QUANTILES):
            v = quantiles[i, j]
            lo, hi = np.searchsorted(s, v, "left"), np.searchsorted(s, v, "right")
            h = (n - 1) * q
            assert lo - 1 - bound <= h <= hi + bound, (j, q)


def test_sketch_mode_within_stated_rank_error(make_sample):
    root = make_sample(episodes=20, tasks=3, seed=6, data_files_size_in_mb=0.3)
    res = compute_stats(root, quantiles="sketch", sketch_points=32, batch_rows=500, jobs=1)
    assert set(res.mode.values()) == {"sketch"}
    _, x = _column(root, "action")
    n = len(x)
    bound = res.rank_error["action"] * n
    assert 0 < bound < n / 10
    _assert_within(res.dataset["action"].quantiles, x, bound)


@pytest.mark.parametrize("quantiles", ["sketch", "exact"])
def test_capped_dataset_summary(make_sample, monkeypatch, quantiles):
    """Past SKETCH_CAP points the merged summary is compacted: at most that many points per
    dimension, its rank error recorded and honoured (sketch), quantiles still exact (exact)."""
    from episodekit.metadata.stats import compute as stats_mod

    monkeypatch.setattr(stats_mod, "SKETCH_CAP", 40)
    root = make_sample(episodes=20, tasks=3, seed=6, data_files_size_in_mb=0.3)
    res = compute_stats(root, quantiles=quantiles, sketch_points=32, batch_rows=500, jobs=1)
    _, x = _column(root, "action")
    assert all(len(sk.values) <= 40 for sk in res.dataset["action"].sketches)
    if quantiles == "exact":
        np.testing.assert_array_equal(
            res.dataset["action"].quantiles, np.quantile(x, QUANTILES, axis=0)
        )
        return
    n = len(x)
    bound = res.rank_error["action"] * n
    assert n / 40 - 1 <= bound < n / 4  # the compaction's error is in the bound
    _assert_within(res.dataset["action"].quantiles, x, bound)


def test_memory_budget_falls_back_to_the_summary(root, caplog):
    with caplog.at_level(logging.WARNING, logger="episodekit.metadata.stats"):
        res = compute_stats(root, memory_mb=1e-3, jobs=1)
    assert set(res.mode.values()) == {"sketch"}
    assert "exceed --memory-mb" in caplog.text


# --------------------------------------------------------------------------------------------
# Merging


def _fs(values: list[float]) -> dict[str, FeatureStats]:
    x = np.asarray(values, dtype=np.float64)
    sk = Sketch(np.sort(x), np.ones(len(x)), 0.0)
    return {
        "f": FeatureStats(
            count=len(x),
            mass=float(len(x)),
            mean=np.array([x.mean()]),
            m2=np.array([((x - x.mean()) ** 2).sum()]),
            min=np.array([x.min()]),
            max=np.array([x.max()]),
            quantiles=np.quantile(x, QUANTILES)[:, None],
            sketches=[sk],
        )
    }


def test_merge_of_halves_equals_whole_by_hand():
    a, b = [0.0, 1.0, 2.0, 3.0], [10.0, 10.0]
    m = merge_stats([_fs(a), _fs(b)])["f"]
    whole = np.array(a + b)
    assert m.count == 6
    assert m.mean[0] == pytest.approx(whole.mean())
    assert m.std[0] == pytest.approx(whole.std())
    np.testing.assert_array_equal(m.quantiles[:, 0], np.quantile(whole, QUANTILES))
    # LeRobot's envelope (min of q<=50, max above) is not the whole's median
    env_q50 = min(np.quantile(a, 0.5), np.quantile(b, 0.5))
    assert env_q50 != np.quantile(whole, 0.5)


def test_weighted_mixture_merge_by_hand():
    # mixture 1:1 of A = {0,1,2,3} and B = {10,10}: mean 0.5*1.5 + 0.5*10 = 5.75;
    # var = 0.5*(1.25 + 4.25^2) + 0.5*(0 + 4.25^2) = 18.6875
    m = merge_stats([_fs([0, 1, 2, 3]), _fs([10, 10])], weights=[1, 1])["f"]
    assert m.count == 6
    assert m.mean[0] == pytest.approx(5.75)
    assert m.std[0] ** 2 == pytest.approx(18.6875)
    assert (m.min[0], m.max[0]) == (0.0, 10.0)
    # mass in frame units: A's points weigh 0.75 each, B's 1.5; q50 -> ranks 2 and 3 of 0..5:
    # first cum >= 3 is the value 3, first cum >= 4 is 10: lerp(3, 10, 0.5) = 6.5
    assert m.quantiles[2, 0] == pytest.approx(6.5)
    # weights 3:1 move the mean towards A
    m31 = merge_stats([_fs([0, 1, 2, 3]), _fs([10, 10])], weights=[3, 1])["f"]
    assert m31.mean[0] == pytest.approx(0.75 * 1.5 + 0.25 * 10)
    with pytest.raises(ValueError):
        merge_stats([_fs([1.0])], weights=[1, 2])


def test_merge_of_file_halves_equals_whole_on_a_dataset(make_sample):
    root = make_sample(episodes=16, tasks=3, seed=7, data_files_size_in_mb=0.2)
    whole = compute_stats(root, jobs=1, sketch_points=16)
    from episodekit.core.dataset import open_dataset

    ds = open_dataset(str(root))
    fid, ep = ds.column("file_id"), ds.column("episode_index")
    half = len(ds.data_files) // 2
    assert half >= 1
    a = compute_stats(root, jobs=1, sketch_points=16, episodes=ep[fid < half])
    b = compute_stats(root, jobs=1, sketch_points=16, episodes=ep[fid >= half])
    merged = refine_quantiles(root, merge_stats([a.dataset, b.dataset]), jobs=1)
    envelope_differs = False
    for n, w in whole.dataset.items():
        m = merged[n]
        np.testing.assert_array_equal(m.quantiles, w.quantiles)
        np.testing.assert_array_equal(m.min, w.min)
        np.testing.assert_array_equal(m.max, w.max)
        np.testing.assert_allclose(m.mean, w.mean, rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(m.std, w.std, rtol=1e-12, atol=1e-12)
        assert m.count == w.count
        env = np.minimum(a.dataset[n].quantiles[:3], b.dataset[n].quantiles[:3])
        envelope_differs |= bool(np.any(env != w.quantiles[:3]))
    assert envelope_differs


# --------------------------------------------------------------------------------------------
# Writing: LeRobot layout, freshness, read-only


def _rewrite_data(root: Path, fn) -> None:
    """Each data file replaced by ``fn(index, table)``."""
    for i, path in enumerate(_data_files(root)):
        pq.write_table(fn(i, pq.read_table(path)), path)


def test_an_episode_in_two_data_files_is_an_error(root):
    files = _data_files(root)
    assert len(files) >= 2
    first = pq.read_table(files[0])
    ep = int(first["episode_index"][0].as_py())
    rows = first.filter(pa.compute.equal(first["episode_index"], ep))
    _rewrite_data(root, lambda i, t: pa.concat_tables([t, rows]) if i == 1 else t)
    with pytest.raises(DatasetError, match=f"episode {ep} appears in several places"):
        compute_stats(root, jobs=1)


def test_a_listed_episode_without_rows_is_an_error(root):
    _rewrite_data(root, lambda i, t: t.filter(pa.compute.not_equal(t["episode_index"], 5)))
    with pytest.raises(DatasetError, match=r"episodes \[5\] have no rows"):
        compute_stats(root, jobs=1)


def test_an_unlisted_episode_still_counts(root):
    """Rows of an episode the episodes table does not list: in the stats as before the fold
    (per-episode row and dataset moments over every row)."""
    f = sorted((root / "meta/episodes").rglob("*.parquet"))[0]
    t = pq.read_table(f)
    gone = int(t["episode_index"][-1].as_py())
    pq.write_table(t.slice(0, t.num_rows - 1), f)
    info = json.loads((root / "meta/info.json").read_text())
    info["total_episodes"] -= 1
    info["total_frames"] -= int(t["length"][-1].as_py())
    (root / "meta/info.json").write_text(json.dumps(info))
    res = compute_stats(root, jobs=1)
    assert gone in res.episode_index.tolist()
    assert np.all(np.diff(res.episode_index) > 0)
    ep, x = _column(root, "action")
    assert int(res.episode_count.sum()) == len(ep)
    np.testing.assert_allclose(res.dataset["action"].mean, x.mean(0), rtol=1e-9)
    at = int(np.searchsorted(res.episode_index, gone))
    np.testing.assert_array_equal(res.episode["action"]["max"][at], x[ep == gone].max(0))


def test_written_in_lerobot_layout(root):
    f = sorted((root / "meta/episodes").rglob("*.parquet"))[0]
    t = pq.read_table(f)
    t = t.replace_schema_metadata({b"keep": b"me"})
    t = t.append_column("extra", pa.array(np.arange(t.num_rows)))
    pq.write_table(t, f)
    others = [c for c in t.column_names if not c.startswith("stats/")]
    res, status = ensure_stats(root, jobs=1)
    assert status == "written" and res is not None
    back = pq.read_table(f)
    assert back.schema.metadata == {b"keep": b"me"}
    assert [c for c in back.column_names if not c.startswith("stats/")] == others
    assert back["extra"].to_pylist() == list(range(t.num_rows))
    for key in STAT_KEYS:
        col = back[f"stats/action/{key}"]
        want = pa.list_(pa.int64()) if key == "count" else pa.list_(pa.float64())
        assert col.type == want, key
        assert {len(v) for v in col.to_pylist()} == {1 if key == "count" else 14}
    assert back["stats/timestamp/mean"].type == pa.list_(pa.float64())
    assert {len(v) for v in back["stats/timestamp/mean"].to_pylist()} == {1}
    # stats.json as LeRobot's load_stats casts it: (D,) arrays, count (1,)
    stats = load_lerobot_stats(root)
    for key in STAT_KEYS:
        assert stats["action"][key].shape == ((1,) if key == "count" else (14,))
    assert stats["timestamp"]["q50"].shape == (1,)
    assert stats["action"]["count"].dtype.kind == "i"
    meta = read_summary_meta(root)
    assert meta["quantiles"]["action"] == "exact" and meta["rank_error"]["action"] == 0.0
    assert _stats_errors(root, deep=True) == set()


def test_episodes_file_written_a_slice_at_a_time(root, monkeypatch):
    """An episodes file is rewritten in row groups of EPISODES_PER_ROW_GROUP rows: the same
    columns, kept values and stats as one slice gives."""
    from episodekit.metadata.stats import write as stats_mod

    f = sorted((root / "meta/episodes").rglob("*.parquet"))[0]
    ensure_stats(root, force=True, jobs=1)
    whole = pq.read_table(f)
    monkeypatch.setattr(stats_mod, "EPISODES_PER_ROW_GROUP", 5)
    ensure_stats(root, force=True, jobs=1)
    sliced = pq.ParquetFile(f)
    assert sliced.metadata.num_row_groups == -(-whole.num_rows // 5) > 1
    assert sliced.read().equals(whole)
    assert sliced.schema_arrow.metadata == whole.schema.metadata


def test_image_stats_are_kept(make_sample):
    root = make_sample(episodes=6, tasks=2, seed=1, images=True)
    ep_file = sorted((root / "meta/episodes").rglob("*.parquet"))[0]
    before = pq.read_table(ep_file)["stats/observation.images.wrist/mean"]
    stats = json.loads((root / STATS_FILE).read_text())
    stats["observation.images.wrist"] = {"mean": [[[0.5]], [[0.5]], [[0.5]]]}
    (root / STATS_FILE).write_text(json.dumps(stats))
    ensure_stats(root, force=True, jobs=1)
    assert pq.read_table(ep_file)["stats/observation.images.wrist/mean"] == before
    kept = json.loads((root / STATS_FILE).read_text())["observation.images.wrist"]
    assert kept == {"mean": [[[0.5]], [[0.5]], [[0.5]]]}


def test_fresh_stale_and_force(root):
    assert ensure_stats(root, jobs=1)[1] == "written"
    assert ensure_stats(root, jobs=1) == (None, "fresh")
    assert ensure_stats(root, jobs=1, force=True)[1] == "written"
    assert ensure_stats(root, jobs=1, quantiles="sketch")[1] == "written"  # other mode
    assert ensure_stats(root, jobs=1, quantiles="sketch") == (None, "fresh")
    _set_action(root, lambda ep, fi, d: np.ones((len(ep), d)))  # data changed
    assert ensure_stats(root, jobs=1, quantiles="sketch")[1] == "written"
    (root / STATS_FILE).write_text("{}")  # output edited by hand
    assert ensure_stats(root, jobs=1, quantiles="sketch")[1] == "written"


def test_read_only_root_keeps_result_in_memory(root, monkeypatch, caplog):
    def refuse(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(dst))

    before = (root / STATS_FILE).read_bytes()
    monkeypatch.setattr(atomic.os, "replace", refuse)
    with caplog.at_level(logging.WARNING, logger="episodekit.metadata.stats"):
        res, status = ensure_stats(root, jobs=1)
        assert status == "not written" and res is not None
        assert ensure_stats(root, jobs=1)[1] == "not written"
    assert (root / STATS_FILE).read_bytes() == before
    assert not (root / SUMMARY_FILE).exists()
    assert [p for p in root.rglob("*") if atomic.is_temp_name(p.name)] == []
    assert len([r for r in caplog.records if "read-only root" in r.getMessage()]) == 1


def test_other_ranks_do_not_write(root, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ensure_stats(root, jobs=1)[1] == "not written"
    assert not (root / SUMMARY_FILE).exists()


# --------------------------------------------------------------------------------------------
# Validation: each corruption fires its check; the clean twin does not


def _edit_stats_json(root: Path, fn) -> None:
    data = json.loads((root / STATS_FILE).read_text())
    fn(data)
    (root / STATS_FILE).write_text(json.dumps(data))


def _edit_episode_stats(root: Path, column: str, fn) -> None:
    f = sorted((root / "meta/episodes").rglob("*.parquet"))[0]
    t = pq.read_table(f)
    i = t.schema.get_field_index(column)
    t = t.set_column(i, column, pa.array(fn(t[column].to_pylist()), t.schema.field(i).type))
    pq.write_table(t, f)


def _nan_mean(d):
    d["action"]["mean"][0] = float("nan")


def _wrong_shape(d):
    d["action"]["min"] = d["action"]["min"][:-1]


def _min_above_max(d):
    d["action"]["min"][3] = d["action"]["max"][3] + 1.0


def _mean_off(d):
    d["action"]["mean"][2] += 0.5


def _count_off(d):
    d["action"]["count"] = [d["action"]["count"][0] + 1]


def _episode_nan(rows):
    rows[1][0] = float("nan")
    return rows


def _episode_short(rows):
    rows[2] = rows[2][:-1]
    return rows


CORRUPTIONS = {
    "nan_in_stats_json": (lambda r: _edit_stats_json(r, _nan_mean), "stats.finite"),
    "missing_stats_json": (lambda r: (r / STATS_FILE).unlink(), "stats.present"),
    "wrong_shape": (lambda r: _edit_stats_json(r, _wrong_shape), "stats.shape"),
    "min_above_max": (lambda r: _edit_stats_json(r, _min_above_max), "stats.order"),
    "dataset_mean_off": (lambda r: _edit_stats_json(r, _mean_off), "stats.consistent"),
    "dataset_count_off": (lambda r: _edit_stats_json(r, _count_off), "stats.count"),
    "episode_nan": (
        lambda r: _edit_episode_stats(r, "stats/action/mean", _episode_nan),
        "stats.finite",
    ),
    "episode_wrong_shape": (
        lambda r: _edit_episode_stats(r, "stats/action/q50", _episode_short),
        "stats.shape",
    ),
    "stale_data": (
        lambda r: _set_action(r, lambda ep, fi, d: np.full((len(ep), d), 3.0)),
        "stats.fresh",
    ),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_fires_and_clean_twin_does_not(make_sample, name):
    clean = make_sample(episodes=10, tasks=2, seed=9)
    broken = make_sample(episodes=10, tasks=2, seed=9)
    for r in (clean, broken):
        ensure_stats(r, jobs=1)
    corrupt, check = CORRUPTIONS[name]
    corrupt(broken)
    assert _stats_errors(clean) == set()
    assert check in _stats_errors(broken), name


def test_stale_stats_caught_by_deep_recompute_without_summary(make_sample):
    root = make_sample(episodes=10, tasks=2, seed=9)
    ensure_stats(root, jobs=1)
    _set_action(root, lambda ep, fi, d: np.full((len(ep), d), 3.0))
    (root / SUMMARY_FILE).unlink()  # stats from elsewhere: only a recomputation can tell
    assert "stats.recompute" not in _stats_errors(root)
    assert "stats.recompute" in _stats_errors(root, deep=True)


def test_sample_writer_validates_clean(make_sample):
    for spec in ({"episodes": 8}, {"episodes": 8, "style": "edited", "images": True}):
        root = make_sample(**spec)
        assert _stats_errors(root, deep=True) == set(), spec


def test_v21_roots_have_no_stats_checks(make_sample):
    root = make_sample(episodes=5, version="v2.1")
    assert _stats_errors(root) == set()


# --------------------------------------------------------------------------------------------
# CLI, as a user runs it


def _cli(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "episodekit"
    return subprocess.run([str(exe), *args], capture_output=True, text=True)


def test_cli_stats_command(root):
    first = _cli("metadata", "stats", str(root), "--jobs", "1")
    assert first.returncode == 0, first.stderr
    assert "written" in first.stdout and "exact" in first.stdout
    again = _cli("metadata", "stats", str(root), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "fresh"
    bad = _cli("metadata", "stats", str(root), "--features", "nope")
    assert bad.returncode == 2  # a bad option value: usage (exit 2)
    assert bad.stderr.strip().count("\n") == 0 and "nope" in bad.stderr
    _edit_stats_json(root, _nan_mean)
    v = _cli("validate", str(root), "--checks", "stats")
    assert v.returncode == 1 and "stats.finite" in v.stdout


# Exact dataset quantiles without spilled runs (the Ray path: a second pass over the data): when
# the summary's brackets hold too many candidates for the driver, counting rounds narrow them
# first (tasks return histograms, not values); still numpy's quantiles, in one round or several.


def _tricky(ep, fi, d):
    rng = np.random.default_rng(3)
    out = rng.standard_normal((len(ep), d)) * 1e3
    out[:, 0] = fi * 0.5  # ascending inside every episode
    out[:, 1] = np.round(rng.random(len(ep)) * 3)  # 4 distinct values: ties at the brackets
    out[:, 2] = 7.0  # constant
    out[:, 3] = np.exp(rng.standard_normal(len(ep)) * 4)  # heavy tail: bins of very unequal mass
    return out


@pytest.mark.parametrize("candidates,rounds", [(0, 1), (0, 4), (50, 4)])
def test_narrowed_brackets_give_numpys_quantiles(make_sample, monkeypatch, candidates, rounds):
    root = make_sample(episodes=15, tasks=3, seed=5, style="edited", data_files_size_in_mb=0.3)
    _set_action(root, _tricky)
    res = compute_stats(root, quantiles="sketch", sketch_points=8, jobs=1, batch_rows=97)
    from episodekit.core.dataset import open_dataset
    from episodekit.metadata.stats import numeric_features
    from episodekit.metadata.stats import select as st

    ds = open_dataset(str(root))
    feats = numeric_features(ds.info, None)
    monkeypatch.setattr(st, "REFINE_CANDIDATES", candidates)
    monkeypatch.setattr(st, "REFINE_ROUNDS", rounds)
    monkeypatch.setattr(st, "REFINE_BINS", 16)
    counted = []
    real = st.count_file
    monkeypatch.setattr(st, "count_file", lambda job: counted.append(1) or real(job))
    st.exact_quantiles(ds.root, list(ds.data_files), feats, res.dataset, "local", 1, 97)
    files = len(ds.data_files)  # candidates=0/50: a round ran; more while brackets shrink
    assert len(counted) % files == 0 and 1 <= len(counted) // files <= rounds
    for name in ("action", "timestamp", "index"):
        _, x = _column(root, name)
        np.testing.assert_array_equal(
            res.dataset[name].quantiles, np.quantile(x, QUANTILES, axis=0)
        )


def test_candidates_travel_run_length_encoded():
    from episodekit.metadata.stats.scan import run_length

    qi = np.array([0, 0, 0, 1, 1, 0], np.int8)
    dim = np.array([2, 2, 2, 2, 2, 1], np.int32)
    val = np.array([5.0, 5.0, 3.0, 5.0, 5.0, 5.0])
    got = run_length(qi, dim, val)
    assert [a.tolist() for a in got] == [
        [0, 0, 0, 1],
        [1, 2, 2, 2],
        [5.0, 3.0, 5.0, 5.0],
        [1, 1, 2, 2],
    ]
