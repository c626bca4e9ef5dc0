"""The quality.* per-file pass streams record batches (memory: one batch plus the open episode,
not the file) and gives exactly the summaries of the whole-file pass: an episode spanning many
batches, a NaN at a batch start (filled from the batch before), the stride sample's positions,
a file out of order (read whole and sorted), an unreadable file, and the findings."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.validate import quality as q
from episodekit.validate.quality import reread as qreread
from episodekit.validate.quality import scan as qscan
from episodekit.validate.raw import read_raw

FIELDS = ("episodes", "rows", "ts_drops", "ts_missing", "ts_maxstep", "ts_interval")


def _equal(a: q.FileStats, b: q.FileStats) -> None:
    assert a.error == b.error
    for k in FIELDS:
        x, y = getattr(a, k), getattr(b, k)
        assert (x is None) == (y is None), k
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=k)
    assert sorted(a.features) == sorted(b.features)
    for name, fa in a.features.items():
        for k in q.FeatureStats.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(fa, k), getattr(b.features[name], k), k)


def _whole(raw, rel: str, feats: dict, stride: int) -> q.FileStats:
    cols = ["episode_index", "index", "timestamp", *feats]
    table = pq.read_table(raw.join(rel), columns=cols)
    return qscan._scan_table(table, rel, raw.fps, feats, stride, dict(q.DEFAULTS))


def _corrupt(path: str) -> None:
    """NaN/inf at places a small batch starts or ends, a frozen run, a jump."""
    t = pq.read_table(path)
    col = t["action"].combine_chunks()
    d = col.type.list_size
    v = col.values.to_numpy().reshape(-1, d).copy()
    v[0, 1] = np.inf
    v[5:9, 2] = np.nan
    v[37:41, 0] = np.nan  # across the boundary of 37-row batches
    v[300:340] = v[300]
    v[500, 3] += 50
    v[-1, 0] = np.nan
    arr = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel(), pa.float32()), d)
    t = t.set_column(t.schema.get_field_index("action"), t.schema.field("action"), arr)
    pq.write_table(t, path, row_group_size=1000)


@pytest.mark.parametrize("batch", [37, 100, 500])
@pytest.mark.parametrize("stride", [1, 7])
def test_streamed_pass_equals_the_whole_file_pass(make_sample, monkeypatch, batch, stride):
    root = make_sample(episodes=30, style="edited", seed=4, data_files_size_in_mb=1)
    raw = read_raw(str(root))
    rel = raw.data_files()[0]
    _corrupt(raw.join(rel))
    raw = read_raw(str(root))
    feats = q.quality_features(raw)
    whole = _whole(raw, rel, feats, stride)
    assert len(whole.episodes) >= 10 and int(whole.rows.max()) > batch
    monkeypatch.setattr(qscan, "BATCH_ROWS", batch)
    _equal(q.scan_file(raw, rel, feats, stride, dict(q.DEFAULTS)), whole)


def test_a_file_out_of_order_is_read_whole_and_sorted(make_sample, monkeypatch):
    root = make_sample(episodes=12, style="edited", seed=5)
    raw = read_raw(str(root))
    rel = raw.data_files()[0]
    feats = q.quality_features(raw)
    before = q.scan_file(raw, rel, feats, 3, dict(q.DEFAULTS))
    t = pq.read_table(raw.join(rel))
    rng = np.random.default_rng(0)
    pq.write_table(t.take(pa.array(rng.permutation(t.num_rows))), raw.join(rel))
    monkeypatch.setattr(qscan, "BATCH_ROWS", 50)
    after = q.scan_file(read_raw(str(root)), rel, feats, 3, dict(q.DEFAULTS))
    for k in ("episodes", "rows", "ts_drops", "ts_maxstep"):
        np.testing.assert_array_equal(getattr(after, k), getattr(before, k))
    for name, fs in before.features.items():
        for k in ("mins", "maxs", "maxstep", "frozen_longest", "clip"):
            np.testing.assert_array_equal(getattr(after.features[name], k), getattr(fs, k))


def test_an_unreadable_file_is_an_error_value_not_a_raise(make_sample):
    root = make_sample(episodes=6, style="edited", seed=6)
    raw = read_raw(str(root))
    rel = raw.data_files()[0]
    path = raw.join(rel)
    data = open(path, "rb").read()
    with open(path, "wb") as fh:  # a sound footer over garbage pages
        fh.write(data[:4] + bytes(len(data) - 4 - 2000) + data[-2000:])
    got = q.scan_file(raw, rel, q.quality_features(raw), 1, dict(q.DEFAULTS))
    assert got.error and len(got.episodes) == 0


def test_findings_are_the_same_whatever_the_batch(make_sample, monkeypatch):
    root = make_sample(episodes=30, style="edited", seed=4, data_files_size_in_mb=1)
    raw = read_raw(str(root))
    _corrupt(raw.join(raw.data_files()[0]))
    raw = read_raw(str(root))
    rels = raw.data_files()
    want = q.check_quality(raw, rels, threads=1)
    assert {f.check for f in want} >= {"quality.jump", "quality.out_of_range"}
    monkeypatch.setattr(qscan, "BATCH_ROWS", 37)
    monkeypatch.setattr(qreread, "BATCH_ROWS", 37)
    got = q.check_quality(raw, rels, threads=1)
    assert [f.to_dict() for f in got] == [f.to_dict() for f in want]
