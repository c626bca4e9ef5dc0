"""No random abort at exit (apache/arrow#34314: a parquet read through a Python object left to an
arrow IO thread aborted 10-25% of runs with "terminate called without an active exception").
Each reading/writing command runs as a user runs it, 50 times in all, on a small prepared sample:
never exit 134, never "terminate called"."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CLI = "import sys; from episodekit.cli import main; sys.argv[0] = 'episodekit'; main()"
RUNS = {  # 50 in all
    "validate": 15,
    "metadata costs": 12,
    "info": 11,
    "prepare": 12,
}


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=300
    )


def test_no_abort_at_exit(make_sample):
    root = str(make_sample(episodes=30, tasks=3, seed=11))
    prep = ["--world-size", "2", "--workers", "2"]
    first = _run(["prepare", root, *prep])
    assert first.returncode == 0, first.stderr
    jobs = []
    for name, n in RUNS.items():
        for i in range(n):
            args = [*name.split(), root]
            if name == "prepare":
                args += [*prep, "--force"] if i % 2 else prep  # --force: every step reads
            if name == "metadata costs" and i % 2:
                args.append("--force")
            jobs.append(args)
    assert len(jobs) == 50
    with ThreadPoolExecutor(2) as pool:  # two at a time; writers queue on the root's lock
        results = list(pool.map(_run, jobs))
    bad = [
        (args, r.returncode, r.stderr[-300:])
        for args, r in zip(jobs, results)
        if r.returncode != 0 or "terminate called" in r.stderr
    ]
    assert bad == []
