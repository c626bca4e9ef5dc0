"""Issue 36's bars for the per-episode quantile sketches.

1. Overhead on the stats pass (what ``episodekit metadata stats --force --jobs 1`` runs):
   ``compute_stats`` (per-episode stats + dataset, exact, with the sketch points taken and
   spilled) then ``write_stats`` (which publishes the sidecar), against the same pass with the
   points switched off (``blocks.POINTS = 0``: no point gathered, an empty sidecar). The two
   alternate ``--rounds`` times, in this process (jobs=1, so the switch applies), each round
   starting with the other one; every round gives a ratio of CPU seconds (process time: the
   machine is shared, wall time follows the other jobs' load) and of wall seconds, for the
   scan alone and for the whole pass; the medians are reported (bar: <= 1.2x).
2. Peak RSS of ``metadata stats --force --jobs 1`` in a fresh process (``--rss``): the sketch
   points no longer grow the peak with the episodes (run it at two sizes).
3. ``edit --drop-episodes`` of a few episodes of a root with fresh sketches (``--edit``): the
   data-column bytes the stats step reads (only the renumbered index/episode_index/task_index
   of the output: the other quantiles merge the kept episodes' sketches), against the same edit
   of a copy without the sidecar (every numeric column of the output read again), and the
   quantiles' worst rank error in both.

    .venv/bin/python scripts/bench_sketches.py --root DIR [--episodes 6200] [--rounds 3] \
        [--rss] [--edit]

DIR is made with ``episodekit sample --style edited`` when missing (``--episodes`` episodes of
~340 frames: 6,200 is 2.1M frames; 31,000 is 10.4M); run ``episodekit prep rowgroups DIR`` on
it for prepare's 32 MiB row groups.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from episodekit.core.dataset import open_dataset
from episodekit.core.parquet_read import open_data_file
from episodekit.metadata.stats import blocks, compute_stats, ensure_stats, write_stats
from episodekit.metadata.stats.episode_sketch import SKETCHES_FILE


def stats_pass(root: str, sketches: bool) -> dict[str, float]:
    """One stats pass (scan, then write), its CPU and wall seconds, with or without points."""
    real = blocks.POINTS
    if not sketches:
        blocks.POINTS = 0  # no order statistic kept per episode: the pass without sketches
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        res = compute_stats(root, jobs=1)
        c1, t1 = time.process_time(), time.perf_counter()
        write_stats(res, root)
        del res
        c2, t2 = time.process_time(), time.perf_counter()
    finally:
        blocks.POINTS = real
    return {"scan_cpu": c1 - c0, "scan_wall": t1 - t0, "pass_cpu": c2 - c0, "pass_wall": t2 - t0}


def peak_rss(root: str) -> float:
    """Peak RSS (MiB) of a fresh process running the stats pass (jobs=1: all in it)."""
    code = (
        "import resource, sys\n"
        "from episodekit.metadata.stats import ensure_stats\n"
        "ensure_stats(sys.argv[1], force=True, jobs=1)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return int(out.stdout.split()[-1]) / 1024


def column_bytes_read(root: Path, features: list[str]) -> int:
    """Compressed bytes of ``features``' column chunks in ``root``'s data files (what reading
    those columns reads), from the footers."""
    import pyarrow.parquet as pq

    total = 0
    for f in root.glob("data/*/*.parquet"):
        md = pq.ParquetFile(f).metadata
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            for c in range(rg.num_columns):
                col = rg.column(c)
                if col.path_in_schema.split(".list.")[0].split(".element")[0] in features:
                    total += col.total_compressed_size
    return total


def edit_reads(src: Path, out: Path, drop: list[int]) -> tuple[list[str], int, float]:
    """The features whose columns the stats step read, their bytes, and the worst rank error of
    the output's quantiles."""
    from episodekit.metadata.stats import load_lerobot_stats, numeric_features
    from episodekit.metadata.stats.rank import stored_rank_errors
    from episodekit.writers import stats_quantiles
    from episodekit.writers.edit import EditSpec, edit

    shutil.rmtree(out, ignore_errors=True)
    read: list[str] = []
    real = stats_quantiles.compute_stats

    def counted(ds, **kw):
        read.extend(kw["features"])
        return real(ds, **kw)

    stats_quantiles.compute_stats = counted
    try:
        edit(str(src), out, EditSpec(drop_episodes=tuple(drop)))
    finally:
        stats_quantiles.compute_stats = real
    ds = open_dataset(str(out))
    errs = stored_rank_errors(ds, load_lerobot_stats(ds), numeric_features(ds.info))
    worst = max(float(np.max(v)) for per in errs.values() for k, v in per.items() if k != "_rank")
    return sorted(read), column_bytes_read(out, read), worst


