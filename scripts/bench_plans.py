"""Benchmark shard plans: balance against the naive splits, and the time to plan 1M episodes.

Prints, for realistic episode lengths (the sample writer's per-task lognormal lengths) and for
heavy-tailed lognormal lengths (sigma 1):
- max / lower_bound of the plan next to the contiguous and round-robin splits on the same costs,
  with >= 16 episodes per bin (whole episodes) and with ~2 episodes per bin (--split-long);
- the time to build a plan for --episodes episodes into --world-size x --workers bins, as a ratio
  against a plain ``numpy.sort`` of the same costs measured in the same run (the machine is shared
  and noisy: only the ratio is comparable between runs), plus encode/load times and peak RSS.

Usage: .venv/bin/python scripts/bench_plans.py [--episodes 1000000 --world-size 512 --workers 8]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from episodekit.metadata.plans.build import build_plan
from episodekit.metadata.plans.plan_file import decode_plan, encode_plan
from episodekit.sample import SampleSpec, episode_lengths_and_tasks


def realistic(n: int, seed: int) -> np.ndarray:
    return episode_lengths_and_tasks(SampleSpec(episodes=n, tasks=10, seed=seed))[0]


def heavy(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(300), 1.0, n)), 5, None).astype(np.int64)


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def balance_rows(world: int, workers: int, seed: int) -> None:
    bins = world * workers
    print(f"balance, {world} ranks x {workers} workers = {bins} bins (max / lower_bound)")
    print(
        f"  {'lengths':<10}{'eps/bin':>8}{'split':>7}{'plan':>9}{'ranks':>9}{'contig':>9}"
        f"{'rrobin':>9}{'cut eps':>9}{'dropped':>9}"
    )
    for name, gen in (("realistic", realistic), ("lognormal", heavy)):
        for per_bin, split in ((16, False), (64, False), (2, True)):
            lengths = gen(per_bin * bins, seed)
            p = build_plan(lengths, lengths, world, workers, split_long=split)
            b = p["balance"]
            print(
                f"  {name:<10}{per_bin:>8}{'yes' if split else 'no':>7}"
                f"{b['plan']['max_over_lower_bound']:>9.4f}"
                f"{b['plan_ranks']['max_over_lower_bound']:>9.4f}"
                f"{b['contiguous']['max_over_lower_bound']:>9.4f}"
                f"{b['round_robin']['max_over_lower_bound']:>9.4f}"
                f"{p['split_episodes']:>9}{p['dropped_frames'] / p['total_frames']:>9.2%}"
            )


def scale(n: int, world: int, workers: int, seed: int, repeat: int) -> None:
    lengths = heavy(n, seed)
    costs = lengths.astype(np.float64)
    t_sort = best_of(lambda: np.sort(costs), repeat)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    holder = {}

    def run() -> None:
        holder["plan"] = build_plan(costs, lengths, world, workers)

    t_plan = best_of(run, repeat)
    plan = holder["plan"]
    raw = encode_plan(plan)
    t_enc = best_of(lambda: encode_plan(plan), repeat)
    t_dec = best_of(lambda: decode_plan(raw), repeat)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"scale: {n:,} episodes into {world} ranks x {workers} workers "
        f"(algo used {plan['algo_used']['ranks']}), best of {repeat}"
    )
    print(f"  numpy.sort of the costs  {t_sort * 1e3:9.1f} ms   (baseline)")
    print(f"  build_plan               {t_plan * 1e3:9.1f} ms   ratio {t_plan / t_sort:7.1f}x sort")
    print(
        f"  encode plan file         {t_enc * 1e3:9.1f} ms   ratio {t_enc / t_sort:7.1f}x sort "
        f"({len(raw) / 1e6:.1f} MB)"
    )
    print(f"  load (decode) plan file  {t_dec * 1e3:9.1f} ms   ratio {t_dec / t_sort:7.1f}x sort")
    print(
        f"  max/lower_bound {plan['balance']['plan']['max_over_lower_bound']:.6f} "
        f"(contiguous {plan['balance']['contiguous']['max_over_lower_bound']:.4f}, round-robin "
        f"{plan['balance']['round_robin']['max_over_lower_bound']:.4f}); peak RSS growth "
        f"{(rss1 - rss0) / 1024:.0f} MiB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--world-size", type=int, default=512)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--balance-world-size", type=int, default=64)
    ap.add_argument("--balance-workers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    balance_rows(args.balance_world_size, args.balance_workers, args.seed)
    scale(args.episodes, args.world_size, args.workers, args.seed, args.repeat)


if __name__ == "__main__":
    main()
