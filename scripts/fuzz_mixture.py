"""Fuzz the mixture stream against the plain path and against each source's FrameDataset.

Random mixtures of 1-3 of four small sources (row groups of many episodes, one row group per
episode, a 6-dimensional source padded to 14, very small row groups), random world sizes,
workers, policies, localities, caches and batch sizes; decode batches of 8 rows so that every
row-range path of ``RowGroupReader.hold`` runs. For every rank and worker: the loader's batches
equal those of the same loader with whole row groups and no arena, its order equals
``epoch_draws``, and its action windows equal the source's ``FrameDataset.get_frames``.

    .venv/bin/python scripts/fuzz_mixture.py [--seed S] [--trials N]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import warnings

import numpy as np

import episodekit.loaders.reader as reader_mod
from episodekit.loaders import FrameDataset, ShardedLoader, load_plan
from episodekit.metadata.mixture.plan import ensure_mixture_plans
from episodekit.sample import write_sample

LAYOUTS = [("edited", 0.05, 14), ("recorded", 100, 14), ("edited", 0.2, 6), ("edited", 0.03, 14)]


def plain(ld) -> None:
    """Make ``ld`` read whole row groups and gather per source (the path before the arena)."""
    for f in ld.sources:
        f.defer_pool_rows = False
        hold = f.reader.hold
        f.reader.hold = lambda rgs, need=None, rows=None, _h=hold: _h(rgs, need, None)


def check(plan, roots, srcs, rank: int, worker: int, kw: dict) -> list[str]:
    """Differences for one (rank, worker) of ``plan``."""
    a = ShardedLoader(None, plan, rank=rank, worker=worker, world_size=plan.world_size, **kw)
    b = ShardedLoader(None, plan, rank=rank, worker=worker, world_size=plan.world_size, **kw)
    plain(b)
    src, frm = a.epoch_draws(0)
    xa, xb = list(a), list(b)
    bad = [] if len(xa) == len(xb) else ["batch count"]
    for x, y in zip(xa, xb):
        bad += [k for k in x if isinstance(x[k], np.ndarray) and not np.array_equal(x[k], y[k])]
    got_i = np.concatenate([x["index"] for x in xa])
    got_s = np.concatenate([x["source_index"] for x in xa])
    if not (np.array_equal(got_i, frm) and np.array_equal(got_s, src)):
        bad.append("order")
    act = np.concatenate([x["action"] for x in xa])
    pad = np.concatenate([x["action_is_pad"] for x in xa])
    deltas = {"action": kw["delta_timestamps"]["action"]}
    for k, i in enumerate(srcs):
        sel = np.flatnonzero(got_s == k)[:200]
        if len(sel):
            ref = FrameDataset(roots[i], delta_timestamps=deltas, speed=False, store=None)
            want = ref.get_frames(frm[sel])
            d = want["action"].shape[-1]
            ok = np.array_equal(act[sel][..., :d], want["action"])
            if not (ok and np.array_equal(pad[sel], want["action_is_pad"])):
                bad.append(f"windows of source {k}")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=25)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    reader_mod.DECODE_BATCH_ROWS = 8
    base = tempfile.mkdtemp(prefix="fuzz-mixture-")
    roots = {
        i: write_sample(
            f"{base}/s{i}",
            episodes=random.Random(i).randint(15, 40),
            tasks=2,
            seed=i,
            mean_length=25,
            style=style,
            data_files_size_in_mb=mb,
            state_dim=dim,
            action_dim=dim,
        )  # fmt: skip
        for i, (style, mb, dim) in enumerate(LAYOUTS)
    }
    rng = random.Random(args.seed)
    failures = 0
    for trial in range(args.trials):
        srcs = rng.sample(list(roots), rng.randint(1, 3))
        spec: dict = {"sources": [{"root": str(roots[i]), "weight": rng.choice([1, 2, 0.5])}
                                  for i in srcs]}  # fmt: skip
        if 2 in srcs and len(srcs) > 1:
            spec["features"] = {"observation.state": {"pad_to": 14}, "action": {"pad_to": 14}}
        ws, nw = rng.choice([(1, 1), (2, 1), (2, 2), (3, 1)])
        policy, locality = rng.choice(["trim", "wrap"]), rng.choice(["rowgroup", "none"])
        out = f"{base}/p{trial}"
        ensure_mixture_plans(spec, out, [ws], nw, locality=locality, policy=policy)
        plan = load_plan(out, ws, nw)
        kw = dict(
            batch_size=rng.choice([7, 32, 100]), seed=trial, speed=False,
            cache_mb=rng.choice([0.01, 0.05, 1.0]),
            delta_timestamps={"action": [k / 30 for k in range(rng.randint(1, 6))],
                              "observation.state": [-1 / 30, 0]},
        )  # fmt: skip
        bad = [
            f"rank {r} worker {w}: {d}"
            for r in range(ws)
            for w in range(nw)
            for d in check(plan, roots, srcs, r, w, kw)
        ]
        failures += bool(bad)
        what = f"sources {srcs}, {ws} x {nw}, {policy}, {locality}"
        what += f", cache_mb {kw['cache_mb']}, batch {kw['batch_size']}"
        print(f"{trial}: {what}: {'; '.join(bad) or 'equal'}")
    print(f"{failures} of {args.trials} trials differ")


if __name__ == "__main__":
    main()
