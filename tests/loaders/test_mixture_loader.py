"""The loader on a mixture plan (issue 16): exact quotas per epoch, coverage, determinism,
exact resume, feature padding and masks, missing keys and mappings, a 2-process gloo job."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.loaders import EpisodeAwareSampler, FrameDataset, ShardedLoader, load_plan
from episodekit.loaders.mixture import MixtureFrameDataset, MixtureLoader, MixtureSampler
from episodekit.metadata.mixture.plan import ensure_mixture_plans
from episodekit.metadata.mixture.spec import MixtureError
from episodekit.sample import write_sample

PAD = {"observation.state": {"pad_to": 16}, "action": {"pad_to": 16}}


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("mixload")
    a = write_sample(base / "a", episodes=30, tasks=3, seed=1, mean_length=30)
    b = write_sample(
        base / "b", episodes=12, tasks=2, seed=2, mean_length=20, state_dim=6, action_dim=6
    )
    return base, a, b


def make_plan(roots, out, ws, nw, **spec_extra):
    _, a, b = roots
    spec = {
        "sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 3}],
        "features": PAD,
        **spec_extra,
    }
    ensure_mixture_plans(spec, out, [ws], nw, locality="rowgroup")
    return load_plan(out, ws, nw)


def frames_of(root):
    ds = open_dataset(str(root))
    return int(ds.num_frames)


def test_dispatch_and_padding_masks(roots, tmp_path):
    _, a, b = roots
    plan = make_plan(roots, tmp_path / "p", 1, 1)
    ds = FrameDataset(plan, delta_timestamps={"action": [0.0, 1 / 30]})
    assert isinstance(ds, MixtureFrameDataset)
    assert len(ds) == frames_of(a) + frames_of(b)
    plain_b = FrameDataset(b, delta_timestamps={"action": [0.0, 1 / 30]}, speed=True)
    i = len(ds) - 5  # a frame of source b
    x, ref = ds[i], plain_b[len(plain_b) - 5]
    assert x["source"] == "b" and x["source_index"] == 1
    assert x["observation.state"].shape == (16,)
    np.testing.assert_array_equal(x["observation.state"][:6], ref["observation.state"])
    assert not x["observation.state"][6:].any()
    assert x["observation.state_pad_mask"].tolist() == [False] * 6 + [True] * 10
    assert x["action"].shape == (2, 16) and x["action_pad_mask"].sum() == 10
    np.testing.assert_array_equal(x["action"][:, :6], ref["action"])
    np.testing.assert_array_equal(x["action_is_pad"], ref["action_is_pad"])
    y = ds[0]
    assert y["source"] == "a" and not y["observation.state_pad_mask"][:14].any()
    batch = ds.get_batch([i, 0, 3])
    assert batch["source"] == ["b", "a", "a"] and batch["source_index"].tolist() == [1, 0, 0]
    np.testing.assert_array_equal(batch["observation.state"][0], x["observation.state"])
    np.testing.assert_array_equal(
        batch["observation.state_pad_mask"][1], y["observation.state_pad_mask"]
    )
    np.testing.assert_array_equal(batch["index"], [x["index"], y["index"], ds[3]["index"]])


def test_one_class_per_name_for_a_root_and_a_mixture(roots, tmp_path):
    """Issue 49: no class call returns another class; a root is one source, a mixture one per
    root; both pickle (worker processes) and read the same after."""
    import pickle

    _, a, _ = roots
    plan = make_plan(roots, tmp_path / "p", 1, 1)
    deltas = {"action": [0.0, 1 / 30]}
    root_ds, mix_ds = FrameDataset(a, delta_timestamps=deltas), FrameDataset(plan)
    assert type(root_ds) is FrameDataset and type(mix_ds) is FrameDataset
    assert (root_ds.is_mixture, mix_ds.is_mixture) == (False, True)
    assert len(root_ds.datasets) == 1 and len(mix_ds.datasets) == 2
    assert root_ds.fps == open_dataset(str(a)).fps  # a root answers its source's attributes
    smp = EpisodeAwareSampler(mix_ds, plan=plan, rank=0, world_size=1)
    root_smp = EpisodeAwareSampler(root_ds, rank=0, world_size=1)
    assert type(smp) is EpisodeAwareSampler and type(root_smp) is EpisodeAwareSampler
    ld = ShardedLoader(None, plan, rank=0, world_size=1, worker=0)
    assert type(ld) is ShardedLoader and len(ld.sources) == 2
    for ds in (root_ds, mix_ds):
        back = pickle.loads(pickle.dumps(ds))
        assert type(back) is FrameDataset and len(back) == len(ds)
        want, got = ds.get_batch([0, 5, len(ds) - 1]), back.get_batch([0, 5, len(ds) - 1])
        assert sorted(want) == sorted(got)
        for k in want:
            if isinstance(want[k], np.ndarray):
                assert np.array_equal(want[k], got[k]), k
    with pytest.raises(AttributeError):
        getattr(mix_ds, "fps")  # noqa: B009  (a mixture has no one root to answer for)


def test_missing_key_is_an_error_and_a_mapping_fixes_it(roots):
    _, a, b = roots
    one = {
        "sources": [
            {"root": str(a), "weight": 1, "rename": {"observation.state": "state"}},
            {"root": str(b), "weight": 1},
        ],
        "features": {"action": {"pad_to": 16}, "state": {"pad_to": 16}},
    }
    with pytest.raises(
        MixtureError, match=r"source 'b' has no feature 'state'.*sources\[1\]\.rename"
    ):
        FrameDataset(one)
    one["sources"][1]["rename"] = {"observation.state": "state"}
    ds = FrameDataset(one)
    assert (
        "state" in ds[0]
        and "observation.state" not in ds[0]
        and ds[len(ds) - 1]["state"].shape == (16,)
    )
    # a width mismatch without pad_to names the feature and the fix
    with pytest.raises(
        MixtureError, match=r"'action' has different shapes .*features\.action\.pad_to"
    ):
        FrameDataset({"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 1}]})
    dropped = {
        "sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 1}],
        "features": {"action": {"drop": True}, "observation.state": {"drop": True}},
    }
    assert "action" not in FrameDataset(dropped)[0]


def per_frame_counts(ds, idx):
    return np.bincount(idx, minlength=len(ds))


@pytest.mark.parametrize("ws, nw", [(1, 1), (2, 2)])
def test_quotas_exact_and_coverage(roots, tmp_path, ws, nw):
    _, a, b = roots
    plan = make_plan(roots, tmp_path / "p", ws, nw)
    ds = FrameDataset(plan)
    fa, fb = frames_of(a), frames_of(b)
    qa, qb = plan.quotas.tolist()
    # b (weight 3, few frames) repeats; a is drawn below once per frame
    assert qb > fb and qa < fa
    all_sampler, all_loader = [], []
    for r in range(ws):
        smp = EpisodeAwareSampler(ds, plan=plan, rank=r, world_size=ws, seed=3)
        assert isinstance(smp, MixtureSampler) and len(smp) == plan.samples_per_rank
        all_sampler.append(smp.epoch_indices(0))
        for w in range(nw):
            ld = ShardedLoader(None, plan, rank=r, world_size=ws, worker=w, seed=3)
            assert isinstance(ld, MixtureLoader) and len(ld) == plan.samples_per_worker
            src, frm = ld.epoch_draws(0)
            assert np.bincount(src, minlength=2).tolist() == plan.bin_draws(r, w).tolist()
            all_loader.append(np.where(src == 0, frm, frm + fa))  # global frame -> ds index
    for idx in (np.concatenate(all_sampler), np.concatenate(all_loader)):
        src = ds.source_of(idx)
        assert np.bincount(src, minlength=2).tolist() == [qa, qb]  # exact quotas
        counts = per_frame_counts(ds, idx)
        # every frame of a drawn 0 or 1 times, of b floor or ceil of its repeats
        assert set(np.unique(counts[:fa])) <= {0, 1} and counts[:fa].sum() == qa
        if ws * nw == 1:
            lo, hi = qb // fb, -(-qb // fb)
            assert set(np.unique(counts[fa:])) <= {lo, hi}
        else:  # per bin: floor/ceil of (its draws / its frames); overall within one of that
            assert counts[fa:].min() >= qb // fb - 1 and counts[fa:].max() <= -(-qb // fb) + 1


def test_order_is_deterministic_and_changes_by_epoch_and_seed(roots, tmp_path):
    plan = make_plan(roots, tmp_path / "p", 2, 2)
    mk = lambda seed: ShardedLoader(None, plan, rank=1, world_size=2, worker=0, seed=seed)  # noqa: E731
    e0 = mk(5).epoch_draws(0)
    assert all(np.array_equal(x, y) for x, y in zip(e0, mk(5).epoch_draws(0)))
    assert not np.array_equal(e0[1], mk(5).epoch_draws(1)[1])
    assert not np.array_equal(e0[1], mk(6).epoch_draws(0)[1])
    ds = FrameDataset(plan)
    s1 = EpisodeAwareSampler(ds, plan=plan, rank=0, world_size=2, seed=5).epoch_indices(2)
    s2 = EpisodeAwareSampler(ds, plan=plan, rank=0, world_size=2, seed=5).epoch_indices(2)
    np.testing.assert_array_equal(s1, s2)
    # the subset of a (drawn below once per frame) differs between epochs
    s3 = EpisodeAwareSampler(ds, plan=plan, rank=0, world_size=2, seed=5).epoch_indices(3)
    fa = ds.source_offsets[1]
    assert set(s1[s1 < fa].tolist()) != set(s3[s3 < fa].tolist())


def test_loader_resumes_exactly_at_many_positions(roots, tmp_path):
    plan = make_plan(roots, tmp_path / "p", 1, 2)
    kw = dict(rank=0, world_size=1, seed=9, delta_timestamps={"action": [0.0, 1 / 30]})
    ref = ShardedLoader(None, plan, **kw)  # both workers' bins in turn
    full = [(x["source_index"], int(x["index"])) for x in ref]
    state_end = ref.state_dict()
    assert len(full) == len(ref) == plan.samples_per_rank
    for pos in [0, 1, 7, 255, 256, 257, 1000, len(full) // 2, plan.samples_per_worker,
                plan.samples_per_worker + 3, len(full) - 1]:  # fmt: skip
        ld = ShardedLoader(None, plan, **kw)
        it = iter(ld)
        for _ in range(pos):
            next(it)
        st = ld.state_dict()
        ld2 = ShardedLoader(None, plan, **kw)
        ld2.load_state_dict(st)
        rest = [(x["source_index"], int(x["index"])) for x in ld2]
        assert rest == full[pos:], pos
    assert state_end["position"] == len(full)
    other = ShardedLoader(None, plan, rank=0, world_size=1, seed=10)
    with pytest.raises(ValueError, match="another seed"):
        other.load_state_dict(state_end)
    # batches: resume between batches
    bl = ShardedLoader(None, plan, batch_size=100, **kw)
    batches = list(bl)
    bl2 = ShardedLoader(None, plan, batch_size=100, **kw)
    it = iter(bl2)
    for _ in range(3):
        next(it)
    bl3 = ShardedLoader(None, plan, batch_size=100, **kw)
    bl3.load_state_dict(bl2.state_dict())
    rest = list(bl3)
    assert len(rest) == len(batches) - 3
    for x, y in zip(rest, batches[3:]):
        np.testing.assert_array_equal(x["index"], y["index"])
        np.testing.assert_array_equal(x["action"], y["action"])
        assert x["source"] == y["source"]


def test_sampler_resumes_exactly(roots, tmp_path):
    plan = make_plan(roots, tmp_path / "p", 2, 2)
    ds = FrameDataset(plan)
    full = list(EpisodeAwareSampler(ds, plan=plan, rank=1, world_size=2, seed=4))
    for pos in [0, 1, 333, len(full) - 1, len(full)]:
        s = EpisodeAwareSampler(ds, plan=plan, rank=1, world_size=2, seed=4)
        it = iter(s)
        for _ in range(pos):
            next(it)
        s2 = EpisodeAwareSampler(ds, plan=plan, rank=1, world_size=2, seed=4)
        s2.load_state_dict(s.state_dict())
        assert list(s2) == (full[pos:] if pos < len(full) else full_next(ds, plan))


def full_next(ds, plan):
    return (
        EpisodeAwareSampler(ds, plan=plan, rank=1, world_size=2, seed=4).epoch_indices(1).tolist()
    )


def test_loader_values_match_the_sources(roots, tmp_path):
    _, a, b = roots
    plan = make_plan(roots, tmp_path / "p", 1, 1)
    ld = ShardedLoader(None, plan, rank=0, world_size=1, batch_size=500, seed=1)
    src, frm = ld.epoch_draws(0)
    batches = list(ld)
    got_src = np.concatenate([x["source_index"] for x in batches])
    got_idx = np.concatenate([x["index"] for x in batches])
    np.testing.assert_array_equal(got_src, src)
    np.testing.assert_array_equal(got_idx, frm)  # "index" is the source's global frame
    state = np.concatenate([x["observation.state"] for x in batches])
    fb = FrameDataset(b, speed=False)
    rows = np.flatnonzero(src == 1)[:50]
    ref = fb.get_frames(frm[rows])["observation.state"]
    np.testing.assert_array_equal(state[rows, :6], ref)
    assert not state[rows, 6:].any()


pytestmark_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is optional; this test needs it"
)

DIST_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch.distributed as dist
    from episodekit.loaders import EpisodeAwareSampler, FrameDataset, ShardedLoader, load_plan

    folder, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = load_plan(folder, world, 2)
    loader = ShardedLoader(folder, plan, batch_size=32, speed=False)  # rank from torch
    src = np.concatenate([b["source_index"] for b in loader]).tolist()
    sampler = EpisodeAwareSampler(FrameDataset(plan, speed=False), plan=plan, seed=7)
    idx = list(sampler)
    got = [None] * world
    dist.all_gather_object(got, {"rank": loader.rank, "sources": src, "sampler": idx})
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(got, fh)
    dist.barrier()
    dist.destroy_process_group()
    """
)


