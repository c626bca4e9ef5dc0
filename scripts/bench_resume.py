"""Benchmark elastic resume: exactness across world-size changes, and the cost of resuming.

Part 1 (simulation, global positions; every canonical bin's stream is a bijection of its
samples, so positions exact means frames exact): a canonical plan over --episodes episodes
(realistic lengths, default C for that count), one epoch on 8 ranks x 2 DataLoader workers
stopped after a random number of steps (--stops points), every worker's state saved as a
StatefulDataLoader would (the steps that worker yielded), merged, and resumed on 6 x 2, 16 x 1,
4 x 4 and 8 x 2. For each run: duplicates and losses over (before + after) against the epoch
set, samples per rank after the resize (all equal?), and whether every global step window
(one round: C x micro_batch samples) holds the same samples as in the run without a resize.
Then the same with ragged stops (every rank at its own random sample, not a step boundary) and
a chain of three resizes in one epoch: losses stay 0, duplicates equal the padding the layout
reports (at most W' - 1 per resize).

Part 2 (resume cost): a canonical plan over 1M episodes and 4096 bins synthesized in memory;
8 ranks stopped at ragged points; time and traced memory (tracemalloc peak) of what
``load_state_dict`` does on 6 ranks (merge 8 states, plan identity, the new run's layout), and
of computing rank 0's first step of frame indices after it (bin orders of its bins). Baseline in
the same run: ``np.argsort`` of the 1M episode lengths.

Part 3 (optional, ``--root``): the loader on a prepared root with a canonical plan: rank 0 of 8
streaming through the frame store against ``get_frames`` of the same batches, and a resume.

Usage: .venv/bin/python scripts/bench_resume.py [--episodes 4000] [--stops 20] [--big-episodes
1000000 --big-bins 4096] [--root ROOT --store STORE --steps 200 --only-root]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from episodekit.loaders.elastic import (
    GlobalOrder,
    RunLayout,
    bin_frames,
    merge_states,
    resume_point,
)
from episodekit.loaders.sharded import BinLayout, BinOrder
from episodekit.metadata.plans.canonical import build_canonical_plan, default_canonical_bins
from episodekit.metadata.plans.plan_file import Plan
from episodekit.sample import SampleSpec, episode_lengths_and_tasks

TARGETS = ((6, 2), (16, 1), (4, 4), (8, 2))


def state(order: GlobalOrder, run: RunLayout, rank: int, consumed: list, epoch: int = 0) -> dict:
    """A per-rank (or per-worker) state as ElasticLoader.state_dict() writes it."""
    return {
        "format": "episodekit.elastic_state",
        "version": 1,
        "plan": "bench",
        "seed": 0,
        "canonical_bins": order.num_bins,
        "samples_per_bin": order.samples_per_bin,
        "micro_batch": order.micro_batch,
        "pool_rows": 1,
        "epoch": epoch,
        "frontier": run.frontier,
        "ahead": run.ahead.tolist(),
        "world_size": run.world_size,
        "rank": rank,
        "consumed": consumed,
    }


def worker_states(order: GlobalOrder, run: RunLayout, workers: int, steps: int) -> list[dict]:
    """Every worker's state after ``steps`` steps: worker w yielded steps w, w + K, ... < steps."""
    out = []
    for r in range(run.world_size):
        for w in range(workers):
            units = range(w, min(steps, run.num_units), workers)
            rg = [[int(run.unit_start[u]), int(run.unit_start[u + 1])] for u in units]
            out.append(state(order, run, r, rg))
    return out


def steps_of(run: RunLayout, first: int = 0, last: int | None = None) -> list[np.ndarray]:
    """The job's steps [first, last) of a run: step k = unit k of every rank, as a sorted set."""
    last = run.num_units if last is None else last
    return [
        np.sort(np.concatenate([run.unit_positions(r, k) for r in range(run.world_size)]))
        for k in range(first, last)
    ]


