"""Benchmark the frame store (``episodekit prep frames``) on a prepared ~10M-frame root.

    .venv/bin/python scripts/bench_store.py --root $EPISODEKIT_BENCH/big10m \\
        --store $EPISODEKIT_BENCH/store-big10m --workdir $EPISODEKIT_BENCH/store-bench

Baselines are measured in the same run (the machine is shared and noisy; best of ``--repeat``):

1. build: ``build_frame_store(--force)`` vs ``pq.read_table`` of the same columns + ``np.save``
   of each (no fsync: what a user would write by hand; the store also msyncs/fsyncs its files
   before publishing, and the figure with an fsync added to the baseline is printed too);
2. random ``get_batch(256)`` and ``ds[i]`` with the 50-frame action + 3-frame state windows
   (every other fixed-width column too) through the store vs plain numpy fancy indexing of the
   same columns fully decoded in RAM, values checked equal first. Both sides warm: the store's
   pages are in the page cache and mapped (a first, cold-mapping round is reported apart);
3. ``RssAnon`` (and file-backed ``RssFile``, from /proc/self/status) of a fresh process after
   opening the store and 100k random ``ds[i]``;
4. ``--procs`` processes reading the store at once: their summed RssAnon, RssFile and the
   proportional shares (Pss) that show one copy of the store in the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from numpy_baseline import window_readers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import DELTAS  # noqa: E402  (the same windows as bench_loader)

# Where scripts/bench_data.py wrote the benchmark roots (EPISODEKIT_BENCH, default ./bench-data).
BENCH = os.environ.get("EPISODEKIT_BENCH", "bench-data")

MIB = 2**20


def best_of(fns: dict, repeat: int) -> tuple[dict[str, float], dict[str, float]]:
    """Best wall time and best CPU time (this process) of each function over ``repeat``
    alternating rounds. On a shared machine the CPU time says what an idle core would do."""
    wall = {k: float("inf") for k in fns}
    cpu = dict(wall)
    for _ in range(repeat):
        for k, fn in fns.items():
            t, c = time.perf_counter(), time.process_time()
            fn()
            wall[k] = min(wall[k], time.perf_counter() - t)
            cpu[k] = min(cpu[k], time.process_time() - c)
    return wall, cpu


def status_mib(pid: str = "self") -> dict[str, int]:
    """RssAnon, RssFile, VmHWM (MiB) from /proc/<pid>/status; Pss_Anon/Pss_File from
    smaps_rollup when readable."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        key = line.split(":")[0]
        if key in ("RssAnon", "RssFile", "RssShmem", "VmHWM", "VmRSS"):
            out[key] = round(int(line.split()[1]) / 1024)
    try:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            key = line.split(":")[0]
            if key in ("Pss_Anon", "Pss_File"):
                out[key] = round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    return out


# -- 1. build ----------------------------------------------------------------------------------


def baseline_build(root: Path, columns: list[str], out: Path, fsync: bool) -> float:
    """pq.read_table of the columns, then np.save of each as one array."""
    from episodekit.core.dataset import open_dataset

    ds = open_dataset(str(root))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t = time.perf_counter()
    table = pq.read_table([ds.data_path(i) for i in range(len(ds.data_files))], columns=columns)
    for c in columns:
        a = table.column(c).combine_chunks()
        if pa.types.is_fixed_size_list(a.type):
            a = a.flatten().to_numpy().reshape(len(table), -1)
        else:
            a = a.to_numpy()
        path = out / f"{c}.npy"
        np.save(path, a)
        if fsync:
            with open(path, "rb+") as fh:
                os.fsync(fh.fileno())
    dt = time.perf_counter() - t
    del table
    pa.default_memory_pool().release_unused()
    return dt


class _PeakAnon:
    """Samples this process's RssAnon every 50 ms while the ``with`` block runs."""

    def __enter__(self):
        import threading

        self.mib, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.mib = max(self.mib, status_mib()["RssAnon"])
            self._stop.wait(0.05)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.mib = max(self.mib, status_mib()["RssAnon"])


def bench_build(root: Path, store: Path, work: Path, repeat: int) -> dict:
    from episodekit.core.dataset import open_dataset
    from episodekit.core.store import expected_columns
    from episodekit.prep.frames import build_frame_store

    columns = list(expected_columns(open_dataset(str(root))))
    best = {"store": float("inf"), "baseline": float("inf"), "baseline_fsync": float("inf")}
    report = None
    for _ in range(repeat):
        best["baseline"] = min(best["baseline"], baseline_build(root, columns, work / "np", False))
        peak = _PeakAnon()
        t = time.perf_counter()
        with peak:
            report = build_frame_store(str(root), store=str(store), force=True)
        best["store"] = min(best["store"], time.perf_counter() - t)
        best["peak_anon"] = max(best.get("peak_anon", 0), peak.mib)
        best["baseline_fsync"] = min(
            best["baseline_fsync"], baseline_build(root, columns, work / "np", True)
        )
    shutil.rmtree(work / "np", ignore_errors=True)
    return {
        "columns": columns,
        "frames": report.frames,
        "store_mib": round(report.bytes / MIB),
        "store_s": round(best["store"], 2),
        "store_peak_rss_anon_mib": best["peak_anon"],
        "baseline_s": round(best["baseline"], 2),
        "baseline_fsync_s": round(best["baseline_fsync"], 2),
        "ratio": round(best["store"] / best["baseline"], 2),
        "ratio_vs_fsynced_baseline": round(best["store"] / best["baseline_fsync"], 2),
    }


