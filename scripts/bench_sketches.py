"""Issue 36's bars for the per-episode quantile sketches.

1. Overhead on the stats pass: ``compute_stats`` (exact, per-episode stats + dataset) with the
   sketch points taken (what ships) vs the same pass with them switched off, alternated
   ``--repeat`` times on the same root; the ratio of the best times (bar: <= 1.2x).
2. ``edit --drop-episodes`` of a few episodes of a root with fresh sketches: the data-column
   bytes the stats step reads (only the renumbered index/episode_index/task_index of the output:
   the other quantiles merge the kept episodes' sketches), against the same edit of a copy
   without the sidecar (every numeric column of the output read again), and the quantiles'
   worst rank error in both.

    .venv/bin/python scripts/bench_sketches.py --root DIR [--episodes 5000] [--repeat 3]

DIR is made with ``episodekit sample`` when missing (``--episodes`` episodes of ~400 frames:
5,000 is ~2M frames).
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
from episodekit.metadata.stats import blocks, compute_stats, ensure_stats
from episodekit.metadata.stats.episode_sketch import SKETCHES_FILE


def stats_pass(root: str, sketches: bool, jobs: int) -> float:
    real = blocks.POINTS
    if not sketches:
        blocks.POINTS = 0  # no order statistic kept per episode: the pass as it was
    try:
        t0 = time.perf_counter()
        compute_stats(root, jobs=jobs)
        return time.perf_counter() - t0
    finally:
        blocks.POINTS = real


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--root", required=True)
    ap.add_argument("--episodes", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2, help="for the writes (the timed pass: 1)")
    a = ap.parse_args()
    root = Path(a.root)
    if not (root / "meta/info.json").exists():
        cmd = [sys.executable, "-m", "episodekit.cli", "sample", str(root), "-n", str(a.episodes)]
        subprocess.run([*cmd, "--style", "edited", "--seed", "36"], check=True)
    ds = open_dataset(str(root))
    print(f"root: {ds.num_frames:,} frames, {ds.num_episodes:,} episodes")
    on, off = [], []
    for _ in range(a.repeat):
        off.append(stats_pass(str(root), False, 1))  # jobs=1: the switch applies in-process
        on.append(stats_pass(str(root), True, 1))
    print(
        f"stats pass without sketches: best {min(off):.2f} s ({', '.join(f'{t:.2f}' for t in off)})"
    )
    print(
        f"stats pass with sketches:    best {min(on):.2f} s ({', '.join(f'{t:.2f}' for t in on)})"
    )
    print(f"sketch overhead: {min(on) / min(off):.3f}x (bar <= 1.2x)")
    ensure_stats(str(root), force=True, jobs=a.jobs)  # writes the sidecar
    sidecar = root / SKETCHES_FILE
    print(f"sidecar: {sidecar.stat().st_size / 2**20:.1f} MiB")
    data = sum(p.stat().st_size for p in root.glob("data/*/*.parquet"))
    drop = [1, 2, 3]
    cols_sk, read_sk, err_sk = edit_reads(root, root.parent / "edit-sketched", drop)
    plain = root.parent / "no-sketches"
    shutil.rmtree(plain, ignore_errors=True)
    shutil.copytree(root, plain)
    (plain / SKETCHES_FILE).unlink()
    cols_plain, read_plain, err_plain = edit_reads(plain, root.parent / "edit-plain", drop)
    print(f"data files: {data / 2**20:.0f} MiB")
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


if __name__ == "__main__":
    main()