def whole_windows(order: GlobalOrder, steps: list[np.ndarray]) -> bool:
    """Whether every step holds exactly whole step windows: window t is the global positions
    [t * window, (t + 1) * window), whatever ran it, so a step is right when its positions are
    such a range (one window; ``g`` consecutive ones in the fallback)."""
    for p in steps:
        lo, hi = int(p[0]), int(p[-1]) + 1
        if lo % order.window or (hi % order.window and hi != order.total):
            return False
        if len(p) != hi - lo or not np.array_equal(p, np.arange(lo, hi)):
            return False
    return True


def count(order: GlobalOrder, parts: list[np.ndarray]) -> tuple[int, int]:
    """(duplicates, losses) of the yielded positions against the epoch set."""
    allp = np.concatenate(parts)
    seen = np.bincount(allp, minlength=order.total)
    return int(np.clip(seen - 1, 0, None).sum()), int((seen == 0).sum())


def part1(episodes: int, stops: int, seed: int) -> bool:
    lengths = episode_lengths_and_tasks(SampleSpec(episodes=episodes, tasks=10, seed=seed))[0]
    c = default_canonical_bins(episodes)
    plan = build_canonical_plan(lengths, lengths, c)
    order = GlobalOrder(c, plan["samples_per_worker"], 1, plan["policy"])
    print(
        f"part 1: {episodes:,} episodes, {int(lengths.sum()):,} frames, C = {c} canonical bins "
        f"(default), {order.samples_per_bin:,} samples per bin, epoch {order.total:,} samples, "
        f"step window {order.window} samples; plan max/lower bound "
        f"{plan['balance']['plan']['max_over_lower_bound']:.4f}"
    )
    base = RunLayout(order, 8)
    reference = steps_of(base)
    ok = whole_windows(order, reference)
    rng = np.random.default_rng(seed)
    points = np.sort(rng.choice(np.arange(1, base.num_units), size=stops, replace=False))
    print(
        f"  8 x 2 run: {base.num_units} steps of {base.share} samples per rank; stops at steps "
        f"{points.tolist()}"
    )
    print(
        f"  {'resume on':<10}{'runs':>5}{'dups':>6}{'losses':>7}{'per rank equal':>15}"
        f"{'worker spread':>14}{'whole windows':>14}{'max s':>8}"
    )
    for w2, k2 in TARGETS:
        dups = losses = 0
        equal = same = True
        spread, tmax = 0, 0.0
        for s in points.tolist():
            before = [base.positions(r, 0, int(base.unit_start[s])) for r in range(8)]
            t0 = time.perf_counter()
            merged = merge_states(worker_states(order, base, 2, s))
            run = RunLayout(order, w2, merged["frontier"], np.asarray(merged["ahead"], np.int64))
            tmax = max(tmax, time.perf_counter() - t0)
            after = [run.positions(r) for r in range(w2)]
            d, lo = count(order, before + after)
            dups, losses = dups + d, losses + lo
            equal &= len({len(a) for a in after}) == 1
            per_worker = [
                sum(int(run.unit_sizes[u]) for u in range(w, run.num_units, k2)) for w in range(k2)
            ]
            spread = max(spread, max(per_worker) - min(per_worker))
            job = reference[:s] + steps_of(run)
            same &= whole_windows(order, job)
            if w2 == 8:  # same world size: the very same steps as without the stop
                same &= len(job) == len(reference) and all(
                    np.array_equal(a, b) for a, b in zip(job, reference)
                )
        ok &= dups == 0 and losses == 0 and equal and same
        print(
            f"  {f'{w2} x {k2}':<10}{stops:>5}{dups:>6}{losses:>7}{str(equal):>15}"
            f"{spread:>14}{str(same):>14}{tmax:>8.4f}"
        )
    # Ragged stops and chains of resizes: no loss; duplicates only the reported padding.
    lost = dup_extra = pads = 0
    for trial in range(stops):
        run, before = base, []
        shapes = [TARGETS[(trial + i) % len(TARGETS)][0] for i in range(3)]
        for w2 in shapes:
            stop = rng.integers(0, run.per_rank + 1, size=run.world_size)
            before += [run.positions(r, 0, int(stop[r])) for r in range(run.world_size)]
            states = [state(order, run, r, [[0, int(stop[r])]]) for r in range(run.world_size)]
            merged = merge_states(states)
            run = RunLayout(order, w2, merged["frontier"], np.asarray(merged["ahead"], np.int64))
            pads += run.repeats
        after = [run.positions(r) for r in range(run.world_size)]
        d, lo = count(order, before + after)
        lost += lo
        dup_extra += d
    ok &= lost == 0 and dup_extra <= pads
    print(
        f"  ragged stops (every rank at its own random sample), 3 resizes per epoch, {stops} "
        f"epochs: losses {lost}, duplicates {dup_extra} <= padding the layouts reported ({pads})"
    )
    return ok


