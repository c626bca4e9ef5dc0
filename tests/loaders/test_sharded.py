"""ShardedLoader: coverage, disjointness, equal counts, locality, exact resume, values."""

from __future__ import annotations

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.loaders import FrameDataset, ShardedLoader, load_plan
from episodekit.metadata.plans.build import ensure_plans

SPEC = dict(episodes=48, tasks=3, seed=31, mean_length=40, data_files_size_in_mb=0.05)
FPS = 30


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One sample with trim plans for 8x2 and 2x2 and a wrap plan for 3x1 (shared, read-only)."""
    from episodekit.sample import write_sample

    root = write_sample(tmp_path_factory.mktemp("sharded") / "root", **SPEC)
    ensure_plans(str(root), [8, 2], 2)
    ensure_plans(str(root), [3], 1, policy="wrap")
    return root


def bin_frames(ds, items) -> np.ndarray:
    starts = ds.column("dataset_from_index")
    rows = ds.episode_rows(items[:, 0])
    parts = [
        np.arange(starts[r] + a, starts[r] + b) for r, a, b in zip(rows, items[:, 1], items[:, 2])
    ]
    return np.concatenate(parts)


def test_8_ranks_x_2_workers_cover_the_plan_disjointly_with_equal_counts(planned):
    plan = load_plan(str(planned), 8, 2)
    ds = open_dataset(str(planned))
    assert len(ds.data_files) > 3
    spw = plan.samples_per_worker
    union, kept = [], 0
    for rank in range(8):
        per_rank = []
        for w in range(2):
            loader = ShardedLoader(
                planned, plan, rank=rank, world_size=8, worker=w, batch_size=50, speed=False
            )
            got = np.concatenate([b["index"] for b in loader])
            assert len(got) == spw == len(loader)
            expected = bin_frames(ds, plan.bin_items(rank, w))
            assert np.isin(got, expected).all()
            assert len(np.unique(got)) == len(got)  # trim: no repeats
            kept += min(len(expected), spw)
            per_rank.append(got)
            np.testing.assert_array_equal(got, loader.epoch_frames(0))
            # locality: this rank's reader opened only its own episodes' data files
            rank_eps = np.unique(plan.rank_items(rank)[:, 0])
            mine = set(ds.column("file_id")[ds.episode_rows(rank_eps)].tolist())
            assert set(loader.frames.reader.file_ids.tolist()) == mine
            assert set(loader.frames.reader._handles) <= mine
        assert sum(len(p) for p in per_rank) == plan.samples_per_rank
        union.append(np.concatenate(per_rank))
    union = np.concatenate(union)
    assert len(np.unique(union)) == len(union) == kept == 16 * spw
    assert plan.dropped_frames == ds.num_frames - len(union)  # union = plan minus its trims


def test_rank_without_worker_reads_all_its_bins_in_sample_mode(planned):
    plan = load_plan(str(planned), 2, 2)
    loader = ShardedLoader(planned, plan, rank=1, world_size=2, seed=4, speed=False)
    samples = list(loader)
    assert len(samples) == plan.samples_per_rank == len(loader)
    idx = np.array([s["index"] for s in samples])
    np.testing.assert_array_equal(idx, loader.epoch_frames(0))
    assert isinstance(samples[0]["task"], str) and samples[0]["action"].shape == (14,)


def test_values_and_windows_match_the_frame_dataset(planned):
    plan = load_plan(str(planned), 2, 2)
    windows = {"action": [k / FPS for k in range(4)], "observation.state": [-1 / FPS, 0.0]}
    loader = ShardedLoader(
        planned,
        plan,
        rank=0,
        world_size=2,
        worker=1,
        batch_size=64,
        delta_timestamps=windows,
        speed=False,
    )
    fds = FrameDataset(planned, delta_timestamps=windows, speed=False)
    for batch in loader:
        ref = fds.get_batch(batch["index"])  # episodes=None: position == global frame
        for key in ("action", "action_is_pad", "observation.state", "observation.state_is_pad"):
            np.testing.assert_array_equal(batch[key], ref[key])
        assert batch["task"] == ref["task"]


def test_order_is_mixed_deterministic_and_reshuffled(planned):
    plan = load_plan(str(planned), 2, 2)

    def make(seed=0):
        return ShardedLoader(planned, plan, rank=0, world_size=2, worker=0, seed=seed, speed=False)

    a, b = make().epoch_frames(0), make().epoch_frames(0)
    np.testing.assert_array_equal(a, b)
    assert (make().epoch_frames(1) != a).mean() > 0.5
    assert (make(seed=1).epoch_frames(0) != a).mean() > 0.5
    ds = open_dataset(str(planned))
    ep = np.searchsorted(ds.column("dataset_from_index"), a[:32], side="right")
    assert len(np.unique(ep)) > 2  # frames of a pool of episodes are interleaved


@pytest.mark.parametrize("batch_size", [None, 40])
def test_resume_exactly(planned, batch_size):
    plan = load_plan(str(planned), 2, 2)

    def make():
        return ShardedLoader(
            planned, plan, rank=1, world_size=2, worker=0, batch_size=batch_size, speed=False
        )

    def flat(items):
        return [int(i) for x in items for i in np.atleast_1d(x["index"])]

    full = make()
    epoch0, epoch1 = flat(full), flat(full)
    assert epoch0 != epoch1 and len(epoch0) == len(epoch1) == plan.samples_per_worker
    step = batch_size or 1
    n_items = -(-len(epoch0) // step)
    for stop in sorted({0, 1, 3, n_items // 2, n_items - 1, n_items}):
        loader = make()
        it = iter(loader)
        head = flat(next(it) for _ in range(stop))
        state = loader.state_dict()
        assert set(state) >= {"epoch", "position"} and all(
            isinstance(v, int) for v in state.values()
        )
        resumed = make()
        resumed.load_state_dict(state)
        before = resumed.frames.reader.row_groups_read
        rest = flat(resumed)
        if stop < n_items:
            assert head + rest == epoch0
        else:
            assert rest == epoch1
        # skipped samples are not read: exactly the row groups of the remaining frames
        needed = np.unique(resumed.frames.reader.rg_of(np.array(rest, dtype=np.int64)))
        assert resumed.frames.reader.row_groups_read - before == len(needed)


def test_wrap_plan_reaches_the_count_by_repeating_own_frames(planned):
    plan = load_plan(str(planned), 3, 1)
    ds = open_dataset(str(planned))
    for rank in range(3):
        loader = ShardedLoader(planned, plan, rank=rank, world_size=3, batch_size=100, speed=False)
        got = np.concatenate([b["index"] for b in loader])
        own = bin_frames(ds, plan.bin_items(rank, 0))
        assert len(got) == plan.samples_per_worker
        np.testing.assert_array_equal(np.unique(got), np.unique(own))


def test_bad_arguments(planned):
    plan = load_plan(str(planned), 2, 2)
    with pytest.raises(ValueError, match="world_size=2"):
        ShardedLoader(planned, plan, rank=0, world_size=4, speed=False)
    with pytest.raises(ValueError, match="2 workers"):
        ShardedLoader(planned, plan, rank=0, world_size=2, num_workers=3, speed=False)
    with pytest.raises(ValueError, match="worker 5"):
        ShardedLoader(planned, plan, rank=0, world_size=2, worker=5, speed=False)
    with pytest.raises(Exception, match="no shard plan"):
        ShardedLoader(planned, None, rank=0, world_size=5, num_workers=1, speed=False)
    loader = ShardedLoader(planned, plan, rank=0, world_size=2, worker=0, speed=False)
    with pytest.raises(ValueError, match="another rank"):
        loader.load_state_dict({**loader.state_dict(), "rank": 1})