# -- 2. random access --------------------------------------------------------------------------


def bench_random(root: Path, store: Path, reads: int, batches: int, repeat: int) -> dict:
    from episodekit.core.dataset import open_dataset
    from episodekit.loaders import FrameDataset

    ds = FrameDataset(root, delta_timestamps=DELTAS, store=str(store))
    n = len(ds)
    plain = list(ds._plain)
    fps = ds.fps
    offs = {k: np.round(np.asarray(v) * fps).astype(np.int64) for k, v in DELTAS.items()}
    rng = np.random.default_rng(0)
    idx = rng.integers(0, n, reads).tolist()
    bidx = rng.integers(0, n, (batches, 256))

    # cold mapping: the store is in the page cache (just built), but not mapped in this process
    t = time.perf_counter()
    for b in bidx:
        ds.get_batch(b)
    cold_batch_fps = bidx.size / (time.perf_counter() - t)

    # the baseline: the same columns fully decoded in RAM (anonymous memory), episode bounds
    meta = open_dataset(str(root))
    cols = {c: np.array(a) for c, a in ds.store.columns.items() if c in plain + list(DELTAS)}
    length = meta.column("length")
    start = np.repeat(meta.column("dataset_from_index"), length)
    end = np.repeat(meta.column("dataset_to_index"), length)
    for a in ds.store.columns.values():  # warm: every page of the store mapped
        for i in range(0, len(a), 1 << 20):
            a[i : i + (1 << 20)].sum()

    base_item, base_batch = window_readers(cols, plain, offs, start, end)

    for b in bidx[:5]:  # same values, or the comparison means nothing
        mine, ref = ds.get_batch(b), base_batch(b)
        for k in ref:
            np.testing.assert_array_equal(mine[k], ref[k])
    for i in idx[:500]:
        mine, ref = ds[i], base_item(i)
        for k in ref:
            np.testing.assert_array_equal(mine[k], ref[k])
    t_batch, c_batch = best_of(
        {
            "store": lambda: [ds.get_batch(b) for b in bidx],
            "numpy": lambda: [base_batch(b) for b in bidx],
        },
        repeat,
    )
    t_item, c_item = best_of(
        {"store": lambda: [ds[i] for i in idx], "numpy": lambda: [base_item(i) for i in idx]},
        repeat,
    )
    return {
        "frames": n,
        "batch256_fps": round(bidx.size / t_batch["store"]),
        "batch256_numpy_fps": round(bidx.size / t_batch["numpy"]),
        "batch256_ratio": round(t_batch["numpy"] / t_batch["store"], 2),
        "batch256_cold_mapping_fps": round(cold_batch_fps),
        "getitem_fps": round(reads / t_item["store"]),
        "getitem_numpy_fps": round(reads / t_item["numpy"]),
        "getitem_ratio": round(t_item["numpy"] / t_item["store"], 2),
        "cpu_time": {  # frames per CPU-second of this process (what an idle core would do)
            "batch256_fps": round(bidx.size / c_batch["store"]),
            "batch256_numpy_fps": round(bidx.size / c_batch["numpy"]),
            "getitem_fps": round(reads / c_item["store"]),
            "getitem_numpy_fps": round(reads / c_item["numpy"]),
        },
        "load_avg_1min": os.getloadavg()[0],
    }


# -- 3./4. memory of reader processes -----------------------------------------------------------

CHILD = r"""
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[4])
from bench_store import status_mib
from bench_loader import DELTAS
from episodekit.loaders import FrameDataset
root, store, reads = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.perf_counter()
ds = FrameDataset(root, delta_timestamps=DELTAS, store=store)
open_s = time.perf_counter() - t
after_open = status_mib()
idx = np.random.default_rng(int(sys.argv[5])).integers(0, len(ds), reads).tolist()
t = time.perf_counter()
for i in idx:
    ds[i]
dt = time.perf_counter() - t
print(json.dumps({"open_s": round(open_s, 2), "after_open": after_open, "reads": reads,
                  "reads_per_s": round(reads / dt), "after_reads": status_mib()}), flush=True)
if sys.argv[6] == "wait":
    sys.stdin.read()  # stay alive (mappings held) until the parent has measured everyone
"""


