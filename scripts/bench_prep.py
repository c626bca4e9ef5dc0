"""Benchmark `prep rowgroups`: throughput vs a plain pyarrow read+write, memory, reader benefit.

Everything is written under --dir (default /tmp/episodekit-bench-prep); nothing goes into the repo.

1. Throughput on an edited-style (one huge row group per file) multi-file dataset of >= 2 GiB
   uncompressed: the rewrite (verification on, --out to a fresh folder) vs a baseline of
   pyarrow read_table + write_table of the same files (default settings, no verification, no
   alignment) with the same number of processes, measured in the same run, alternating rounds.
   MiB/s = source uncompressed bytes (footer) / wall seconds. The ratio is what counts: the
   machine is shared and noisy.
2. Peak RSS of rewriting one file whose single row group is ~1 GiB uncompressed (fresh process).
3. The reader's benefit: time and peak RSS to read one episode's rows with
   pq.read_table(filters=[("episode_index", "==", e)]) in a fresh process, before and after.

Usage: .venv/bin/python scripts/bench_prep.py [--small] [--workers N] [--rounds 2]
Generation time is not measured.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from episodekit.core.dataset import open_dataset
from episodekit.core.executor import default_workers, map_files
from episodekit.core.footer import file_layout
from episodekit.sample import write_sample

MIB = 1024 * 1024


def uncompressed_bytes(root: Path) -> tuple[list[str], int]:
    ds = open_dataset(str(root))
    total = sum(int(file_layout(str(root / f)).row_group_bytes.sum()) for f in ds.data_files)
    return ds.data_files, total


def _baseline_one(args: tuple[str, str]) -> None:
    src, dst = args
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(src), dst)


def run_baseline(root: Path, files: list[str], out: Path, workers: int) -> float:
    shutil.rmtree(out, ignore_errors=True)
    jobs = [(str(root / f), str(out / f)) for f in files]
    t0 = time.perf_counter()
    map_files(_baseline_one, jobs, workers=workers)
    return time.perf_counter() - t0


def run_rewrite(root: Path, out: Path, workers: int, target_mb: float) -> float:
    from episodekit.prep import rewrite_rowgroups

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    report = rewrite_rowgroups(str(root), target_mb=target_mb, out=str(out), workers=workers)
    seconds = time.perf_counter() - t0
    if not report.ok:
        raise SystemExit(f"rewrite failed: {[r.reason for r in report.failed]}")
    return seconds


def child(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (it sets ``out``); return ``out`` + peak RSS in MiB."""
    wrapper = (
        "import json, time\n"
        + code
        # VmHWM (peak resident set of this process image): unlike ru_maxrss it starts afresh at
        # exec, so the parent's memory at fork time does not leak into the figure.
        + "\nhwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
        "out['peak_rss_mib'] = int(hwm.split()[1]) / 1024\n"
        "print(json.dumps(out))\n"
    )
    res = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(res.stderr)
    return json.loads(res.stdout.strip().splitlines()[-1])


def read_episode(path: Path, episode: int) -> dict:
    return child(
        "import pyarrow.parquet as pq\n"
        f"t0 = time.perf_counter()\n"
        f"t = pq.read_table({str(path)!r}, filters=[('episode_index', '==', {episode})])\n"
        "out = {'seconds': time.perf_counter() - t0, 'rows': t.num_rows}\n"
    )