@pytestmark_torch
def test_two_process_gloo_over_a_mixture(roots, tmp_path):
    import socket

    plan = make_plan(roots, tmp_path / "p", 2, 2)
    script = tmp_path / "job.py"
    script.write_text(DIST_SCRIPT)
    out = tmp_path / "out.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE="2")  # fmt: skip
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(tmp_path / "p"), str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-3000:]
    got = json.loads(out.read_text())
    assert [g["rank"] for g in got] == [0, 1]
    assert [len(g["sources"]) for g in got] == [plan.samples_per_rank] * 2
    assert [len(g["sampler"]) for g in got] == [plan.samples_per_rank] * 2
    counts = np.bincount(np.concatenate([g["sources"] for g in got]), minlength=2)
    assert counts.tolist() == plan.quotas.tolist()


def test_bytes_cost_mixture_draws_every_frame_evenly_and_cut_windows_exact(roots, tmp_path):
    """Cost model bytes (its cost per frame varies), locality none: the plan's density split
    gives every (bin, source) its frame share, so over one epoch every frame of every source is
    drawn exactly floor or ceil of quota / frames times (loader over all bins, and sampler);
    samples of frames in episodes cut between bins carry the same delta windows as the source's
    own FrameDataset, also where the window crosses the cut."""
    import shutil

    _, a, b = roots
    roots_copy = [tmp_path / "a", tmp_path / "b"]  # the bytes cost table is written into them
    for src, dst in zip((a, b), roots_copy):
        shutil.copytree(src, dst)
    spec = {
        "sources": [{"root": str(roots_copy[0]), "weight": 1}, {"root": str(roots_copy[1]),
                                                                 "weight": 3}],
        "features": PAD,
    }  # fmt: skip
    ws, nw = 2, 2
    ensure_mixture_plans(spec, tmp_path / "p", [ws], nw, cost="bytes")
    plan = load_plan(tmp_path / "p", ws, nw)
    assert [s["algo_used"] for s in plan.sources] == ["density", "density"]
    ds = FrameDataset(plan)
    nf = [frames_of(r) for r in roots_copy]
    sampler_idx, loader_src, loader_frm = [], [], []
    deltas = {"action": [k / 30 for k in range(8)], "observation.state": [-2 / 30, -1 / 30, 0]}
    for r in range(ws):
        smp = EpisodeAwareSampler(ds, plan=plan, rank=r, world_size=ws, seed=5)
        sampler_idx.append(smp.epoch_indices(0))
        for w in range(nw):
            ld = ShardedLoader(None, plan, rank=r, world_size=ws, worker=w, seed=5)
            src, frm = ld.epoch_draws(0)
            loader_src.append(src)
            loader_frm.append(frm)
    src, frm = np.concatenate(loader_src), np.concatenate(loader_frm)
    for idx in (np.concatenate(sampler_idx), np.where(src == 0, frm, frm + nf[0])):
        counts = per_frame_counts(ds, idx)
        for s, (lo, hi) in enumerate(((0, nf[0]), (nf[0], nf[0] + nf[1]))):
            q = int(plan.quotas[s])
            assert counts[lo:hi].sum() == q
            assert set(np.unique(counts[lo:hi])) <= {q // nf[s], -(-q // nf[s])}, s
    # windows of frames in cut episodes, read by the loader of each bin
    checked = crossing = 0
    for s, root in enumerate(roots_copy):
        sd = open_dataset(str(root))
        first = sd.column("dataset_from_index").astype(np.int64)
        sel = plan.item_source == s
        items = plan.items[sel]
        pieces = np.bincount(items[:, 0], minlength=sd.num_episodes)
        assert (pieces > 1).any()  # the split cut episodes of this source
        ref_ds = FrameDataset(root, delta_timestamps=deltas, speed=False)
        bins = np.repeat(np.arange(ws * nw), np.diff(plan.bin_offsets))[sel]
        for r in range(ws):
            for w in range(nw):
                b = r * nw + w
                mine = items[(bins == b) & (pieces[items[:, 0]] > 1)]
                ld = ShardedLoader(None, plan, rank=r, world_size=ws, worker=w, seed=5,
                                   batch_size=64, delta_timestamps=deltas)  # fmt: skip
                for batch in ld:
                    keep = np.flatnonzero(batch["source_index"] == s)
                    g = batch["index"][keep]
                    ep = np.searchsorted(first, g, side="right") - 1
                    fi = g - first[ep]
                    in_cut = np.zeros(len(g), bool)
                    ends_inside = np.zeros(len(g), bool)
                    for e, st, en in mine:
                        hit = (ep == e) & (fi >= st) & (fi < en)
                        in_cut |= hit
                        ends_inside |= hit & (fi + 7 >= en) & (en < sd.column("length")[e])
                    rows = keep[in_cut]
                    if not len(rows):
                        continue
                    ref = ref_ds.get_frames(batch["index"][rows])
                    dim = ref["action"].shape[-1]
                    np.testing.assert_array_equal(batch["action"][rows][..., :dim], ref["action"])
                    np.testing.assert_array_equal(batch["action_is_pad"][rows],
                                                  ref["action_is_pad"])  # fmt: skip
                    sdim = ref["observation.state"].shape[-1]
                    np.testing.assert_array_equal(
                        batch["observation.state"][rows][..., :sdim], ref["observation.state"]
                    )
                    checked += len(rows)
                    crossing += int(ends_inside.sum())
    assert checked > 0 and crossing > 0  # windows across a cut were compared


def test_sampler_drops_episode_edge_frames_and_keeps_quotas(roots, tmp_path):
    """drop_n_first_frames / drop_n_last_frames on a mixture: those frames are never drawn, the
    per-source quotas stay exact, a state from other drop settings is refused, and drops that
    leave a bin without frames of a source it draws from are one clear error."""
    plan = make_plan(roots, tmp_path / "p", 2, 2)
    ds = FrameDataset(plan, speed=False)
    kw = dict(plan=plan, world_size=2, seed=3, drop_n_first_frames=2, drop_n_last_frames=3)
    counts = np.zeros(len(plan.source_names), np.int64)
    for rank in range(2):
        s = EpisodeAwareSampler(ds, rank=rank, **kw)
        idx = np.fromiter(iter(s), np.int64)
        assert len(idx) == plan.samples_per_rank
        batch = ds.get_batch(idx)
        fi = batch["frame_index"]
        src = batch["source_index"]
        for k, fd in enumerate(ds.datasets):
            sel = src == k
            ep_len = fd.episode_lengths[
                np.searchsorted(fd.episode_index, batch["episode_index"][sel])
            ]
            assert (fi[sel] >= 2).all() and (fi[sel] < ep_len - 3).all()
            counts[k] += sel.sum()
        state = s.state_dict()
    assert counts.tolist() == plan.quotas.tolist()
    with pytest.raises(ValueError, match=r"another drop \(\{'drop': \[2, 3\]\} vs \{'drop': None"):
        EpisodeAwareSampler(ds, plan=plan, rank=1, world_size=2, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="leave no frames of source"):
        EpisodeAwareSampler(ds, plan=plan, rank=0, world_size=2, drop_n_first_frames=10_000)
    with pytest.raises(ValueError, match=">= 0"):
        EpisodeAwareSampler(ds, plan=plan, rank=0, world_size=2, drop_n_last_frames=-1)
