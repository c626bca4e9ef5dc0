"""Benchmark: normalization statistics on a 10M-frame root (bars of issue 18), same run.

1. time: ``compute_stats`` (exact mode, default jobs) against a plain duckdb scan of the same
   columns (``SELECT min, max, avg, stddev_pop`` of every dimension), same run; peak RSS of the
   whole process tree (parent + workers, sampled every 50 ms) of the stats run;
2. exactness: every dataset quantile equals ``numpy.quantile`` over the full column (exact mode);
   in a forced-sketch run, the observed rank error of every quantile against the stated bound;
3. merging: stats of two halves (by data file) merged with ``merge_stats`` + the exact selection
   equal the whole's; LeRobot's envelope rule (min of q<=50, max of q>50) on the halves does not.

Nothing under ROOT is written (``compute_stats`` only computes). The root must be a copy you may
read (e.g. meta/ copied and data files hard-linked into $EPISODEKIT_BENCH/stats-root).

    .venv/bin/python scripts/bench_stats.py [--root $EPISODEKIT_BENCH/stats-root] [--jobs 2]
                                            [--timing-only] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import duckdb
import numpy as np
import psutil
import pyarrow.parquet as pq

from episodekit.core.dataset import open_dataset
from episodekit.metadata.stats import (
    QUANTILE_KEYS,
    QUANTILES,
    compute_stats,
    merge_stats,
    numeric_features,
    refine_quantiles,
)

# Where scripts/bench_data.py wrote the benchmark roots (EPISODEKIT_BENCH, default ./bench-data).
BENCH = os.environ.get("EPISODEKIT_BENCH", "bench-data")

CHILD = """
import json, sys, time
from episodekit.metadata.stats import compute_stats

