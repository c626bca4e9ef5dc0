"""Benchmark mixtures (issue 16): the four bars, each against a baseline measured in the same run.

1. quotas: on a mixture of --root split into three sources by episode ranges (weights 1, 3, 0.5:
   one source repeated, two subsampled), W x K bins: the realized draws per source over one
   epoch (every bin's ``epoch_draws``, no data read) vs the quotas; the largest per-bin share
   deviation from the quota share; per-frame draw counts vs quota / frames.
2. balance: in memory, 5 sources of lognormal lengths, 64 x 4 bins, 16 and 64 episodes per bin
   (in total), with the ``frames`` cost and a bytes-like cost (length x a per-episode factor):
   max / lower bound of each bin's cost per epoch, next to a single-root plan of the same
   episodes and costs; the per-frame draw rate deviation; which algorithm the sources used
   (``density``: the two-ended density split) and the episodes it cut, per episode.
3. planning time: 5 sources totalling --episodes episodes into 512 x 8 bins (in memory) vs a
   single-root ``build_plan`` of the same episodes and costs, best of --repeat, same run: once
   with the ``frames`` cost, once bytes-like (the density split).
4. loader throughput: one worker (rank 0, worker 0) of a W x K ``rowgroup`` plan, batches of
   256, 50-frame action + 3-frame state windows, first epoch of its bin: a mixture of --root's
   three episode ranges (balance frames: quotas = frames) vs the single root itself, in
   --repeat interleaved rounds: the median ratio of wall and of CPU time (the machine is
   shared) for the first epoch (pools' pages mapped as they fill) and the second, and the
   rows each decodes. With --store DIR both loaders read through that frame store of --root.

Usage: .venv/bin/python scripts/bench_mixture.py --root $EPISODEKIT_BENCH/big10m \
          --out $EPISODEKIT_BENCH/mixture-bench [--parts 1,2,3,4]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from episodekit.core.dataset import open_dataset
from episodekit.metadata.mixture.plan import SourceCosts, build_mixture_plan
from episodekit.metadata.mixture.spec import parse_mixture, resolve_sources
from episodekit.metadata.plans.build import build_plan, rowgroup_units
from episodekit.metadata.plans.plan_file import Plan, decode_plan, encode_plan

# Where scripts/bench_data.py wrote the benchmark roots (EPISODEKIT_BENCH, default ./bench-data).
BENCH = os.environ.get("EPISODEKIT_BENCH", "bench-data")


def lognormal(n: int, seed: int, median: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(median), 0.8, n)), 5, None).astype(np.int64)


def synthetic(total: int, seed: int, bytes_like: bool) -> list[SourceCosts]:
    """5 sources of different sizes and median lengths (``total`` episodes in all)."""
    shares = np.array([0.4, 0.25, 0.2, 0.1, 0.05])
    medians = [300, 120, 600, 200, 900]
    out = []
    for i, (share, med) in enumerate(zip(shares, medians)):
        n = int(total * share)
        length = lognormal(n, seed + i, med)
        cost = length.astype(np.float64)
        if bytes_like:
            cost = cost * np.random.default_rng(seed + 100 + i).lognormal(0, 0.3, n)
        out.append(SourceCosts(f"s{i}", np.arange(n), length, cost))
    return out


def spec_for(sources: list[SourceCosts], weights: list[float], balance: str = "none"):
    return parse_mixture(
        {
            "sources": [
                {"root": f"/synthetic/{s.name}", "weight": w} for s, w in zip(sources, weights)
            ],
            "balance": balance,
        }
    )


def part_balance(seed: int) -> None:
    print("== 2. balance, 64 x 4 = 256 bins, 5 sources (max / lower bound)")
    print(
        f"  {'cost':<10}{'eps/bin':>8}{'mixture':>10}{'content':>10}{'single':>10}"
        f"{'rate dev':>10}{'share dev':>11}  algo     cuts/episode"
    )
    weights = [1, 2, 1, 3, 0.5]
    for bytes_like in (False, True):
        for per_bin in (16, 64):
            srcs = synthetic(per_bin * 256, seed, bytes_like)
            p = build_mixture_plan(spec_for(srcs, weights), srcs, 64, 4, algo="auto")
            cost = np.concatenate([s.cost for s in srcs])
            length = np.concatenate([s.length for s in srcs])
            single = build_plan(cost, length, 64, 4)
            algos = ",".join(sorted({s["algo_used"] for s in p["sources"]}))
            print(
                f"  {'bytes-like' if bytes_like else 'frames':<10}{per_bin:>8}"
                f"{p['balance']['plan']['max_over_lower_bound']:>10.4f}"
                f"{p['balance']['content']['max_over_lower_bound']:>10.4f}"
                f"{single['balance']['plan']['max_over_lower_bound']:>10.4f}"
                f"{p['draw_rate_deviation']:>10.4f}{p['share_deviation']['max_abs']:>11.2e}"
                f"  {algos:<8} {p['split_episodes'] / p['num_episodes']:.3f} "
                f"({p['split_episodes']:,} of {p['num_episodes']:,})"
            )


def part_planning(episodes: int, world: int, workers: int, repeat: int, seed: int) -> None:
    print(f"== 3. planning {episodes:,} episodes into {world} x {workers} bins (best of {repeat})")

    def best(fn, *args) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
        return min(times)

    for bytes_like in (False, True):
        srcs = synthetic(episodes, seed, bytes_like)
        spec = spec_for(srcs, [1, 2, 1, 3, 0.5])
        cost = np.concatenate([s.cost for s in srcs])
        length = np.concatenate([s.length for s in srcs])
        t_single = best(build_plan, cost, length, world, workers)
        t_mix = best(build_mixture_plan, spec, srcs, world, workers)
        p = build_mixture_plan(spec, srcs, world, workers)
        algos = ",".join(sorted({s["algo_used"] for s in p["sources"]}))
        print(
            f"  {'bytes-like' if bytes_like else 'frames'} ({algos}): single root "
            f"{t_single:.2f} s, mixture of 5 {t_mix:.2f} s: {t_mix / t_single:.2f}x"
        )
        t_codec = best(lambda doc: decode_plan(encode_plan(doc)), p)
        print(
            f"    mixture: cost per epoch max/LB "
            f"{p['balance']['plan']['max_over_lower_bound']:.4f}, rate deviation "
            f"{p['draw_rate_deviation']:.4f}, share deviation "
            f"{p['share_deviation']['max_abs']:.2e}, {p['split_episodes']:,} episodes cut; "
            f"encode+decode {t_codec:.2f} s"
        )


def mixture_of(root: str, out: str, weights, balance: str, world: int, workers: int):
    """Write a plan folder for three episode ranges of ``root`` and return it loaded."""
    from episodekit.loaders import load_plan
    from episodekit.metadata.costs import compute_costs

    ds = open_dataset(root, check_files=False)
    n = ds.num_episodes
    cuts = [0, n // 4, n // 2, n]
    doc = {
        "sources": [
            {"root": root, "weight": w, "name": f"part{i}", "episodes": f"{cuts[i]}:{cuts[i + 1]}"}
            for i, w in enumerate(weights)
        ],
        "balance": balance,
    }
    spec = parse_mixture(doc)
    table = compute_costs(ds, "frames")  # in memory: the root is read-only here
    cost_all = table["cost"].to_numpy()
    srcs = []
    for r in resolve_sources(spec):
        pos, unit = rowgroup_units(ds, r.episode_index)
        srcs.append(SourceCosts(r.name, r.episode_index, r.length, cost_all[r.episode_index],
                                pos, unit))  # fmt: skip
    plan = build_mixture_plan(
        spec, srcs, world, workers, locality="rowgroup", fingerprints=[ds.fingerprint] * 3
    )
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "mixture.json"), "w") as fh:
        json.dump(spec.to_dict(), fh, indent=2, sort_keys=True)
    with open(os.path.join(out, f"ws{world}_nw{workers}.json"), "wb") as fh:
        fh.write(encode_plan(plan))
    return load_plan(out, world, workers), ds, cost_all


def part_quotas(root: str, out: str, world: int, workers: int) -> None:
    print(f"== 1. quotas: {root} as three sources (weights 1, 3, 0.5), {world} x {workers} bins")
    from episodekit.loaders import ShardedLoader

    plan, ds, _ = mixture_of(root, os.path.join(out, "quota-plan"), [1, 3, 0.5], "none",
                             world, workers)  # fmt: skip
    t0 = time.perf_counter()
    realized = np.zeros(3, np.int64)
    counts = [np.zeros(ds.num_frames, np.int32) for _ in range(3)]
    max_abs = max_rel = 0.0
    share = plan.quotas / plan.quotas.sum()
    for r in range(world):
        for w in range(workers):
            ld = ShardedLoader(None, plan, rank=r, world_size=world, worker=w, speed=False)
            src, frm = ld.epoch_draws(0)
            c = np.bincount(src, minlength=3)
            realized += c
            bin_share = c / len(src)
            max_abs = max(max_abs, float(np.abs(bin_share - share).max()))
            max_rel = max(max_rel, float((np.abs(bin_share - share) / share).max()))
            for s in range(3):
                np.add.at(counts[s], frm[src == s], 1)
    print(f"  quotas   {plan.quotas.tolist()}")
    print(f"  realized {realized.tolist()}  exact: {realized.tolist() == plan.quotas.tolist()}")
    print(f"  per-bin share deviation from the quota share: max {max_abs:.2e} absolute, "
          f"{max_rel:.2%} relative (bar 1%)")  # fmt: skip
    for s, src in enumerate(plan.sources):
        got = counts[s]
        rate = src["repeats"]
        spec_eps = plan.spec.sources[s].episodes
        rows = ds.episode_rows(np.arange(*spec_eps))
        frm = ds.column("dataset_from_index")[rows]
        ln = ds.column("length")[rows]
        idx = np.concatenate([np.arange(a, a + b) for a, b in zip(frm, ln)])
        vals = got[idx]
        print(f"  {src['name']}: quota/frames {rate:.4f}; per-frame draws min {vals.min()} max "
              f"{vals.max()} mean {vals.mean():.4f}")  # fmt: skip
    print(f"  ({time.perf_counter() - t0:.1f} s to compute every bin's order)")


def part_throughput(root: str, out: str, world: int, workers: int, repeat: int) -> None:
    from episodekit.loaders import ShardedLoader
    from episodekit.metadata.plans.build import plan_for_dataset

    print(f"== 4. loader throughput: rank 0 / worker 0 of {world} x {workers}, rowgroup plans")
    plan, ds, _ = mixture_of(root, os.path.join(out, "speed-plan"), [1, 1, 1], "frames",
                             world, workers)  # fmt: skip
    from episodekit.metadata.costs import compute_costs

    single = Plan(decode_plan(encode_plan(plan_for_dataset(
        ds, compute_costs(ds, "frames"), world, workers, locality="rowgroup"))))  # fmt: skip
    fps = ds.fps
    deltas = {"action": [k / fps for k in range(50)], "observation.state": [-2 / fps, -1 / fps, 0]}

    decoded = {}

    def run(make) -> tuple[float, float, int, float, float]:
        ld = make()
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(len(b["index"]) for b in ld)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()  # epoch 2: pools' pages mapped
        n2 = sum(len(b["index"]) for b in ld)
        wall2, cpu2 = time.perf_counter() - t0, time.process_time() - c0
        # row groups and rows decoded: the read amplification a bin's layout causes
        readers = [f.reader for f in ld.sources] if hasattr(ld, "sources") else [ld.frames.reader]
        decoded["mixture" if hasattr(ld, "sources") else "single"] = (
            sum(r.row_groups_read for r in readers),
            sum(r.rows_decoded for r in readers),
        )
        return n / wall, n / cpu, n, n2 / wall2, n2 / cpu2

    kw = dict(rank=0, world_size=world, worker=0, batch_size=256, delta_timestamps=deltas,
              speed=False)  # fmt: skip
    rounds = []
    for _ in range(repeat):  # interleaved rounds: the machine is shared
        s = run(lambda: ShardedLoader(root, single, **kw))
        m = run(lambda: ShardedLoader(None, plan, **kw))
        rounds.append((s, m))
        print(f"  round: epoch 1 single {s[0]:,.0f} frames/s, mixture {m[0]:,.0f} frames/s: "
              f"wall {m[0] / s[0]:.2f}x, cpu {m[1] / s[1]:.2f}x; epoch 2 single {s[3]:,.0f}, "
              f"mixture {m[3]:,.0f}: wall {m[3] / s[3]:.2f}x, cpu {m[4] / s[4]:.2f}x")  # fmt: skip
    print(f"  single root {rounds[0][0][2]:,} frames, mixture of 3 {rounds[0][1][2]:,} frames "
          f"per epoch; median of {repeat} rounds (bar >= 0.8x):")  # fmt: skip
    for label, w, c in (("epoch 1", 0, 1), ("epoch 2", 3, 4)):
        wall = float(np.median([m[w] / s[w] for s, m in rounds]))
        cpu = float(np.median([m[c] / s[c] for s, m in rounds]))
        best = max(m[w] for _, m in rounds) / max(s[w] for s, _ in rounds)
        print(f"    {label}: {wall:.2f}x wall, {cpu:.2f}x CPU time (best rounds {best:.2f}x)")
    for name, (rgs, rows) in decoded.items():
        frames = rounds[0][0 if name == "single" else 1][2]
        print(f"  {name}: {rgs} row groups read, {rows:,} rows decoded, for {frames:,} frames")


def publish_store(root: str, store: str) -> None:
    """Make ``store`` the default (auto-found) store of ``root`` for this process only: a
    temporary ``$EPISODEKIT_CACHE`` holding a link to it where ``find_store`` looks."""
    import tempfile

    from episodekit.core.store import CACHE_ENV, default_store_dir

    os.environ[CACHE_ENV] = tempfile.mkdtemp(prefix="bench-mixture-cache-")
    where = default_store_dir(open_dataset(root, check_files=False))
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(os.path.abspath(store))
    print(f"frame store {store} published for this run at {where}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(BENCH, "big10m"))
    ap.add_argument("--out", default=os.path.join(BENCH, "mixture-bench"))
    ap.add_argument("--parts", default="1,2,3,4")
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--store",
        help="a frame store of --root (built by `episodekit prep frames --store DIR`): published "
        "in a temporary cache for this run so that both loaders of part 4 read through it",
    )
    a = ap.parse_args()
    if a.store:
        publish_store(a.root, a.store)
    parts = {int(p) for p in a.parts.split(",")}
    print(f"load average {os.getloadavg()[0]:.1f}")
    if 1 in parts:
        part_quotas(a.root, a.out, a.world_size, a.workers)
    if 2 in parts:
        part_balance(a.seed)
    if 3 in parts:
        part_planning(a.episodes, 512, 8, a.repeat, a.seed)
    if 4 in parts:
        part_throughput(a.root, a.out, a.world_size, a.workers, a.repeat)


if __name__ == "__main__":
    main()
