"""The footer-less page walk of `episodekit repair` (core/parquet_salvage.py ``scan`` and
``footer``) on a crashed recording's two parquet files, this checkout against a baseline.

    .venv/bin/python scripts/bench_repair.py --rounds 0 --dir DIR        # makes DIR/crashed
    .venv/bin/python scripts/bench_salvage.py --dir DIR [--rounds 5] [--repeat 3]
        [--baseline PYTHON | --against RESULT.json] [--save RESULT.json] [--profile]

The files: the last ``data/chunk-C/file-F.parquet`` and ``meta/episodes/chunk-C/file-F.parquet``
of DIR/crashed (bench_repair's 1M-frame crash: 3,345 + 334 row groups, 49,801 column chunks),
their templates as repair makes them (``inspect_root``), stored once under DIR/salvage-bench as
encoded footers so that every interpreter walks with the same template.

Each round runs one fresh process per interpreter (this one and ``--baseline``: one whose
episodekit is another checkout), in alternating order; a process times ``scan`` and ``footer``
of each file ``--repeat`` times after its imports, in CPU seconds (the walk is one thread; CPU
time moves less than wall time on a shared machine), and reports its best, its first scan
(with what a process does once: patterns, tables) and the sha256 of each footer. Reported:
each file's times, the median over rounds of the per-round ratio baseline / this checkout,
and whether the footers are byte-identical.
``--save`` stores this checkout's result (times and hashes), ``--against`` compares with one
stored (times then come from different runs: a rougher ratio). ``--profile``: cProfile of this
checkout's walk of both files, the functions by their own time.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

FILES = ("data", "episodes")


def prepare(root: Path, store: Path) -> None:
    """The two footer-less files' paths, codecs and templates (encoded), in ``store``."""
    from episodekit.core import parquet_salvage as ps
    from episodekit.core import thrift_compact as tc
    from episodekit.writers.repair_inspect import inspect_root

    inv = inspect_root(root)
    store.mkdir(parents=True, exist_ok=True)
    spec = {}
    for name, states in (("data", inv.data), ("episodes", inv.episodes)):
        state = states[-1]
        if state.intact or state.template is None:
            raise SystemExit(f"{state.rel}: not a footer-less file repair walked")
        (store / f"{name}.template").write_bytes(tc.encode(state.template))
        spec[name] = {"path": str(root / state.rel), "codec": ps.template_codec(state.template)}
    (store / "spec.json").write_text(json.dumps(spec))


def load(store: Path) -> dict:
    from episodekit.core import thrift_compact as tc

    spec = json.loads((store / "spec.json").read_text())
    for name, s in spec.items():
        s["template"] = tc.decode((store / f"{name}.template").read_bytes())[0]
    return spec


def measure(store: Path, repeat: int) -> dict:
    """This interpreter's best times of ``scan`` and ``footer`` per file, and the footers'
    hashes (a worker process: prints JSON)."""
    from episodekit.core import parquet_salvage as ps

    out = {}
    for name, s in load(store).items():
        scans, footers = [], []
        for _ in range(repeat):
            t0 = time.process_time()
            salvage = ps.scan(s["path"], s["template"], s["codec"])
            t1 = time.process_time()
            meta = ps.footer(s["template"], salvage)
            footers.append(time.process_time() - t1)
            scans.append(t1 - t0)
        out[name] = {
            "first": scans[0],  # with what a process does once (patterns, tables)
            "scan": min(scans),
            "footer": min(footers),
            "row_groups": len(salvage.row_groups),
            "sha256": hashlib.sha256(meta).hexdigest(),
        }
    return out


def run_worker(python: str, store: Path, repeat: int) -> dict:
    cmd = [python, __file__, "--worker", "--store", str(store), "--repeat", str(repeat)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile(store: Path) -> None:
    from episodekit.core import parquet_salvage as ps

    spec = load(store)
    prof = cProfile.Profile()
    prof.enable()
    for s in spec.values():
        ps.footer(s["template"], ps.scan(s["path"], s["template"], s["codec"]))
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def total(result: dict, key: str = "scan") -> float:
    return sum(result[f][key] for f in FILES)


def report(ours: list[dict], base: list[dict] | None) -> None:
    for f in FILES:
        for key in ("first", "scan", "footer"):
            line = f"{f:8} {key:6} this checkout {statistics.median(r[f][key] for r in ours):.3f} s"
            if base and key in base[0][f]:
                b = statistics.median(r[f][key] for r in base)
                ratio = statistics.median(x[f][key] / y[f][key] for x, y in zip(base, ours))
                line += f"  baseline {b:.3f} s  ratio {ratio:.2f}x"
            print(line)
    groups = ", ".join(f"{f} {ours[0][f]['row_groups']}" for f in FILES)
    print(f"row groups: {groups}")
    if base:
        for key, what in (("scan", "best"), ("first", "first, cold")):
            if key not in base[0][FILES[0]]:
                continue
            ratios = [total(x, key) / total(y, key) for x, y in zip(base, ours)]
            rounds = ", ".join(f"{r:.2f}" for r in ratios)
            print(
                f"scan of both files ({what}): median ratio baseline / this checkout "
                f"{statistics.median(ratios):.2f}x (rounds: {rounds})"
            )
        same = all(r[f]["sha256"] == base[0][f]["sha256"] for r in ours for f in FILES)
        print("footers byte-identical to the baseline's" if same else "FOOTERS DIFFER")
        if not same:
            raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, help="bench_repair's --dir (holds crashed/)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3, help="walks per process (its best counts)")
    ap.add_argument("--baseline", help="another interpreter (another checkout's episodekit)")
    ap.add_argument("--against", type=Path, help="a result --save stored")
    ap.add_argument("--save", type=Path, help="store this checkout's result here")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args.store, args.repeat)))
        return
    if args.dir is None:
        ap.error("--dir is required (bench_repair.py --rounds 0 --dir DIR makes it)")
    store = args.dir / "salvage-bench"
    if not (store / "spec.json").exists():
        prepare(args.dir / "crashed", store)
    if args.profile:
        profile(store)
        return
    ours, base = [], [] if args.baseline else None
    for r in range(args.rounds):
        order = [sys.executable, args.baseline] if r % 2 == 0 else [args.baseline, sys.executable]
        for python in order:
            if python is None:
                continue
            got = run_worker(python, store, args.repeat)
            (ours if python == sys.executable else base).append(got)
    if args.against:
        stored = json.loads(args.against.read_text())
        base = [stored] * len(ours)
    report(ours, base)
    if args.save:
        keep = {
            f: {
                **ours[0][f],
                **{k: statistics.median(r[f][k] for r in ours) for k in ("scan", "footer")},
            }
            for f in FILES
        }
        args.save.write_text(json.dumps(keep))


if __name__ == "__main__":
    main()