t0 = time.perf_counter()
r = compute_stats(sys.argv[1], quantiles=sys.argv[2], jobs=int(sys.argv[3]) or None)
print(json.dumps({"seconds": time.perf_counter() - t0, "mode": r.mode, "rank_error": r.rank_error}))
"""


def run_measured(root: str, quantiles: str, jobs: int) -> dict:
    """Run compute_stats in a child process; wall time and peak RSS of the process tree."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, root, quantiles, str(jobs)],
        stdout=subprocess.PIPE,
        text=True,
    )
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            tree = [ps, *ps.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    out = json.loads(proc.stdout.read().strip().splitlines()[-1])
    out["peak_rss_mib"] = peak / 2**20
    return out


def children_cpu() -> float:
    """CPU seconds (user + system) of every waited-for child process so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def duckdb_scan(root: str, feats: dict[str, int]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the plain duckdb scan, in this process."""
    exprs = []
    for n, d in feats.items():
        cols = [f'"{n}"[{j + 1}]' for j in range(d)] if d > 1 else [f'"{n}"']
        for c in cols:
            exprs += [f"min({c})", f"max({c})", f"avg({c})", f"stddev_pop({c})"]
    con = duckdb.connect()
    t0, c0 = time.perf_counter(), self_cpu()
    con.execute(
        f"SELECT {', '.join(exprs)} FROM read_parquet('{root}/data/*/*.parquet')"
    ).fetchall()
    return time.perf_counter() - t0, self_cpu() - c0


def column(ds, name: str, dims: int) -> np.ndarray:
    """A whole feature column (rows, dims) in its stored dtype, file by file."""
    parts = []
    for rel in ds.data_files:
        col = pq.read_table(ds.join(rel), columns=[name]).column(name).combine_chunks()
        flat = col.values if hasattr(col, "values") and dims > 1 else col
        parts.append(np.asarray(flat.to_numpy(zero_copy_only=False)).reshape(-1, dims))
    return np.concatenate(parts)


def envelope(a: np.ndarray, b: np.ndarray, key: str) -> np.ndarray:
    """LeRobot's aggregate_feature_stats rule for quantiles: min for q<=50, max above."""
    return np.minimum(a, b) if int(key[1:]) <= 50 else np.maximum(a, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--root", default=os.path.join(BENCH, "stats-root"))
    ap.add_argument("--jobs", type=int, default=0, help="processes (0: number of cores)")
    ap.add_argument("--timing-only", action="store_true", help="only the time and memory bars")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the time and memory bars")
    args = ap.parse_args()
    root = args.root
    ds = open_dataset(root)
    feats = numeric_features(ds.info)
    dims = sum(feats.values())
    print(
        f"root {root}: {ds.num_frames:,} frames, {ds.num_episodes:,} episodes, "
        f"{len(ds.data_files)} data files, {len(feats)} numeric features ({dims} dimensions)"
    )

    # 1. time and memory, same run (duckdb before and after each of ours; the better of the two).
    # Wall time on a shared machine swings with the load, so CPU seconds are reported too, and
    # --repeat gives several rounds (each ratio against the duckdb runs around it).
    w_prev, c_prev = duckdb_scan(root, feats)
    for rnd in range(args.repeat):
        c_before = children_cpu()
        exact = run_measured(root, "exact", args.jobs)
        c_ours = children_cpu() - c_before
        w2, c2 = duckdb_scan(root, feats)
        t_duck, c_duck = min(w_prev, w2), min(c_prev, c2)
        ratio = exact["seconds"] / t_duck
        tag = f"[round {rnd + 1}] " if args.repeat > 1 else ""
        print(
            f"{tag}duckdb SELECT min,max,avg,stddev_pop of {dims} dims: {w_prev:.1f}s / {w2:.1f}s "
            f"wall, {c_prev:.1f}s / {c2:.1f}s CPU; load {os.getloadavg()[0]:.2f}"
        )
        print(
            f"{tag}compute_stats exact (all stats, per episode + dataset): "
            f"{exact['seconds']:.1f}s wall = {ratio:.2f}x duckdb  "
            f"[bar <= 2x: {'PASS' if ratio <= 2 else 'FAIL'}]; "
            f"{c_ours:.1f}s CPU = {c_ours / c_duck:.2f}x duckdb's CPU"
        )
        print(
            f"{tag}peak RSS (parent + workers): {exact['peak_rss_mib']:.0f} MiB  "
            f"[bar <= 1024: {'PASS' if exact['peak_rss_mib'] <= 1024 else 'FAIL'}]"
        )
        w_prev, c_prev = w2, c2
    if args.timing_only:
        return

    # 2. exactness (in this process; nothing measured here is timed)
    res = compute_stats(root, quantiles="exact", jobs=args.jobs or None)
    sk = compute_stats(root, quantiles="sketch", jobs=args.jobs or None)
    worst_exact = 0.0
    unequal = 0
    worst_ratio = 0.0
    for n, d in feats.items():
        col = column(ds, n, d)
        bound = sk.rank_error[n] * ds.num_frames
        for j in range(d):
            x = np.sort(col[:, j].astype(np.float64))
            ref = np.quantile(x, QUANTILES)
            got = res.dataset[n].quantiles[:, j]
            unequal += int(np.sum(got != ref))
            worst_exact = max(worst_exact, float(np.max(np.abs(got - ref))))
            for i, q in enumerate(QUANTILES):
                h = (len(x) - 1) * q
                for v in (sk.dataset[n].quantiles[i, j],):
                    lo = np.searchsorted(x, v, side="left")
                    hi = np.searchsorted(x, v, side="right") - 1
                    err = 0.0 if lo <= h <= hi + 1 else min(abs(h - lo), abs(h - hi - 1))
                    worst_ratio = max(worst_ratio, err / max(bound, 1e-12))
        del col
    print(
        f"exact mode: {unequal} of {5 * dims} dataset quantiles differ from numpy.quantile "
        f"(max |diff| {worst_exact:g})  [bar 0: {'PASS' if unequal == 0 else 'FAIL'}]"
    )
    eps = max(sk.rank_error.values())
    print(
        f"sketch mode: stated rank-error bound {eps:.2e} x N ({eps * ds.num_frames:,.0f} ranks); "
        f"worst observed / bound = {worst_ratio:.3f}  "
        f"[bar <= 1: {'PASS' if worst_ratio <= 1 else 'FAIL'}]"
    )

    # 3. halves (by data file) merged vs the whole, and the envelope rule
    fid = ds.column("file_id")
    ep = ds.column("episode_index")
    half = len(ds.data_files) // 2
    if half == 0:
        print("one data file: no halves to merge")
        return
    a = compute_stats(root, quantiles="exact", episodes=ep[fid < half], jobs=args.jobs or None)
    b = compute_stats(root, quantiles="exact", episodes=ep[fid >= half], jobs=args.jobs or None)
    merged = refine_quantiles(root, merge_stats([a.dataset, b.dataset]), jobs=args.jobs or None)
    q_diff = mean_diff = std_diff = env_diff = 0.0
    q_unequal = env_unequal = other = 0
    for n in feats:
        w, m = res.dataset[n], merged[n]
        q_unequal += int(np.sum(w.quantiles != m.quantiles))
        q_diff = max(q_diff, float(np.max(np.abs(w.quantiles - m.quantiles))))
        mean_diff = max(mean_diff, float(np.max(np.abs(w.mean - m.mean) / (1 + np.abs(w.mean)))))
        std_diff = max(std_diff, float(np.max(np.abs(w.std - m.std) / (1 + np.abs(w.std)))))
        other += int(np.sum(w.min != m.min) + np.sum(w.max != m.max) + (w.count != m.count))
        for i, key in enumerate(QUANTILE_KEYS):
            env = envelope(a.dataset[n].quantiles[i], b.dataset[n].quantiles[i], key)
            env_unequal += int(np.sum(env != w.quantiles[i]))
            env_diff = max(env_diff, float(np.max(np.abs(env - w.quantiles[i]))))
    ok = q_unequal == 0 and other == 0 and mean_diff < 1e-12 and std_diff < 1e-12
    print(
        f"halves merged (Chan + merged summaries + exact selection) vs whole: "
        f"{q_unequal} quantiles differ (max |diff| {q_diff:g}), mean rel diff {mean_diff:.1e}, "
        f"std rel diff {std_diff:.1e}, min/max/count mismatches {other}  "
        f"[bar same: {'PASS' if ok else 'FAIL'}]"
    )
    print(
        f"halves by LeRobot's envelope rule vs whole: {env_unequal} of {5 * dims} quantiles "
        f"differ (max |diff| {env_diff:g})"
    )


if __name__ == "__main__":
    main()
