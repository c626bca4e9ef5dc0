"""Worker processes: in-process vs ``make_loader`` (1, 2, 4 workers) vs torch ``DataLoader``
(same workers), every ratio measured in the same run.

    .venv/bin/python scripts/bench_data.py big10m store-big10m video-av1   # the roots, once
    .venv/bin/python scripts/bench_workers.py [--dir bench-data] [--repeat 2] [--only numeric]
    .venv/bin/python scripts/bench_workers.py --documented ROOT [--repeat 5] [--prefetch 2,4]
    .venv/bin/python scripts/bench_workers.py --handover [--repeat 5] [--batches 4000]

- **numeric**: random access on ``big10m`` through its frame store (``store-big10m``), batches
  of 256 with a 50-frame ``action`` window and a 3-frame ``observation.state`` window, the
  sampler's order. In-process is ``make_loader(..., num_workers=0)`` (``get_batch`` + tensors
  in the training process); ``DataLoader`` is ``TorchFrameDataset`` + ``collate`` with the
  same sampler order (one ``get_batch`` per batch in its workers).
- **video**: ``video-av1`` (two AV1 cameras at 240x320, LeRobot's encoding: libsvtav1, GOP 2),
  random access with ``video_backend="pyav"`` (each frame decoded, both cameras), batches of 64;
  in-process and ``DataLoader`` as for numeric.

- **documented** (``--documented ROOT``, issue 38's case): the use the docs show, on a prepared
  root with its frame store (``episodekit sample ROOT -n 2500 --seed 5`` then ``episodekit
  prepare ROOT --world-size 1 --workers 2 --frames``: ~680k frames, 32 MiB row groups, a plan
  for 2 workers); ``make_loader(ROOT, None, 256, 2, ...)`` in a guarded script against
  ``num_workers=0``, random access (the docs' example: 50-frame ``action`` and 3-frame state
  windows) and the stream of the 2-worker plan (same windows); each round runs in-process then
  2 workers (one per ``--prefetch`` value), and the ratios of the round are printed with their
  median over the rounds, after the first batch and after every worker's first batch.

- **handover** (``--handover``, no data): the hand-over alone, 2 workers whose source returns
  one ready batch of the documented shape (256 rows, 50x14 and 3x14 float32 windows, their
  pads, 5 scalar columns, 256 task strings: 785 KB): batches/s through the ring and the CPU
  per batch of the training process and of the workers (the ceiling of any source; run it with
  ``PYTHONPATH`` set to another version's install to compare two versions in one run).

Each figure is frames/s after ``--warm`` batches (worker start-up excluded, reported apart),
and frames per CPU-second of the training process and its workers over the same batches (what
the work costs, whatever else runs on the machine);
rounds alternate the configurations, and the ratios compare figures of the same round. The
machine is shared: run when it is quiet, and repeat.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from episodekit.loaders.sources import BatchSource

FPS = 30
DELTAS = {"action": [k / FPS for k in range(50)], "observation.state": [-2 / FPS, -1 / FPS, 0.0]}
WORKERS = (1, 2, 4)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds so far of these processes (Linux /proc; 0 elsewhere)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def worker_pids(it) -> list[int]:
    """The worker processes behind an iterator: make_loader's or DataLoader's."""
    pool = getattr(getattr(it, "gi_frame", None), "f_locals", {}).get("pool")
    if pool is not None:
        return pool.pids
    return [int(w.pid) for w in getattr(it, "_workers", [])]


def timed(iterable, batches: int | None, warm: int) -> tuple[float, float, float]:
    """(frames/s after ``warm`` batches, frames per CPU-second of the training process and its
    workers over the same batches, seconds to the first batch) of an iterable of batches."""
    t0 = time.perf_counter()
    it = iter(iterable)
    first = None
    frames, t, cpu0, pids = 0, None, 0.0, []
    for i, b in enumerate(it):
        if first is None:
            first = time.perf_counter() - t0
        if i == warm:
            pids = [os.getpid(), *worker_pids(it)]
            t, cpu0 = time.perf_counter(), cpu_seconds(pids)
        if i >= warm:
            frames += len(b["index"])
        if batches is not None and i + 1 >= warm + batches:
            break
    wall, cpu = time.perf_counter() - t, cpu_seconds(pids) - cpu0
    del it
    return frames / wall, frames / max(cpu, 1e-9), first or 0.0


def _cases(root: str, ds, batch: int, batches: int, warm: int, **kw) -> dict:
    """In-process, ``make_loader`` with each worker count and torch's DataLoader with the same
    counts over the same sample order (``kw``: make_loader's options for the dataset)."""
    from torch.utils.data import DataLoader

    from episodekit.loaders import EpisodeAwareSampler
    from episodekit.loaders.torch import TorchFrameDataset, collate, make_loader

    order = EpisodeAwareSampler(ds, seed=0).epoch_indices(0)[: batch * (batches + warm)].tolist()

    def mine(n):
        def run():
            with make_loader(root, None, batch, n, access="random", **kw) as loader:
                return timed(loader, batches, warm)

        return run

    def torch_dl(n):
        def run():
            dl = DataLoader(
                TorchFrameDataset(ds), sampler=order, batch_size=batch, collate_fn=collate,
                num_workers=n, multiprocessing_context="spawn" if n else None,
            )  # fmt: skip
            return timed(dl, batches, warm)

        return run

    cases = {"in-process": mine(0)}
    cases.update({f"make_loader {n}": mine(n) for n in WORKERS})
    cases.update({f"DataLoader {n}": torch_dl(n) for n in WORKERS})
    return cases


def numeric_cases(root: str, store: str, batches: int, warm: int) -> dict:
    from episodekit.loaders import FrameDataset

    ds = FrameDataset(root, delta_timestamps=DELTAS, store=store)
    return _cases(root, ds, 256, batches, warm, delta_timestamps=DELTAS, store=store)


def video_cases(root: str, batches: int, warm: int) -> dict:
    from episodekit.loaders import FrameDataset

    ds = FrameDataset(root, video_backend="pyav")
    return _cases(root, ds, 64, batches, warm, video_backend="pyav")


def run_rounds(name: str, cases: dict, repeat: int) -> None:
    print(f"\n## {name} (load average {os.getloadavg()[0]:.1f} at start)", flush=True)
    for r in range(repeat):
        got, per_cpu = {}, {}
        for label, fn in cases.items():
            fps, got_cpu, first = fn()
            got[label], per_cpu[label] = fps, got_cpu
            line = f"{label:<14} {fps:>11,.0f} frames/s  {got_cpu:>11,.0f} per CPU-s"
            print(f"  round {r + 1}  {line}  (first batch {first:.1f} s)", flush=True)
        for name, d in (("frames/s", got), ("per CPU-s", per_cpu)):
            base = d["in-process"]
            ratios = ", ".join(f"{k} {v / base:.2f}x" for k, v in d.items() if k != "in-process")
            print(f"  round {r + 1} {name} vs in-process: {ratios}", flush=True)


def documented(root: str, rounds: int, batches: int, prefetch: list[int]) -> None:
    """In-process vs ``make_loader`` with 2 workers on ``root`` (see the module docstring)."""
    import statistics

    from episodekit.loaders.torch import make_loader
    from episodekit.metadata.plans.load import load_plan

    plan = load_plan(root, 1, 2)
    forms = {
        "random": dict(access="random", delta_timestamps=DELTAS),
        "stream": dict(plan=plan, delta_timestamps=DELTAS),
    }

    def one(form: dict, n: int, p: int) -> tuple[float, float, float, float]:
        """(frames/s after batch 1, after batch 2, per CPU-s after batch 2, first batch s)"""
        kw = dict(form)
        plan_arg = kw.pop("plan", None)
        t0 = time.perf_counter()
        with make_loader(root, plan_arg, 256, n, seed=0, prefetch=p, **kw) as loader:
            ts, frames = [], 0
            for i, b in enumerate(loader):
                ts.append(time.perf_counter())
                if i == 1:
                    pids = [os.getpid(), *(loader.pool.pids if loader.pool else [])]
                    cpu0 = cpu_seconds(pids)
                if i >= 2:
                    frames += len(b["index"])
                if i + 1 >= batches:
                    break
            cpu = cpu_seconds(pids) - cpu0
        after1 = (frames + 256) / (ts[-1] - ts[0])
        after2 = frames / (ts[-1] - ts[1])
        return after1, after2, frames / max(cpu, 1e-9), ts[0] - t0

    for name, form in forms.items():
        print(f"\n## documented, {name}: {root}, batches of 256, {batches} batches per case")
        ratios: dict[str, list[float]] = {}
        for r in range(rounds):
            base = one(form, 0, 2)
            line = [f"in-process {base[1]:,.0f} frames/s (first batch {base[3]:.1f} s)"]
            for p in prefetch:
                got = one(form, 2, p)
                for k, j in (("after 1st", 0), ("after 2nd", 1), ("per CPU-s", 2)):
                    ratios.setdefault(f"prefetch {p} {k}", []).append(got[j] / base[j])
                line.append(
                    f"2 workers prefetch {p} {got[1]:,.0f} ({got[0] / base[0]:.2f}x after the "
                    f"1st batch, {got[1] / base[1]:.2f}x after the 2nd, {got[2] / base[2]:.2f}x "
                    f"per CPU-s; first batch {got[3]:.1f} s)"
                )
            print(f"  round {r + 1} (load {os.getloadavg()[0]:.1f}): " + "; ".join(line))
        for k, v in ratios.items():
            each = ", ".join(f"{x:.2f}" for x in v)
            print(f"  median {k}: {statistics.median(v):.2f}x  ({each})")


def _ready_batch() -> dict:
    """A batch of the documented case's shape and dtypes (what ``get_batch`` returns there)."""
    import numpy as np

    rng = np.random.default_rng(0)
    return {
        "timestamp": rng.random(256, dtype=np.float32),
        "frame_index": np.arange(256, dtype=np.int64),
        "episode_index": np.arange(256, dtype=np.int64),
        "index": np.arange(256, dtype=np.int64),
        "task_index": np.zeros(256, dtype=np.int64),
        "action": rng.random((256, 50, 14), dtype=np.float32),
        "observation.state": rng.random((256, 3, 14), dtype=np.float32),
        "action_is_pad": np.zeros((256, 50), dtype=bool),
        "observation.state_is_pad": np.zeros((256, 3), dtype=bool),
        "speed": np.full(256, 50, dtype=np.int64),
        "task": ["pick the cube"] * 256,
    }


class Ready(BatchSource):
    """``n`` batches per epoch, each the same ready batch: no work but the hand-over."""

    kind, _opened = "ready", ("b",)

    def __init__(self, n: int):
        self.n = n

    def open(self):
        self.b = _ready_batch()

    def max_rows(self):
        return 256

    def epoch_state(self, epoch):
        return {"epoch": int(epoch), "batches": 0}

    def begin(self, state):
        self.epoch, self.done = int(state["epoch"]), int(state["batches"])
        return self.n - self.done

    def batch(self, b):
        return self.b

    def state(self, consumed):
        return {"epoch": self.epoch, "batches": self.done + consumed}


def handover(rounds: int, batches: int, prefetch: list[int]) -> None:
    """Batches/s of 2 workers over a source that does no work (see the module docstring)."""
    from episodekit.loaders.workers import BatchLoader

    print(f"\n## handover: 2 workers, a ready 785 KB batch, {batches} batches per case")
    for r in range(rounds):
        line = []
        for p in prefetch:
            with BatchLoader(Ready(batches + 2), 2, prefetch=p) as loader:
                it = iter(loader)
                next(it), next(it)  # every worker's first batch (start-up, the ring) untimed
                pids = [os.getpid(), *loader.pool.pids]
                t, cpu_parent, cpu0 = time.perf_counter(), time.process_time(), cpu_seconds(pids)
                for _ in it:
                    pass
                wall = time.perf_counter() - t
                parent = time.process_time() - cpu_parent
                workers = cpu_seconds(pids) - cpu0 - parent
            line.append(
                f"prefetch {p}: {batches / wall:,.0f} batches/s, per batch "
                f"{parent / batches * 1e6:.0f} us CPU in the training process, "
                f"{workers / batches * 1e6:.0f} us in the workers"
            )
        print(f"  round {r + 1} (load {os.getloadavg()[0]:.1f}): " + "; ".join(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("EPISODEKIT_BENCH", "bench-data"))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--batches", type=int, default=400, help="numeric batches timed per case")
    ap.add_argument("--video-batches", type=int, default=24, help="video batches timed per case")
    ap.add_argument("--warm", type=int, default=4, help="batches before the clock starts")
    ap.add_argument("--only", choices=["numeric", "video"])
    ap.add_argument("--documented", metavar="ROOT", help="only the documented case on ROOT")
    ap.add_argument("--prefetch", default="2", help="documented: prefetch values, e.g. 2,4")
    ap.add_argument("--handover", action="store_true", help="only the hand-over, no data")
    args = ap.parse_args()
    if args.handover:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")
        handover(args.repeat, args.batches, [int(p) for p in args.prefetch.split(",")])
        return
    if args.documented:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")
        prefetch = [int(p) for p in args.prefetch.split(",")]
        documented(args.documented, args.repeat, args.batches, prefetch)
        return
    d = Path(args.dir)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")
    if args.only in (None, "numeric"):
        cases = numeric_cases(str(d / "big10m"), str(d / "store-big10m"), args.batches, args.warm)
        run_rounds("numeric: big10m, random access, batches of 256", cases, args.repeat)
    if args.only in (None, "video"):
        cases = video_cases(str(d / "video-av1"), args.video_batches, args.warm)
        title = "video: video-av1, 2 AV1 cameras 240x320, random access, batches of 64"
        run_rounds(title, cases, args.repeat)


if __name__ == "__main__":
    main()
