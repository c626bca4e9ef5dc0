"""Benchmark the runtime loader against a plain in-memory numpy baseline measured in the same run.

    .venv/bin/python scripts/bench_loader.py        # ~45k frames: ds[i], get_batch, sharded 8x2
    .venv/bin/python scripts/bench_loader.py --big  # + peak RSS of open + 100k reads, 10M frames

Work measured (the issue's bar): an action window of 50 frames ([k/fps for k in 0..49]) and a
3-frame state window ([-2/fps, -1/fps, 0]) plus every other non-video feature of the frame.
The baseline holds the same columns fully decoded in memory and does the same clamped windows with
plain numpy fancy indexing (``arr[idx]``): the ratio says how close the loader gets to "everything
already in RAM". The machine is shared and noisy: each figure is the best of ``--repeat`` rounds,
alternating loader and baseline. Samples are written under ``--workdir`` (never in the repo);
the default sample is LeRobot's *recorded* layout (one row group per episode).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy_baseline import window_readers

from episodekit.core.paths import DEFAULT_TARGET_MB

FPS = 30
DELTAS = {
    "action": [k / FPS for k in range(50)],
    "observation.state": [-2 / FPS, -1 / FPS, 0.0],
}


def ensure_sample(path: Path, episodes: int, style: str) -> Path:
    """Write the sample once (reused when its info.json matches)."""
    from episodekit.sample import write_sample

    info = path / "meta/info.json"
    if info.exists():
        got = json.loads(info.read_text())
        if got.get("total_episodes") == episodes and (path / f".style-{style}").exists():
            return path
    t = time.perf_counter()
    write_sample(path, episodes=episodes, tasks=6, style=style, seed=0)
    (path / f".style-{style}").write_text("")
    print(f"wrote {path} ({episodes} episodes, {style}) in {time.perf_counter() - t:.1f} s")
    return path


def in_memory_baseline(root: Path, columns: list[str]):
    """All columns decoded to numpy, plus per-frame episode bounds (O(frames): baseline only)."""
    from episodekit.core.dataset import open_dataset

    ds = open_dataset(str(root))
    table = pa.concat_tables(
        [pq.read_table(ds.data_path(i), columns=columns) for i in range(len(ds.data_files))]
    )
    cols = {}
    for c in columns:
        a = table.column(c).combine_chunks()
        if pa.types.is_fixed_size_list(a.type):
            cols[c] = a.values.to_numpy().reshape(len(a), -1)
        else:
            cols[c] = a.to_numpy()
    length = ds.column("length")
    start = np.repeat(ds.column("dataset_from_index"), length)
    end = np.repeat(ds.column("dataset_to_index"), length)
    return cols, start, end


def best_of(fns: dict, repeat: int) -> dict[str, float]:
    """Best wall time of each function over ``repeat`` alternating rounds."""
    best = {k: float("inf") for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t)
    return best


def bench_random_access(root: Path, reads: int, batches: int, repeat: int) -> dict:
    from episodekit.loaders import FrameDataset

    t = time.perf_counter()
    ds = FrameDataset(root, delta_timestamps=DELTAS)
    open_s = time.perf_counter() - t
    n = len(ds)
    plain = list(ds._plain)
    cols, start, end = in_memory_baseline(root, plain + list(DELTAS))
    offs = {k: np.round(np.asarray(v) * FPS).astype(np.int64) for k, v in DELTAS.items()}
    rng = np.random.default_rng(0)
    idx = rng.integers(0, n, reads).tolist()
    bidx = rng.integers(0, n, (batches, 256))
    ds.get_batch(np.arange(n))  # warm the row-group pool (both sides then work from RAM)

    base_item, base_batch = window_readers(cols, plain, offs, start, end)

    # same values, or the comparison means nothing
    for b in bidx[:3]:
        mine, ref = ds.get_batch(b), base_batch(b)
        for k in ref:
            np.testing.assert_array_equal(mine[k], ref[k])
    for i in idx[:200]:
        mine, ref = ds[i], base_item(i)
        for k in ref:
            np.testing.assert_array_equal(mine[k], ref[k])

    t_item = best_of(
        {"loader": lambda: [ds[i] for i in idx], "numpy": lambda: [base_item(i) for i in idx]},
        repeat,
    )
    t_batch = best_of(
        {
            "loader": lambda: [ds.get_batch(b) for b in bidx],
            "numpy": lambda: [base_batch(b) for b in bidx],
        },
        repeat,
    )
    return {
        "frames": n,
        "episodes": len(ds.episode_index),
        "row_groups": len(ds.reader.rg_start),
        "open_s": round(open_s, 3),
        "getitem_fps": round(reads / t_item["loader"]),
        "getitem_numpy_fps": round(reads / t_item["numpy"]),
        "getitem_ratio": round(t_item["numpy"] / t_item["loader"], 2),
        "batch256_fps": round(bidx.size / t_batch["loader"]),
        "batch256_numpy_fps": round(bidx.size / t_batch["numpy"]),
        "batch256_ratio": round(t_batch["numpy"] / t_batch["loader"], 2),
    }


def bench_sharded(root: Path, world_size: int, num_workers: int) -> dict:
    """Every (rank, worker) of a plan in turn: coverage, overlap, counts, samples/s."""
    from episodekit.loaders import ShardedLoader, load_plan
    from episodekit.metadata.plans.build import ensure_plans

    ensure_plans(str(root), [world_size], num_workers)
    plan = load_plan(str(root), world_size, num_workers)
    seen, counts = [], []
    t = time.perf_counter()
    for rank in range(world_size):
        for w in range(num_workers):
            loader = ShardedLoader(
                root,
                plan,
                rank=rank,
                world_size=world_size,
                worker=w,
                batch_size=256,
                delta_timestamps=DELTAS,
            )
            got = np.concatenate([b["index"] for b in loader])
            counts.append(len(got))
            seen.append(got)
    dt = time.perf_counter() - t
    allv = np.concatenate(seen)
    uniq = len(np.unique(allv))
    return {
        "bins": world_size * num_workers,
        "samples_per_worker": plan.samples_per_worker,
        "equal_counts": len(set(counts)) == 1 and counts[0] == plan.samples_per_worker,
        "overlap": int(len(allv) - uniq),
        "union_equals_plan_minus_trims": uniq
        == int(plan.doc["total_frames"]) - plan.dropped_frames,
        "samples_per_s": round(len(allv) / dt),
    }


RSS_CHILD = r"""
import json, resource, sys, time
import numpy as np
from episodekit.loaders import FrameDataset
def peak_mib():
    # VmHWM, not ru_maxrss: ru_maxrss survives exec and would count the forking parent's RSS
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
root, reads = sys.argv[1], int(sys.argv[2])
fps = 30
deltas = {"action": [k / fps for k in range(50)], "observation.state": [-2 / fps, -1 / fps, 0.0]}
t = time.perf_counter()
ds = FrameDataset(root, delta_timestamps=deltas)
open_s = time.perf_counter() - t
rss_open = peak_mib()
idx = np.random.default_rng(1).integers(0, len(ds), reads).tolist()
t = time.perf_counter()
for i in idx:
    ds[i]
