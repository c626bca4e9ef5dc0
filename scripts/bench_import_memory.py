"""``episodekit import``'s peak memory at two numbers of episodes, in one run: is it flat?

    .venv/bin/python scripts/bench_import_memory.py [--small 1000] [--large 4000] [--steps 100]
        [--work DIR] [--base PYTHON] [-- IMPORT_ARGS ...]

Writes two ALOHA sources with :mod:`make_aloha_source` (h5py; kept in ``--work`` to reuse),
imports each under :mod:`peak_rss` (the whole process tree, polled every 20 ms) with ``--fps
50`` and ``IMPORT_ARGS``, and prints both peaks and their ratio (the bar: <= 1.1). Memory is
bounded by one row group (``target_mb``, 32 MiB of rows) or one data file (``--data-mb``) when
smaller: at 100 steps an episode both sizes are past it, so the ratio shows what grows with the
episodes alone.

Each peak comes with what it was made of (each process's RSS at that moment, the import's own
first) and each process's own peak: the import's (``driver``) and the spawned children's (the
camera processes, ``writers/camera_encoder.py``). ``--base PYTHON``: the
same imports, interleaved in the same run, with another install's ``episodekit`` (the
``episodekit`` next to that interpreter: e.g. the base commit's venv), both ratios printed;
the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_aloha_source import make_source  # noqa: E402


def peak(src: Path, out: Path, extra: list[str], python: str = sys.executable) -> dict:
    """Peak RSS (MiB) and wall time of one import (``python``'s ``episodekit``), from
    peak_rss.py --json."""
    shutil.rmtree(out, ignore_errors=True)
    exe = str(Path(python).parent / "episodekit")
    cmd = [sys.executable, str(HERE / "peak_rss.py"), "--json", "--", exe, "import", str(src)]
    cmd += ["--out", str(out), "--fps", "50", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def _line(side: str, n: int, steps: int, r: dict) -> str:
    kids = ", ".join(
        f"{mib:.1f}" for name, mib in r["processes"] if name == "multiprocessing.spawn"
    )
    at = " + ".join(f"{mib:.1f}" for _, mib in r["tree_at_peak"])
    return (
        f"{side:<5} {n} episodes x {steps} steps: peak {r['tree_mib']:.1f} MiB in "
        f"{r['seconds']:.1f}s (= {at}: the import's process first; own peaks: driver "
        f"{r['driver_mib']:.1f}, spawned children [{kids}])"
    )


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--work", default=None, help="where the sources go (default: a temp dir)")
    ap.add_argument("--base", default=None, help="another install's python, measured beside")
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-import-mem-"))
    sides = {"this": sys.executable, **({"base": a.base} if a.base else {})}
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    peaks: dict[str, dict[int, dict]] = {side: {} for side in sides}
    for n in (a.small, a.large):
        src = work / f"aloha-{n}x{a.steps}"
        if not (src / f"episode_{n - 1}.hdf5").exists():
            make_source(src, n, a.steps)
        for side, python in sorted(sides.items()):  # base first, then this
            r = peak(src, work / f"out-{n}x{a.steps}", extra, python)
            peaks[side][n] = r
            print(_line(side, n, a.steps, r), flush=True)
    for side in sorted(sides):
        ratio = peaks[side][a.large]["tree_mib"] / peaks[side][a.small]["tree_mib"]
        print(f"{side:<5} ratio {a.large}/{a.small} episodes: {ratio:.3f} (bar: <= 1.1)")
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
