"""Benchmark: `validate` on a ~10M-frame sample vs a bare duckdb `SELECT count(*)` of its files.

Writes the sample once under /tmp (reused when present; ~40-60 s to write), then times, in the
same run: the bare count(*) scan, the full validation (all checks), and the validation of the
data checks with --deep. Prints seconds and ratios against the bare scan (the machine is shared
and noisy: the ratio is the figure to compare, the bar is <= 30 s absolute).

    .venv/bin/python scripts/bench_validate.py [--root /tmp/ekval/bench10m] [--repeat 2]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import duckdb

from episodekit.core.dataset import read_info
from episodekit.sample import write_sample
from episodekit.validate.runner import validate

SPEC = {"episodes": 25_000, "tasks": 8, "seed": 7, "mean_length": 345}


def ensure_sample(root: Path) -> None:
    if (root / "meta/info.json").exists() and read_info(str(root))["total_episodes"] == 25_000:
        return
    t0 = time.perf_counter()
    write_sample(root, **SPEC)
    print(f"wrote sample {root} in {time.perf_counter() - t0:.1f}s")


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/tmp/ekval/bench10m")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    root = Path(args.root)
    ensure_sample(root)
    info = read_info(str(root))
    files = sorted(str(p) for p in root.glob("data/*/*.parquet"))
    size = sum(Path(f).stat().st_size for f in files) / 2**20
    print(
        f"sample: {info['total_frames']:,} frames, {info['total_episodes']:,} episodes, "
        f"{len(files)} data files, {size:.0f} MiB"
    )

    def count() -> int:
        con = duckdb.connect()
        return con.sql(f"SELECT count(*) FROM read_parquet({files!r})").fetchall()[0][0]

    def count_columns() -> int:
        # Forces every column's pages to be read and decoded (count(*) alone reads footers only).
        con = duckdb.connect()
        cols = 'count(action), count("observation.state"), max(timestamp), max(index)'
        return con.sql(f"SELECT {cols} FROM read_parquet({files!r})").fetchall()[0][0]

    t_count, n = best(count, args.repeat)
    t_cols, _ = best(count_columns, args.repeat)
    t_val, report = best(lambda: validate(str(root)), args.repeat)
    t_deep, deep = best(lambda: validate(str(root), checks="data", deep=True), args.repeat)
    assert n == info["total_frames"]
    print(f"bare duckdb SELECT count(*)          {t_count:7.2f} s   1.0x")
    print(f"duckdb count of every column         {t_cols:7.2f} s  {t_cols / t_count:5.1f}x")
    print(
        f"validate (all checks)                {t_val:7.2f} s  {t_val / t_count:5.1f}x  "
        f"({t_val / t_cols:.1f}x the full-column scan; {len(report.errors)} errors, "
        f"{len(report.warnings)} layout warnings)"
    )
    print(
        f"validate --checks data --deep        {t_deep:7.2f} s  {t_deep / t_count:5.1f}x  "
        f"({len(deep.errors)} errors)"
    )
    print(f"bar: <= 30 s -> {'PASS' if t_val <= 30 else 'FAIL'}")


if __name__ == "__main__":
    main()
