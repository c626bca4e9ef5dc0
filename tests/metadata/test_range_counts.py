"""Exact quantiles from range counts and one selection pass (what ``repair`` writes): numpy's
quantiles of the whole data, bit for bit, whatever the range given, the dtype or the ties."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.metadata.stats import QUANTILES
from episodekit.metadata.stats import select as select_mod
from episodekit.metadata.stats.range_counts import RangeCounts, counted, exact_from_counts

RELS = ["data/chunk-000/file-000.parquet", "data/chunk-000/file-001.parquet"]


def _column(x: np.ndarray) -> pa.Array:
    if x.shape[1] == 1:
        return pa.array(x[:, 0])
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def _root(tmp_path: Path, cols: dict[str, np.ndarray], group_rows: int = 700) -> Path:
    """Two data files splitting ``cols``' rows, several row groups each."""
    n = len(next(iter(cols.values())))
    cut = n // 3
    for rel, rows in zip(RELS, (slice(0, cut), slice(cut, n))):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        t = pa.table({k: _column(v[rows]) for k, v in cols.items()})
        pq.write_table(t, path, row_group_size=group_rows)
    return tmp_path


def _counts(root: Path, cols: dict[str, np.ndarray], ranges: dict | None = None) -> dict:
    """Counted file by file, batch by batch, as repair's verification counts them."""
    total = {}
    for rel in RELS:
        part = {
            n: RangeCounts.over(*(ranges or {}).get(n, (v.min(0), v.max(0))))
            for n, v in cols.items()
        }
        pf = pq.ParquetFile(root / rel)
        batches = (pf.read_row_groups([i]) for i in range(pf.num_row_groups))
        for _ in counted(batches, part):
            pass
        for n, rc in part.items():
            if n in total:
                total[n].merge(rc)
            else:
                total[n] = rc
    return total


def _numpy(x: np.ndarray) -> np.ndarray:
    return np.quantile(x.astype(np.float64), QUANTILES, axis=0)


def test_float32_int64_and_ties_equal_numpy_bit_for_bit(tmp_path):
    rng = np.random.default_rng(3)
    n = 20_011
    cols = {
        "state": np.cumsum(rng.normal(0, 0.01, (n, 6)), axis=0).astype(np.float32),
        "index": np.arange(n, dtype=np.int64)[:, None],
        "task": rng.integers(0, 3, (n, 1)).astype(np.int64),  # three values: ties
        "gripper": np.where(rng.random((n, 2)) < 0.9, 0.0, rng.random((n, 2))).astype(np.float32),
        "wide": rng.standard_cauchy((n, 1)),  # float64, heavy tails
    }
    root = _root(tmp_path, cols)
    got = exact_from_counts(str(root), RELS, _counts(root, cols), batch_rows=1500)
    for name, x in cols.items():
        np.testing.assert_array_equal(got[name], _numpy(x), err_msg=name)


@pytest.mark.parametrize(
    "lo, hi",
    [(-0.01, 0.01), (-100.0, 100.0), (0.5, 0.5), (5.0, 9.0)],
    ids=["inside", "wide", "a point", "beside the data"],
)
def test_any_range_gives_the_same_exact_quantiles(tmp_path, lo, hi):
    """The range only decides how many candidates the pass gathers, never the result: a
    recorded min/max that is wrong (damage) cannot make repair's quantiles wrong."""
    rng = np.random.default_rng(4)
    x = rng.normal(0, 1, (9_000, 3)).astype(np.float32)
    root = _root(tmp_path, {"x": x})
    ranges = {"x": (np.full(3, lo), np.full(3, hi))}
    got = exact_from_counts(str(root), RELS, _counts(root, {"x": x}, ranges))
    np.testing.assert_array_equal(got["x"], _numpy(x))


def test_crowded_brackets_are_narrowed_first(tmp_path, monkeypatch):
    """Brackets holding more candidates than the cap go through the narrowing selection."""
    monkeypatch.setattr("episodekit.metadata.stats.range_counts.REFINE_CANDIDATES", 10)
    calls = []
    real = select_mod.exact_quantiles
    monkeypatch.setattr(
        "episodekit.metadata.stats.range_counts.exact_quantiles",
        lambda *a, **k: calls.append(a[2]) or real(*a, **k),
    )
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (6_000, 2)).astype(np.float32)
    root = _root(tmp_path, {"x": x})
    got = exact_from_counts(str(root), RELS, _counts(root, {"x": x}))
    assert calls == [{"x": 2}]
    np.testing.assert_array_equal(got["x"], _numpy(x))


def test_nan_leaves_the_feature_to_the_caller(tmp_path):
    x = np.random.default_rng(6).normal(0, 1, (3_000, 2)).astype(np.float32)
    x[17, 1] = np.nan
    root = _root(tmp_path, {"x": x, "y": x[:, :1] * 0 + 1})
    counts = _counts(root, {"x": x, "y": x[:, :1] * 0 + 1}, {"x": (np.zeros(2), np.ones(2))})
    assert counts["x"].nan.tolist() == [0, 1]
    got = exact_from_counts(str(root), RELS, counts)
    assert set(got) == {"y"}


def test_counts_are_exact_against_their_edges():
    """Every value counted in the bin whose edges hold it (numpy's histogram), those outside
    the range below or above: the rank summary has no rank error."""
    rng = np.random.default_rng(7)
    x = rng.normal(0, 1, (50_000, 2))
    x[:100] = np.round(x[:100], 1)  # values on or next to edges
    rc = RangeCounts.over(np.array([-1.0, -2.0]), np.array([1.0, 2.0]), bins=64)
    rc.add(x)
    for j, sk in enumerate(rc.sketches()):
        assert sk.rank_error == 0
        true = np.searchsorted(np.sort(x[:, j]), sk.values, side="right")
        np.testing.assert_array_equal(np.cumsum(sk.weights), true)


def test_float32_values_next_to_every_edge(tmp_path):
    """float32 data sitting on and one step either side of every bin edge (float64 edges a
    float32 cannot hold): each value is counted below a bracket or gathered inside it, never
    both, never neither."""
    lo, hi = np.array([-0.3]), np.array([0.7])
    e = RangeCounts.over(lo, hi).edges[0].astype(np.float32)
    near = np.concatenate([e, np.nextafter(e, np.float32(-1)), np.nextafter(e, np.float32(1))])
    x = np.unique(near)[:, None]  # distinct: a value counted twice shifts the ranks
    np.random.default_rng(8).shuffle(x)
    root = _root(tmp_path, {"x": x})
    counts = _counts(root, {"x": x}, {"x": (lo, hi)})
    for rc in counts.values():
        assert rc.edges.shape == (1, 4097)
    got = exact_from_counts(str(root), RELS, counts, batch_rows=500)
    np.testing.assert_array_equal(got["x"], _numpy(x))
