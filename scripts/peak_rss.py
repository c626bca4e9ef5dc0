"""Peak resident memory of a command and of every process it starts (Ray workers included).

    .venv/bin/python scripts/peak_rss.py [--json] [--per-process] -- COMMAND [ARG ...]

Polls the process tree every 20 ms with psutil and prints the driver's peak RSS (the command's
own process), the largest peak of any Ray worker process (``ray::...``: one runs the tasks), of
any other child (Ray's own daemons: gcs, raylet, ...), and the wall time. Polling can miss a
spike shorter than the interval; the figures are lower bounds of the true peaks by that much.
The command's output passes through; lines like ``rowgroups: done in 1.2s`` (prepare's step
lines) end a step, and the peaks are also given per step (``steps``: the driver's and the largest
worker's RSS seen while that step ran; a worker keeps memory it freed, so a later step may show
an earlier step's high-water mark). ``processes`` (``--per-process`` in text): every child's
own peak, in start order.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
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


STEP_LINE = re.compile(r"^(\w+): (done|skipped|failed)\b")


def _follow(stream, marks: list[tuple[float, str]]) -> None:
    """Echo the command's output to stderr; remember when each step line came."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        sys.stderr.write(line)
        m = STEP_LINE.match(line)
        if m:
            marks.append((time.perf_counter(), m.group(1)))


def _name(p: psutil.Process) -> str:
    """A child's name for the report: Ray's daemons by their program (gcs_server, raylet,
    dashboard, ...), multiprocessing's children by its module (multiprocessing.spawn: a
    'spawn' process, e.g. an import's camera process)."""
    try:
        cmd = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    for arg in cmd:  # a Python child started by multiprocessing: python [flags] -c "from ..."
        if arg.startswith("from multiprocessing."):
            return arg.split()[1]  # multiprocessing.spawn, multiprocessing.resource_tracker
    for arg in cmd[:3]:
        base = arg.rsplit("/", 1)[-1]
        if base and not base.startswith("python") and not base.startswith("-"):
            return base[:40]
    return p.name()


def _poll(root: psutil.Process, peaks: dict, names: dict, total: list) -> tuple[int, int]:
    """One look at the tree: update ``peaks`` (and ``names`` of new children, ``total``: the
    largest sum of the tree's RSS seen at one look); the driver's and the largest worker's RSS
    now."""
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    now = {"driver": 0, "worker": 0}
    tree, seen = 0, []
    for p in procs:
        try:
            rss = p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        tree += rss
        seen.append((p, rss))
        kind = "driver" if p.pid == root.pid else _kind(p)
        old = peaks.get(p.pid, (kind, 0))
        kind = kind if kind != "gone" else old[0]
        peaks[p.pid] = (kind, max(old[1], rss))
        if kind == "other":  # named at each look: a child seen before its exec has the
            name = _name(p)  # parent's command line
            names[p.pid] = name if name != "gone" else names.get(p.pid, "gone")
        if kind in now:
            now[kind] = max(now[kind], rss)
    if tree > total[0]:  # the tree's largest sum, and what it was made of
        total[0] = tree
        total[1:] = [{str(p.pid): rss for p, rss in seen}]
    return now["driver"], now["worker"]


def measure(cmd: list[str], interval: float = 0.02) -> dict:
    """Run ``cmd``; peak RSS (MiB) of the driver, of the largest worker and other child, and
    per step (``steps``: name -> [driver MiB, worker MiB])."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    marks: list[tuple[float, str]] = []
    reader = threading.Thread(target=_follow, args=(proc.stdout, marks), daemon=True)
    reader.start()
    root = psutil.Process(proc.pid)
    peaks: dict[int, tuple[str, int]] = {}
    names: dict[int, str] = {}
    total: list = [0, {}]
    timeline = []
    while proc.poll() is None:
        timeline.append((time.perf_counter(), *_poll(root, peaks, names, total)))
        time.sleep(interval)
    code = proc.wait()
    reader.join(timeout=5)

    def top(kind: str) -> float:
        vals = [v for k, v in peaks.values() if k == kind]
        return round(max(vals) / MIB, 1) if vals else 0.0

    steps, start = {}, t0
    for end, name in marks:
        seen = [(d, w) for t, d, w in timeline if start <= t <= end] or [(0, 0)]
        steps[name] = [
            round(max(d for d, _ in seen) / MIB, 1),
            round(max(w for _, w in seen) / MIB, 1),
        ]
        start = end
    return {
        "exit": code,
        "seconds": round(time.perf_counter() - t0, 1),
        "driver_mib": top("driver"),
        "worker_mib": top("worker"),
        "other_mib": top("other"),
        # Ray's own processes (and any other child) by name: the largest peak of each name
        "others": _by_name(peaks, names),
        # the largest sum of every process's RSS seen at one look (shared pages, the object
        # store's among them, count in each process that maps them)
        "tree_mib": round(total[0] / MIB, 1),
        # each process's RSS at that look: [name, MiB], the driver first
        "tree_at_peak": [
            ["driver" if int(pid) == root.pid else names.get(int(pid), "?"), round(rss / MIB, 1)]
            for pid, rss in sorted(total[1].items(), key=lambda kv: int(kv[0]) != root.pid)
        ],
        "workers": sum(k == "worker" for k, _ in peaks.values()),
        "steps": steps,
        # every child's own peak, in start order: [name, MiB]
        "processes": [
            [names.get(pid, kind), round(rss / MIB, 1)]
            for pid, (kind, rss) in sorted(peaks.items())
            if pid != root.pid
        ],
    }


def _by_name(peaks: dict, names: dict) -> dict[str, float]:
    """The peak RSS (MiB) of the "other" children, the largest per name, largest first."""
    out: dict[str, float] = {}
    for pid, (kind, rss) in peaks.items():
        if kind == "other":
            name = names.get(pid, "?")
            out[name] = max(out.get(name, 0.0), round(rss / MIB, 1))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--per-process", action="store_true", help="also each child's own peak")
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
            f"max other child {res['other_mib']} MiB, whole tree {res['tree_mib']} MiB",
            file=sys.stderr,
        )
        for name, (d, w) in res["steps"].items():
            print(f"  {name:<10} driver {d:7.1f} MiB  max worker {w:7.1f} MiB", file=sys.stderr)
        for name, mib in res["processes"] if args.per_process else []:
            print(f"  child {mib:7.1f} MiB  {name}", file=sys.stderr)
    sys.exit(0)


if __name__ == "__main__":
    main()
