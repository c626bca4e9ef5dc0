"""Mixture stats from the sources' sketches against reading the data (issue 36).

A sample root (``episodekit sample``) is given its stats and sketches (``metadata stats``), then
mixed as two sources (its first and second half of episodes, weights 3 and 1, ``balance:
frames``). Interleaved rounds of :func:`compute_mixture_stats` with ``quantiles="exact"`` (every
source read) and ``"sketch"`` (sources with fresh sketches not read) report wall and CPU time,
the bytes the process read (``/proc/self/io`` rchar: data, sidecar and metadata alike) and, for
the sketch run, the worst distance in weighted rank of every quantile key of ``action`` and
``observation.state`` from the exact one (numpy over the frames, each weighing quota / frames).

    .venv/bin/python scripts/bench_mixture_stats.py --dir /tmp/mixbench --episodes 6000 --rounds 2

The root is made once under ``--dir`` (reused when its marker is there); remove ``--dir`` after.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core.dataset import open_dataset
from episodekit.metadata.mixture.stats import compute_mixture_stats
from episodekit.metadata.stats import QUANTILE_KEYS, QUANTILES, ensure_stats
from episodekit.sample import write_sample

CHECKED = ("action", "observation.state")


def _rchar() -> int:
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


def _root(base: Path, episodes: int) -> Path:
    root = base / "src"
    done = base / ".bench-ready"
    if not done.exists():
        t0 = time.perf_counter()
        write_sample(root, episodes=episodes, seed=1, force=True)
        t1 = time.perf_counter()
        ensure_stats(str(root), force=True)
        t2 = time.perf_counter()
        print(f"made {root}: sample {t1 - t0:.1f} s, metadata stats + sketches {t2 - t1:.1f} s")
        done.write_text("ok\n")
    return root


def _values(root: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    ds = open_dataset(str(root))
    t = pa.concat_tables(pq.read_table(ds.join(f), columns=[name, "episode_index"])
                         for f in ds.data_files)  # fmt: skip
    col = t[name].combine_chunks()
    x = col.values.to_numpy().reshape(t.num_rows, -1).astype(np.float64)
    return x, t["episode_index"].to_numpy()


def _worst_weighted_rank(root: Path, res, half: int) -> dict[str, float]:
    """Per checked feature, the worst |weighted rank - q| over keys and dimensions."""
    quota = [row["quota"] for row in res.meta["sources"]]
    out = {}
    for name in CHECKED:
        x, ep = _values(root, name)
        first = ep < half
        w = np.where(first, quota[0] / first.sum(), quota[1] / (~first).sum())
        total = w.sum()
        worst = 0.0
        for key, q in zip(QUANTILE_KEYS, QUANTILES):
            v = np.asarray(res.stats[name][key], np.float64)
            below = (w[:, None] * (x < v)).sum(0) / total
            at_most = (w[:, None] * (x <= v)).sum(0) / total
            worst = max(worst, float(np.max(np.maximum(0, np.maximum(below - q, q - at_most)))))
        out[name] = worst
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--episodes", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    root = _root(args.dir, args.episodes)
    ds = open_dataset(str(root))
    half = ds.num_episodes // 2
    spec = {
        "sources": [
            {"root": str(root), "weight": 3, "episodes": f"0:{half}", "name": "first"},
            {"root": str(root), "weight": 1, "episodes": f"{half}:{ds.num_episodes}",
             "name": "second"},
        ],
        "balance": "frames",
    }  # fmt: skip
    print(f"{ds.num_frames:,} frames, {ds.num_episodes:,} episodes, pid {os.getpid()}")
    runs: dict[str, list[tuple[float, float, int]]] = {"exact": [], "sketch": []}
    last = {}
    for r in range(args.rounds):
        for mode in ("exact", "sketch"):
            b0, c0, t0 = _rchar(), time.process_time(), time.perf_counter()
            res = compute_mixture_stats(spec, quantiles=mode)
            wall, cpu, read = time.perf_counter() - t0, time.process_time() - c0, _rchar() - b0
            runs[mode].append((wall, cpu, read))
            last[mode] = res
            reads = [row["read"] for row in res.meta["sources"]]
            print(f"round {r} {mode:>6}: {wall:7.2f} s wall {cpu:7.2f} s CPU "
                  f"{read / 2**20:9.1f} MiB read, sources read {reads}")  # fmt: skip
    ex = np.median(np.array(runs["exact"]), 0)
    sk = np.median(np.array(runs["sketch"]), 0)
    print(f"median exact : {ex[0]:.2f} s wall, {ex[1]:.2f} s CPU, {ex[2] / 2**20:.1f} MiB read")
    print(f"median sketch: {sk[0]:.2f} s wall, {sk[1]:.2f} s CPU, {sk[2] / 2**20:.1f} MiB read")
    print(f"sketch / exact: {sk[0] / ex[0]:.3f}x wall, {sk[1] / ex[1]:.3f}x CPU, "
          f"{sk[2] / max(ex[2], 1):.4f}x bytes read")  # fmt: skip
    bound = {n: last["sketch"].meta["features"][n]["rank_error"] for n in CHECKED}
    print(
        f"sketch worst weighted rank error {_worst_weighted_rank(root, last['sketch'], half)} "
        f"(recorded bound {bound}); exact "
        f"{_worst_weighted_rank(root, last['exact'], half)}"
    )


if __name__ == "__main__":
    main()
