"""Benchmark: per-episode speed buckets for 1M episodes (the loader's start-up lookup).

Compares ``episode_buckets`` (one searchsorted over all tasks' boundaries) with, measured in the
same run: a plain ``np.searchsorted`` of the same lengths into a single boundary array (the floor:
one task, no per-task lookup), and the obvious per-episode Python loop over ``bucket`` (timed on a
slice, scaled). Also times ``compute_speed_rows`` against one ``np.percentile`` call per task.
Nothing is written.

    .venv/bin/python scripts/bench_speed.py [--episodes 1000000] [--tasks 1,100,10000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset
from episodekit.metadata.speed import bucket, compute_speed_rows, episode_buckets


def synthetic(n: int, tasks: int, seed: int = 0) -> Dataset:
    """An in-memory Dataset with ``n`` episodes over ``tasks`` tasks (lognormal lengths)."""
    rng = np.random.default_rng(seed)
    task_of = rng.integers(0, tasks, n)
    medians = rng.uniform(50, 2000, tasks)
    lengths = np.maximum(5, np.round(rng.lognormal(np.log(medians[task_of]), 0.4))).astype(np.int64)
    names = pa.array([f"task {t}" for t in range(tasks)])
    ends = np.cumsum(lengths)
    episodes = pa.table(
        {
            "episode_index": np.arange(n, dtype=np.int64),
            "length": lengths,
            "dataset_from_index": ends - lengths,
            "dataset_to_index": ends,
            "tasks": pa.ListArray.from_arrays(
                pa.array(np.arange(n + 1, dtype=np.int32)), names.take(task_of)
            ),
            "task_index": task_of.astype(np.int64),
        }
    )
    table = pa.table({"task_index": np.arange(tasks, dtype=np.int64), "task": names})
    return Dataset("memory://bench", None, "/bench", {"fps": 30}, table, episodes)


def per_task_percentiles(ds: Dataset) -> list:
    """Baseline for compute_speed_rows: group with numpy, one np.percentile call per task."""
    ti, length = ds.column("task_index"), ds.column("length")
    order = np.argsort(ti, kind="stable")
    tasks, start = np.unique(ti[order], return_index=True)
    groups = np.split(length[order], start[1:])
    return [np.percentile(g, np.arange(5, 100, 10)).tolist() for g in groups]


def best(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(n: int, tasks: int, loop_sample: int) -> None:
    """Time the lookup and its baselines for ``n`` episodes over ``tasks`` tasks; print one line."""
    ds = synthetic(n, tasks)
    t_rows = best(lambda: compute_speed_rows(ds), repeat=3)
    rows = compute_speed_rows(ds)
    lengths = ds.column("length")
    one = np.asarray(rows[0]["percentiles"])
    t_vec = best(lambda: episode_buckets(ds, rows))
    t_floor = best(lambda: np.searchsorted(one, lengths, side="right") * 10)
    by_task = {r["task_index"]: r["percentiles"] for r in rows}
    ti = ds.column("task_index")[:loop_sample].tolist()
    ln = lengths[:loop_sample].tolist()
    t_loop = best(lambda: [bucket(x, by_task.get(t)) for t, x in zip(ti, ln)], repeat=1)
    t_loop *= n / len(ln)
    t_pct = best(lambda: per_task_percentiles(ds), repeat=3)
    print(
        f"tasks {tasks:>6}: episode_buckets {t_vec * 1e3:7.1f} ms | single searchsorted "
        f"{t_floor * 1e3:6.1f} ms (x{t_vec / t_floor:.1f} of the floor) | per-episode loop "
        f"~{t_loop:6.2f} s (x{t_loop / t_vec:,.0f} slower)\n"
        f"{'':14}compute_speed_rows {t_rows * 1e3:7.1f} ms | np.percentile per task "
        f"{t_pct * 1e3:7.1f} ms (x{t_pct / t_rows:.1f} of compute_speed_rows)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=1_000_000)
    ap.add_argument("--tasks", default="1,100,10000")
    ap.add_argument("--loop-sample", type=int, default=50_000, help="episodes timed in the loop")
    args = ap.parse_args()
    print(f"{args.episodes:,} episodes; best of 5 runs; ratios against baselines timed in this run")
    for tasks in (int(t) for t in args.tasks.split(",")):
        measure(args.episodes, tasks, args.loop_sample)


if __name__ == "__main__":
    main()