def synthetic_layout(lengths: np.ndarray, rows_per_rg: int):
    first = np.cumsum(lengths) - lengths
    rg_start = np.arange(0, int(lengths.sum()), rows_per_rg, dtype=np.int64)
    rg_rows = np.diff(np.r_[rg_start, lengths.sum()])
    return np.arange(len(lengths)), lengths, first, rg_start, rg_rows


def part2(episodes: int, bins: int, seed: int) -> bool:
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(300), 0.6, episodes)), 5, None).astype(np.int64)
    first = np.cumsum(lengths) - lengths
    t0 = time.perf_counter()  # rowgroup locality over 250k-row groups, as prepare writes
    doc = build_canonical_plan(
        lengths, lengths, bins, locality="rowgroup", position=first, unit=first // 250_000
    )
    t_plan = time.perf_counter() - t0
    order = GlobalOrder(bins, doc["samples_per_worker"], 1, doc["policy"])
    digest = Plan(doc).digest
    old = RunLayout(order, 8)
    t0 = time.perf_counter()
    np.argsort(lengths)
    t_base = time.perf_counter() - t0
    ep_bytes = 8 * len(lengths)
    print(
        f"part 2: {episodes:,} episodes, {bins} canonical bins (plan built in memory in "
        f"{t_plan:.1f} s), epoch {order.total:,} samples; 8 ranks stopped, resumed on 6; "
        f"baseline np.argsort of the {episodes:,} lengths: {t_base:.3f} s"
    )
    ok = True
    step = int(old.share)
    mid = old.num_units // 2
    scenarios = {
        # DDP: every rank within 3 steps of the others, mid-step (prefetch, uneven saves)
        "ranks within 3 steps, mid-step": mid * step + rng.integers(0, 3 * step, size=8),
        # adversarial: ranks anywhere in the first half of the epoch
        "ranks anywhere in half the epoch": rng.integers(0, old.per_rank // 2, size=8),
    }
    for name, stop in scenarios.items():
        states = [{**state(order, old, r, [[0, int(stop[r])]]), "plan": digest} for r in range(8)]
        tracemalloc.start()
        t0 = time.perf_counter()
        plan = Plan(doc)  # a fresh Plan: its digest (the identity check) is computed here
        identity = {**{k: states[0][k] for k in states[0] if k != "plan"}, "plan": plan.digest}
        epoch, frontier, ahead, _, _ = resume_point(states, identity, order, 6, 0)
        run = RunLayout(order, 6, frontier, ahead)
        t_load = time.perf_counter() - t0
        _, peak_load = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        ep, ln, first, rg_start, rg_rows = synthetic_layout(lengths, 250_000)
        positions = run.unit_positions(0, 0)
        c, j = order.locate(positions)
        frames = np.empty(len(c), np.int64)
        for b in np.unique(c).tolist():
            layout = BinLayout(plan.bin_items(b, 0), ep, ln, first, rg_start, rg_rows)
            sel = c == b
            frames[sel] = bin_frames(BinOrder(layout, 0, epoch, b, 262_144), j[sel])
        t_first = time.perf_counter() - t0
        _, peak_first = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        ok &= t_load <= 1.0
        print(
            f"  {name}: load_state_dict (merge 8 states, plan identity, layout on 6 ranks) "
            f"{t_load:.3f} s = {t_load / t_base:.1f}x baseline; traced peak "
            f"{peak_load / 2**20:.1f} MiB = {peak_load / ep_bytes:.2f}x 8 bytes per episode; "
            f"state: {len(ahead)} intervals ahead, head {run.head_n:,} samples, padding "
            f"{run.repeats}"
        )
        print(
            f"    then rank 0's first step ({len(frames):,} frames from {len(np.unique(c))} "
            f"bins, bin orders built): {t_first:.3f} s, traced peak {peak_first / 2**20:.1f} MiB"
        )
    return ok


def part3(root: str, store: str | None, steps: int) -> None:
    """The loader on a real root: rank 0 of 8 for ``steps`` steps, 50-frame action + 3-frame
    state windows, against ``get_frames`` of the same frames (same FrameDataset, same run);
    then a resume on 6 ranks from 8 merged states: load_state_dict and the first batch."""
    from episodekit.loaders import ElasticLoader, load_canonical_plan

    plan = load_canonical_plan(root)
    fps = 30
    kw = dict(
        delta_timestamps={
            "action": [k / fps for k in range(50)],
            "observation.state": [-2 / fps, -1 / fps, 0.0],
        },
        speed=False,
        store=store or "auto",
    )
    lo = ElasticLoader(root, plan, rank=0, world_size=8, **kw)
    print(
        f"part 3: {root}: C = {plan.num_bins}, {lo.order.total:,} samples per epoch, rank 0 of 8: "
        f"{lo.run.share} samples per step, store {'yes' if lo.frames.store is not None else 'no'}"
    )
    it = iter(lo)
    next(it)  # bin orders of its bins (once per epoch)
    t0 = time.perf_counter()
    got = [next(it)["index"] for _ in range(steps)]
    t_el = time.perf_counter() - t0
    frames = np.concatenate(got)
    t0 = time.perf_counter()
    for g in got:
        lo.frames.get_frames(g)
    t_read = time.perf_counter() - t0
    print(
        f"  {len(frames):,} frames in {steps} steps: {len(frames) / t_el:,.0f} frames/s = "
        f"{t_read / t_el:.2f}x get_frames of the same batches ({len(frames) / t_read:,.0f}/s)"
    )
    states = [
        ElasticLoader(root, plan, rank=r, world_size=8, **kw).state_at(steps + r % 3)
        for r in range(8)
    ]
    new = ElasticLoader(root, plan, rank=0, world_size=6, **kw)
    t0 = time.perf_counter()
    new.load_state_dict(states)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    first = next(iter(new))
    t_first = time.perf_counter() - t0
    print(
        f"  resume on 6 ranks from 8 ragged states: load_state_dict {t_load:.3f} s, first batch "
        f"({len(first['index'])} frames) {t_first:.2f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=4000)
    ap.add_argument("--stops", type=int, default=20)
    ap.add_argument("--big-episodes", type=int, default=1_000_000)
    ap.add_argument("--big-bins", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--root", help="also measure the loader on this root (with a canonical plan)")
    ap.add_argument("--store", help="frame store for --root (default: the cached one if fresh)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--only-root", action="store_true", help="only the --root part")
    args = ap.parse_args()
    if args.root:
        part3(args.root, args.store, args.steps)
        if args.only_root:
            return
    ok1 = part1(args.episodes, args.stops, args.seed)
    ok2 = part2(args.big_episodes, args.big_bins, args.seed)
    print(
        f"bars: exact resume {'met' if ok1 else 'NOT met'}; "
        f"load <= 1 s {'met' if ok2 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