def rewrite_rss(root: Path, out: Path, target_mb: float) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    return child(
        "from episodekit.prep import rewrite_rowgroups\n"
        "t0 = time.perf_counter()\n"
        f"r = rewrite_rowgroups({str(root)!r}, target_mb={target_mb}, out={str(out)!r}, "
        "workers=1)\n"
        "assert r.ok, [f.reason for f in r.failed]\n"
        "out = {'seconds': time.perf_counter() - t0}\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dir", default="/tmp/episodekit-bench-prep")
    p.add_argument("--small", action="store_true", help="Quick smoke run (~100 MiB).")
    p.add_argument("--workers", type=int, default=default_workers())
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-mb", type=float, default=32.0)
    p.add_argument("--keep", action="store_true", help="Keep the generated data.")
    a = p.parse_args()
    base = Path(a.dir)
    base.mkdir(parents=True, exist_ok=True)
    dims = dict(state_dim=64, action_dim=64)
    # 548 bytes per frame; ~300 frames per episode.
    multi_eps, big_eps, file_mb = (700, 500, 20) if a.small else (13500, 7500, 100)
    big_file_mb = 100 if a.small else 1250
    target_mb = 4.0 if a.small else a.target_mb

    multi = base / "multi"
    big = base / "big"
    t0 = time.perf_counter()
    if not (multi / "meta/info.json").exists() or a.small != (multi / ".small").exists():
        write_sample(
            multi, episodes=multi_eps, style="edited", data_files_size_in_mb=file_mb, seed=3, **dims
        )
        if a.small:
            (multi / ".small").touch()
    if not (big / "meta/info.json").exists() or a.small != (big / ".small").exists():
        write_sample(
            big, episodes=big_eps, style="edited", data_files_size_in_mb=big_file_mb, seed=4, **dims
        )
        if a.small:
            (big / ".small").touch()
    files, total = uncompressed_bytes(multi)
    big_files, big_total = uncompressed_bytes(big)
    print(f"generated in {time.perf_counter() - t0:.0f}s (not measured)")
    print(f"multi: {len(files)} files, {total / MIB:,.0f} MiB uncompressed (footer), edited style")
    print(
        f"big:   {len(big_files)} file(s), largest row group "
        f"{max(file_layout(str(big / f)).row_group_bytes.max() for f in big_files) / MIB:,.0f}"
        " MiB uncompressed"
    )
    print(f"workers {a.workers}, target {target_mb} MiB, rounds {a.rounds}\n")

    # 1. throughput, alternating rounds (warm page cache for both)
    base_s, prep_s = [], []
    for r in range(a.rounds):
        base_s.append(run_baseline(multi, files, base / "baseline_out", a.workers))
        prep_s.append(run_rewrite(multi, base / "prep_out", a.workers, target_mb))
        print(
            f"round {r + 1}: baseline {total / MIB / base_s[-1]:6.0f} MiB/s ({base_s[-1]:.1f} s)"
            f"   prep rowgroups {total / MIB / prep_s[-1]:6.0f} MiB/s ({prep_s[-1]:.1f} s)"
            f"   ratio {base_s[-1] / prep_s[-1]:.2f}"
        )
    b, q = statistics.median(base_s), statistics.median(prep_s)
    print(
        f"median: baseline {total / MIB / b:.0f} MiB/s, prep rowgroups {total / MIB / q:.0f} MiB/s,"
        f" ratio prep/baseline = {b / q:.2f}; median of per-round ratios "
        f"{statistics.median(x / y for x, y in zip(base_s, prep_s)):.2f} (target >= 0.8)\n"
    )

    # 2. peak memory rewriting one giant row group
    m = rewrite_rss(big, base / "big_out", target_mb)
    print(
        f"rewrite of a {big_total / MIB:,.0f} MiB single-row-group file: peak RSS "
        f"{m['peak_rss_mib']:.0f} MiB (bar: < 400), {m['seconds']:.1f} s\n"
    )

    # 3. reader benefit on the big file: one episode from the middle
    rel = big_files[0]
    meta = pq.read_metadata(big / rel)
    ep_stats = meta.row_group(0).column(meta.schema.names.index("episode_index")).statistics
    episode = (int(ep_stats.min) + int(ep_stats.max)) // 2
    before = read_episode(big / rel, episode)
    after = read_episode(base / "big_out" / rel, episode)
    assert before["rows"] == after["rows"] > 0
    print(f"read episode {episode} ({before['rows']} rows) of {rel}:")
    print(
        f"  before (1 row group):   {before['seconds'] * 1000:8.1f} ms, "
        f"peak RSS {before['peak_rss_mib']:6.0f} MiB"
    )
    print(
        f"  after ({pq.read_metadata(base / 'big_out' / rel).num_row_groups} row groups): "
        f"{after['seconds'] * 1000:8.1f} ms, peak RSS {after['peak_rss_mib']:6.0f} MiB"
    )
    print(
        f"  speed-up x{before['seconds'] / after['seconds']:.0f}, "
        f"memory x{before['peak_rss_mib'] / after['peak_rss_mib']:.1f} less"
    )
    for d in ("baseline_out", "prep_out", "big_out"):
        shutil.rmtree(base / d, ignore_errors=True)
    if not a.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