dt = time.perf_counter() - t
print(json.dumps({
    "frames": len(ds), "row_groups": len(ds.reader.rg_start), "open_s": round(open_s, 2),
    "peak_rss_after_open_mib": round(rss_open), "reads": reads,
    "peak_rss_mib": peak_mib(),
    "pool_mib": round(ds.reader.resident_bytes() / 2**20),
    "row_groups_read": ds.reader.row_groups_read, "reads_per_s": round(reads / dt),
}))
"""


def bench_big_rss(root: Path, reads: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, str(root), str(reads)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workdir", default="/tmp/episodekit-bench", help="where samples are written")
    p.add_argument("--episodes", type=int, default=115, help="small sample (~45k frames)")
    p.add_argument("--style", choices=["recorded", "edited"], default="recorded")
    p.add_argument("--reads", type=int, default=50_000, help="random ds[i] calls per round")
    p.add_argument("--batches", type=int, default=200, help="get_batch(256) calls per round")
    p.add_argument("--repeat", type=int, default=3, help="rounds (best is kept)")
    p.add_argument("--big", action="store_true", help="also the 10M-frame peak-RSS run")
    p.add_argument("--big-episodes", type=int, default=24_400, help="~10M frames")
    p.add_argument(
        "--big-target-mb",
        type=float,
        default=DEFAULT_TARGET_MB,
        help="row-group target of the prepared copy measured, prepare's default (0: the recorded "
        "layout as is, "
        "one row group per episode: its 1,700-group footers cost ~12 MiB each when open)",
    )
    p.add_argument("--big-reads", type=int, default=100_000)
    args = p.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)

    small = ensure_sample(work / f"loader-{args.style}-{args.episodes}", args.episodes, args.style)
    res = bench_random_access(small, args.reads, args.batches, args.repeat)
    print(json.dumps({"random_access": res}, indent=1))
    print(
        f"ds[i] (50-frame action + 3-frame state window): {res['getitem_fps']:,} frames/s "
        f"= {res['getitem_ratio']}x in-memory numpy ({res['getitem_numpy_fps']:,}/s)\n"
        f"get_batch(256): {res['batch256_fps']:,} frames/s "
        f"= {res['batch256_ratio']}x in-memory numpy ({res['batch256_numpy_fps']:,}/s)"
    )
    sh = bench_sharded(small, 8, 2)
    print(json.dumps({"sharded_8x2": sh}, indent=1))
    if args.big:
        big = ensure_sample(work / f"loader-big-{args.big_episodes}", args.big_episodes, "recorded")
        if args.big_target_mb > 0:  # the prepared layout: episode-aligned row groups
            prepared = work / f"loader-big-{args.big_episodes}-prep{args.big_target_mb:g}mb"
            if not (prepared / "meta/info.json").exists():
                from episodekit.prep.rowgroups import rewrite_rowgroups

                t = time.perf_counter()
                rewrite_rowgroups(str(big), target_mb=args.big_target_mb, out=str(prepared))
                print(f"prepared {prepared} in {time.perf_counter() - t:.1f} s")
            big = prepared
        rss = bench_big_rss(big, args.big_reads)
        rss["layout"] = f"prep {args.big_target_mb:g} MiB" if args.big_target_mb > 0 else "recorded"
        print(json.dumps({"big_rss": rss}, indent=1))
        print(
            f"{rss['frames']:,}-frame sample ({rss['layout']}): peak RSS {rss['peak_rss_mib']} MiB "
            "after open + "
            f"{rss['reads']:,} random reads (pool {rss['pool_mib']} MiB)"
        )
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of big arrays


if __name__ == "__main__":
    main()
