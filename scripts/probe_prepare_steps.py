"""The driver's RSS in each step of one ``prepare --executor ray`` run, and in each pass of its
validate step: the RSS when it starts, the peak during it (polled every 10 ms) and the RSS when it
ends, each split as /proc/self/status does (anonymous, file-backed, shared: Ray's object-store
pages the driver mapped). Linux only.

    .venv/bin/python scripts/probe_prepare_steps.py ROOT OUT [--no-frames]

``scripts/bench_ray.py`` gives the driver's peak of the whole command (a separate process, polled
from outside); this says which step or validate pass makes it and of what kind of memory.
Runs ``prepare ROOT --out OUT --executor ray --stats recompute --frames -q`` in this process.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def status() -> dict[str, int]:
    """The process's resident memory now (MiB), by kind."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in FIELDS:
                out[key] = int(value.split()[0]) // 1024
    return out


_peak: dict = {"rss": 0, "at": None}


def _poll() -> None:
    while True:
        s = status()
        if s["VmRSS"] > _peak["rss"]:
            _peak["rss"], _peak["at"] = s["VmRSS"], s
        time.sleep(0.01)


def _fmt(s: dict[str, int]) -> str:
    return f"{s['VmRSS']:4d} (anon {s['RssAnon']} file {s['RssFile']} shmem {s['RssShmem']})"


def _wrap(label: str, fn: Callable) -> Callable:
    def run(*args, **kwargs):
        _peak["rss"], _peak["at"] = 0, None
        before, t0 = status(), time.perf_counter()
        out = fn(*args, **kwargs)
        after = status()
        peak = _peak["at"] or after
        print(
            f"[probe] {label:<18} {time.perf_counter() - t0:6.2f}s  start {_fmt(before)}  "
            f"peak {_fmt(peak)}  end {_fmt(after)}",
            file=sys.stderr,
            flush=True,
        )
        return out

    return run


def main() -> None:
    """Instrument prepare's steps and validate's passes, then run the command."""
    root, out = sys.argv[1], sys.argv[2]
    frames = [] if "--no-frames" in sys.argv else ["--frames"]
    threading.Thread(target=_poll, daemon=True).start()
    from episodekit import prepare_steps
    from episodekit.cli import main as cli
    from episodekit.validate import passes

    for step in prepare_steps.STEPS:
        step.ensure = _wrap(f"step {step.name}", step.ensure)
    passes.PASSES = tuple(
        passes.Pass(p.name, p.checks, _wrap(f"  pass {p.name}", p.run), p.progress)
        for p in passes.PASSES
    )
    sys.argv = ["episodekit", "prepare", root, "--out", out, "--executor", "ray", "-q"]
    sys.argv += ["--stats", "recompute", *frames]
    try:
        cli()
    except SystemExit:
        pass
    print(f"[probe] end {_fmt(status())}", file=sys.stderr)


if __name__ == "__main__":
    main()
