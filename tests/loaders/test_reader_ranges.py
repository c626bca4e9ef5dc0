"""Row ranges: a stream decodes only the rows of a row group its bin needs (``hold`` with rows),
a partly decoded row group never serves rows it does not hold, and locality plans give a bin a
run of consecutive episodes inside a row group it shares with other bins."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

import episodekit.loaders.reader as reader_mod
from episodekit.core.dataset import open_dataset
from episodekit.loaders import FrameDataset, ShardedLoader
from episodekit.metadata.plans.build import plan_for_dataset
from episodekit.metadata.plans.partition import (
    CUT_SLACK,
    CUT_WINDOW,
    Items,
    _fill_shares,
    contiguous,
)
from episodekit.metadata.plans.plan_file import Plan, decode_plan, encode_plan
from episodekit.sample import write_sample

FPS = 30
WINDOWS = {"action": [k / FPS for k in range(4)], "observation.state": [-1 / FPS, 0.0]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    # two data files, one row group each, ~100 episodes per row group
    return write_sample(
        tmp_path_factory.mktemp("ranges") / "r",
        style="edited",
        episodes=200,
        tasks=2,
        seed=4,
        mean_length=20,
        data_files_size_in_mb=0.3,
    )


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(reader_mod, "DECODE_BATCH_ROWS", 64)


def _rows_of(root, rg_file: int) -> dict:
    ds = open_dataset(str(root))
    t = pq.read_table(ds.data_path(rg_file))
    return {c: t.column(c).to_pylist() for c in ("index", "observation.state")}


def test_hold_decodes_only_up_to_the_range_and_serves_nothing_else(root, small_batches):
    fd = FrameDataset(str(root), speed=False)
    reader = fd.reader
    assert len(reader.rg_rows) >= 2
    rows = int(reader.rg_rows[0])
    lo, hi = rows // 3, rows // 2
    reader.hold(np.array([0]), np.array([0]), (np.array([lo]), np.array([hi])))
    assert reader.rows_decoded < rows  # stopped after the batch holding row hi
    assert reader.covers(np.array([0]), lo, hi).all() and not reader.complete(np.array([0]))[0]
    ref = FrameDataset(str(root), speed=False)
    start = int(reader.rg_start[0])
    inside = np.arange(start + lo, start + hi)
    # rows of the range come from the pool, as a whole decode gives them
    got = fd.reader.gather([("index", inside), ("observation.state", inside)])
    np.testing.assert_array_equal(got[0], inside)
    np.testing.assert_array_equal(got[1], ref.get_frames(inside)["observation.state"])
    decoded = reader.rows_decoded
    assert reader.row_groups_read == 1  # nothing read again for rows it holds
    # rows outside the range are read, never taken from the stale part of the pool
    outside = np.array([start, start + rows - 1, start + hi + 3])
    np.testing.assert_array_equal(fd.reader.gather([("index", outside)])[0], outside)
    assert reader.row_groups_read == 2 and reader.rows_decoded == decoded
    for g in outside.tolist():  # ds[i] and get_frames on a partly held row group
        reader.hold(np.array([0]), np.array([0]), (np.array([lo]), np.array([hi])))
        np.testing.assert_array_equal(fd.get_frames([g])["index"], [g])
        reader.hold(np.array([0]), np.array([0]), (np.array([lo]), np.array([hi])))
        assert fd[g]["index"] == g  # all episodes: dataset index = global frame


def test_stream_decodes_fewer_rows_and_stays_exact(root, small_batches):
    ds = open_dataset(str(root))
    from episodekit.metadata.costs import compute_costs

    plan = Plan(
        decode_plan(
            encode_plan(
                plan_for_dataset(ds, compute_costs(ds, "frames"), 3, 2, locality="rowgroup")
            )
        )
    )
    ref = FrameDataset(str(root), delta_timestamps=WINDOWS, speed=False)
    total_rows = 0
    for rank in range(3):
        for worker in range(2):
            ld = ShardedLoader(
                str(root), plan, rank=rank, world_size=3, worker=worker, batch_size=50,
                delta_timestamps=WINDOWS, speed=False,
            )  # fmt: skip
            frames = ld.epoch_frames(0)
            batches = list(ld)
            want = ref.get_frames(frames)
            for key in ("index", "action", "action_is_pad", "observation.state"):
                got = np.concatenate([b[key] for b in batches])
                np.testing.assert_array_equal(got, want[key], err_msg=key)
            r = ld.frames.reader
            total_rows += r.rows_decoded
            full = int((r.rg_decodes * r.rg_rows).sum())
            assert r.rows_decoded <= full
    # six bins over two row groups: a bin decodes about its rows, not whole row groups
    assert total_rows < 6 * int(ds.num_frames) / 2


def test_contiguous_gives_runs_inside_a_shared_row_group():
    rng = np.random.default_rng(1)
    n, k = 20_000, 64
    lengths = np.clip(rng.lognormal(np.log(300), 0.5, n), 5, None).round()
    items = Items(np.arange(n), np.zeros(n, np.int64), lengths.astype(np.int64), lengths)
    unit = np.arange(n) // 2000  # ~300 episodes per bin, ~6 bins per row group
    out = contiguous(items, unit, k)
    totals = np.bincount(out, lengths, k)
    assert totals.max() / totals.mean() <= 1 + 2 * CUT_SLACK  # a bin: parts of <= 2 units
    for b in range(k):  # a run, give or take the items near its two cuts
        idx = np.flatnonzero(out == b)
        assert idx.max() - idx.min() + 1 <= len(idx) + 4 * CUT_WINDOW
    # the old division (largest first over the whole row group) scattered a bin over all of it
    shares = np.full(6, lengths[:2000].sum() / 6)
    spread = _fill_shares(lengths[:2000], shares)
    assert np.ptp(np.flatnonzero(spread == 0)) > 1500


def test_contiguous_falls_back_when_runs_cannot_balance():
    # a few huge items: runs would leave bins far off their shares; the division stays balanced
    lengths = np.full(4000, 10.0)
    lengths[::500] = 4000.0
    items = Items(np.arange(4000), np.zeros(4000, np.int64), lengths.astype(np.int64), lengths)
    out = contiguous(items, np.zeros(4000, np.int64), 8)
    totals = np.bincount(out, lengths, 8)
    assert totals.max() / totals.mean() <= 1.01
