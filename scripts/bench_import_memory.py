"""``episodekit import``'s peak memory at two numbers of episodes, in one run: is it flat?

    .venv/bin/python scripts/bench_import_memory.py [--small 1000] [--large 4000] [--steps 100]
        [--work DIR] [-- IMPORT_ARGS ...]

Writes two ALOHA sources with :mod:`make_aloha_source` (h5py; kept in ``--work`` to reuse),
imports each under :mod:`peak_rss` (the whole process tree, polled every 20 ms) with ``--fps
50`` and ``IMPORT_ARGS``, and prints both peaks and their ratio (the bar: <= 1.1). Memory is
bounded by one row group (``target_mb``, 32 MiB of rows) or one data file (``--data-mb``) when
smaller: at 100 steps an episode both sizes are past it, so the ratio shows what grows with the
episodes alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_aloha_source import make_source  # noqa: E402


def peak(src: Path, out: Path, extra: list[str]) -> dict:
    """Peak RSS (MiB) and wall time of one import, from peak_rss.py --json."""
    shutil.rmtree(out, ignore_errors=True)
    exe = str(Path(sys.executable).parent / "episodekit")
    cmd = [sys.executable, str(HERE / "peak_rss.py"), "--json", "--", exe, "import", str(src)]
    cmd += ["--out", str(out), "--fps", "50", *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--large", type=int, default=4000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--work", default=None, help="where the sources go (default: a temp dir)")
    a = ap.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-import-mem-"))
    peaks = {}
    for n in (a.small, a.large):
        src = work / f"aloha-{n}x{a.steps}"
        if not (src / f"episode_{n - 1}.hdf5").exists():
            make_source(src, n, a.steps)
        r = peak(src, work / f"out-{n}x{a.steps}", extra)
        peaks[n] = r
        mib, secs = r["tree_mib"], r["seconds"]
        print(f"{n} episodes x {a.steps} steps: peak {mib:.1f} MiB in {secs:.1f}s", flush=True)
    ratio = peaks[a.large]["tree_mib"] / peaks[a.small]["tree_mib"]
    print(f"ratio {a.large}/{a.small} episodes: {ratio:.3f} (bar: <= 1.1)")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