def bench_rss(root: Path, store: Path, reads: int) -> dict:
    here = str(Path(__file__).resolve().parent)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(root), str(store), str(reads), here, "1", "exit"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_procs(root: Path, store: Path, procs: int, reads: int) -> dict:
    here = str(Path(__file__).resolve().parent)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), str(store), str(reads), here, str(j), "wait"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for j in range(procs)
    ]
    rows = [json.loads(c.stdout.readline()) for c in children]
    live = [status_mib(str(c.pid)) for c in children]  # all alive and mapped at this moment
    for c in children:
        c.stdin.close()
        c.wait()
    tot = lambda key: sum(r.get(key, 0) for r in live)  # noqa: E731
    return {
        "procs": procs,
        "reads_each": reads,
        "rss_anon_sum_mib": tot("RssAnon"),
        "rss_anon_max_mib": max(r["RssAnon"] for r in live),
        "rss_file_sum_mib": tot("RssFile"),
        "pss_anon_sum_mib": tot("Pss_Anon"),
        "pss_file_sum_mib": tot("Pss_File"),
        "reads_per_s_each": sorted(r["reads_per_s"] for r in rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--root", default=os.path.join(BENCH, "big10m"), help="a prepared ~10M-frame root"
    )
    p.add_argument("--store", default=os.path.join(BENCH, "store-big10m"), help="store directory")
    p.add_argument("--workdir", default=os.path.join(BENCH, "store-bench"), help="baseline output")
    p.add_argument("--repeat", type=int, default=2, help="rounds (best is kept)")
    p.add_argument("--reads", type=int, default=50_000, help="random ds[i] per round")
    p.add_argument("--batches", type=int, default=200, help="random get_batch(256) per round")
    p.add_argument("--rss-reads", type=int, default=100_000)
    p.add_argument("--procs", type=int, default=16)
    p.add_argument("--proc-reads", type=int, default=20_000, help="random ds[i] per process")
    p.add_argument("--skip-build", action="store_true", help="reuse the store at --store")
    args = p.parse_args()
    root, store, work = Path(args.root), Path(args.store), Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    if not args.skip_build:
        b = results["build"] = bench_build(root, store, work, args.repeat)
        print(json.dumps({"build": b}, indent=1), flush=True)
    r = results["random"] = bench_random(root, store, args.reads, args.batches, args.repeat)
    print(json.dumps({"random": r}, indent=1), flush=True)
    m = results["rss"] = bench_rss(root, store, args.rss_reads)
    print(json.dumps({"rss": m}, indent=1), flush=True)
    q = results["procs"] = bench_procs(root, store, args.procs, args.proc_reads)
    print(json.dumps({"procs": q}, indent=1), flush=True)

    print(f"\n{r['frames']:,} frames, 50-frame action + 3-frame state windows")
    if "build" in results:
        b = results["build"]
        print(
            f"build: {b['store_s']} s for {b['store_mib']} MiB = {b['ratio']}x pq.read_table + "
            f"np.save ({b['baseline_s']} s; {b['ratio_vs_fsynced_baseline']}x with fsync, "
            f"{b['baseline_fsync_s']} s)  [bar <= 1.5x]; peak RssAnon while building "
            f"{b['store_peak_rss_anon_mib']} MiB"
        )
    print(
        f"get_batch(256): {r['batch256_fps']:,} frames/s = {r['batch256_ratio']}x numpy in RAM "
        f"({r['batch256_numpy_fps']:,}/s; cold mapping {r['batch256_cold_mapping_fps']:,}/s)"
        "  [bar >= 0.8x]"
    )
    print(
        f"ds[i]: {r['getitem_fps']:,} frames/s = {r['getitem_ratio']}x numpy "
        f"({r['getitem_numpy_fps']:,}/s)  [bar >= 50,000/s]"
    )
    c = r["cpu_time"]
    print(
        f"  per CPU-second (load average {r['load_avg_1min']:.1f} on {os.cpu_count()} cores): "
        f"get_batch {c['batch256_fps']:,} frames (numpy {c['batch256_numpy_fps']:,}), "
        f"ds[i] {c['getitem_fps']:,} (numpy {c['getitem_numpy_fps']:,})"
    )
    a = m["after_reads"]
    print(
        f"one process, {m['reads']:,} random ds[i]: RssAnon {a['RssAnon']} MiB, RssFile "
        f"{a['RssFile']} MiB (file-backed, shared)  [bar RssAnon <= 300 MiB]"
    )
    print(
        f"{q['procs']} processes: RssAnon sum {q['rss_anon_sum_mib']} MiB (max "
        f"{q['rss_anon_max_mib']}), RssFile sum {q['rss_file_sum_mib']} MiB, Pss_File sum "
        f"{q['pss_file_sum_mib']} MiB  [bar RssAnon sum <= {q['procs'] * 300} MiB]"
    )
    (work / "results.json").write_text(json.dumps(results, indent=1))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown of big arrays


if __name__ == "__main__":
    main()
