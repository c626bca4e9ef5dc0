"""Peak resident memory of a command and of every process it starts (Ray workers included).

    .venv/bin/python scripts/peak_rss.py [--json] -- COMMAND [ARG ...]

Polls the process tree every 20 ms with psutil and prints the driver's peak RSS (the command's
own process), the largest peak of any Ray worker process (``ray::...``: one runs the tasks), of
any other child (Ray's own daemons: gcs, raylet, ...), and the wall time. Polling can miss a
spike shorter than the interval; the figures are lower bounds of the true peaks by that much.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import psutil

MIB = 2**20


def _kind(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline()[:2])
        name = p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    if name.startswith("ray::") or cmd.startswith("ray::") or "default_worker.py" in cmd:
        return "worker"
    return "other"


def measure(cmd: list[str], interval: float = 0.02) -> dict:
    """Run ``cmd``; peak RSS (MiB) of the driver, of the largest worker and other child."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    root = psutil.Process(proc.pid)
    peaks: dict[int, tuple[str, int]] = {}
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                rss = p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            kind = "driver" if p.pid == root.pid else _kind(p)
            old = peaks.get(p.pid, (kind, 0))
            peaks[p.pid] = (kind if kind != "gone" else old[0], max(old[1], rss))
        time.sleep(interval)
    code = proc.wait()

    def top(kind: str) -> float:
        vals = [v for k, v in peaks.values() if k == kind]
        return round(max(vals) / MIB, 1) if vals else 0.0

    return {
        "exit": code,
        "seconds": round(time.perf_counter() - t0, 1),
        "driver_mib": top("driver"),
        "worker_mib": top("worker"),
        "other_mib": top("other"),
        "workers": sum(k == "worker" for k, _ in peaks.values()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command")
    res = measure(cmd)
    if args.json:
        print(json.dumps(res))
    else:
        print(
            f"exit {res['exit']} in {res['seconds']}s: driver {res['driver_mib']} MiB, "
            f"max worker {res['worker_mib']} MiB ({res['workers']} workers), "
            f"max other child {res['other_mib']} MiB",
            file=sys.stderr,
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