def overhead(root: str, rounds: int) -> None:
    """Interleaved rounds of the pass with and without sketches; median per-round ratios."""
    ratios: dict[str, list[float]] = {}
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {on: stats_pass(root, on) for on in order}
        line = []
        for key in ("scan_cpu", "pass_cpu", "scan_wall", "pass_wall"):
            ratios.setdefault(key, []).append(got[True][key] / got[False][key])
            line.append(f"{key} {got[True][key]:.2f}/{got[False][key]:.2f}")
        print(f"round {r + 1} (with/without sketches, s): " + ", ".join(line), flush=True)
    for key, v in ratios.items():
        each = ", ".join(f"{x:.3f}" for x in v)
        print(f"sketch overhead, {key}: median {np.median(v):.3f}x ({each})")
    print("bar: <= 1.2x of the stats pass")


def edit_bench(root: Path, jobs: int) -> None:
    ensure_stats(str(root), force=True, jobs=jobs)  # writes the sidecar
    sidecar = root / SKETCHES_FILE
    data = sum(p.stat().st_size for p in root.glob("data/*/*.parquet"))
    print(f"sidecar: {sidecar.stat().st_size / 2**20:.1f} MiB for {data / 2**20:.0f} MiB of data")
    drop = [1, 2, 3]
    cols_sk, read_sk, err_sk = edit_reads(root, root.parent / "edit-sketched", drop)
    plain = root.parent / "no-sketches"
    shutil.rmtree(plain, ignore_errors=True)
    shutil.copytree(root, plain)
    (plain / SKETCHES_FILE).unlink()
    cols_plain, read_plain, err_plain = edit_reads(plain, root.parent / "edit-plain", drop)
    for what, cols, read, err in (
        ("with sketches", cols_sk, read_sk, err_sk),
        ("without sketches", cols_plain, read_plain, err_plain),
    ):
        print(
            f"edit --drop-episodes 1,2,3 {what}: the stats step read {read / 2**20:.1f} MiB of "
            f"data columns {cols}; worst rank error {err:.4f}"
        )
    for p in (root.parent / "edit-sketched", root.parent / "edit-plain", plain):
        shutil.rmtree(p, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--episodes", type=int, default=6200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rss", action="store_true", help="also the pass's peak RSS")
    ap.add_argument("--edit", action="store_true", help="also the edit's bytes read")
    ap.add_argument("--jobs", type=int, default=2, help="for the edit's writes (the timed pass: 1)")
    a = ap.parse_args()
    root = Path(a.root)
    if not (root / "meta/info.json").exists():
        cmd = [sys.executable, "-m", "episodekit.cli", "sample", str(root), "-n", str(a.episodes)]
        subprocess.run([*cmd, "--style", "edited", "--seed", "36"], check=True)
    ds = open_dataset(str(root))
    rg = 0
    for f in ds.data_files:
        with open_data_file(ds.join(f)) as df:
            rg += df.parquet.metadata.num_row_groups
    print(
        f"root: {ds.num_frames:,} frames, {ds.num_episodes:,} episodes, "
        f"{len(ds.data_files)} data files, {rg} row groups; points per episode {blocks.POINTS}"
    )
    if a.rounds:
        overhead(str(root), a.rounds)
    if a.rss:
        print(f"peak RSS of the stats pass: {peak_rss(str(root)):.0f} MiB")
    if a.edit:
        edit_bench(root, a.jobs)


if __name__ == "__main__":
    main()
