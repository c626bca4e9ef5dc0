"""Peak RSS of each step of one ``episodekit repair`` run, each step measured alone: the RSS
when it starts, the peak during it (the kernel's high-water mark reset at its start through
``/proc/self/clear_refs``; Linux only) and the RSS when it ends, in MB above the process's RSS
after its imports; and the bytes the Arrow pool still holds then.

    .venv/bin/python scripts/probe_repair_steps.py ROOT OUT

What ``scripts/bench_repair_episodes.py`` reports is the peak so far by the end of each step;
this says which step makes it and what each leaves behind (what the next one starts from).
"""

from __future__ import annotations

import sys
import time

import pyarrow as pa

from episodekit.writers import repair as repair_mod
from episodekit.writers import repair_build, repair_episodes
from episodekit.writers.repair import RepairOptions, repair

STEPS = [
    ("inspect", repair_mod, "inspect_root"),
    ("plan", repair_mod, "plan_repair"),
    ("build_data", repair_build, "build_data"),
    ("build_episodes", repair_episodes, "build_episodes"),
    ("build_videos", repair_build, "build_videos"),
    ("build_tables", repair_build, "build_tables"),
    ("verify", repair_mod, "verify"),
    ("stats", repair_build, "build_stats"),
]


def status(key: str) -> int:
    """``key`` of /proc/self/status in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) // 1024
    raise SystemExit(f"no {key} in /proc/self/status")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def main() -> None:
    root, out = sys.argv[1], sys.argv[2]
    start = status("VmRSS:")
    rows: list[tuple] = []

    def wrap(name, module, attr):
        inner = getattr(module, attr)

        def wrapped(*args, **kwargs):
            before = status("VmRSS:")
            reset_peak()
            try:
                return inner(*args, **kwargs)
            finally:
                held = pa.total_allocated_bytes() >> 20
                rows.append(
                    (name, before - start, status("VmHWM:") - start, status("VmRSS:") - start, held)
                )
                reset_peak()

        setattr(module, attr, wrapped)

    for step in STEPS:
        wrap(*step)
    t0 = time.perf_counter()
    repair(root, RepairOptions(out=out))
    print(f"{time.perf_counter() - t0:.1f}s; MB above the RSS after imports ({start} MB):")
    for name, before, peak, after, held in rows:
        print(
            f"  {name:15s} starts at {before:4d}  peak {peak:4d}  ends at {after:4d} (Arrow {held})"
        )


if __name__ == "__main__":
    main()
