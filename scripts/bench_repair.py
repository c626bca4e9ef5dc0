"""`episodekit repair` of a crashed recording with a ~100 MB footer-less data file (~1M frames),
against reading an intact copy of the same file with `pq.read_table`, in one run.

    .venv/bin/python scripts/bench_repair.py [--frames 1000000] [--dims 7] [--rounds 3] [--dir DIR]
        [--baseline PYTHON]

The first run records the crash under DIR (the command that makes the data); every run then
measures it (the same command again reuses DIR).

The crash is made the way LeRobot's recorder (0.4.x-0.6.1) leaves one: a child process records
with pyarrow ParquetWriters as the recorder does (snappy, dictionary; one `write_table` per
episode of 150-450 frames into data/chunk-000/file-000.parquet, so one row group each; the
episodes' metadata rows with LeRobot's per-episode stats 10 at a time into meta/episodes; info.json
and stats.json as the recorder rewrites them after each episode, its tasks.parquet) and exits with
`os._exit` without closing them: both parquet files without a footer, the last <= 9 metadata
rows never written. The same child writes the same rows through a closed writer: the intact copy.

Measured alternately, each in a fresh process (after its imports), --rounds times (the machine
is shared and noisy: every ratio is the median of the per-round ratios): `pq.read_table(intact
copy)` and `repair(ROOT, RepairOptions(out=OUT))` (inspection, salvage, rebuilt rows, copy,
verification by decoding every row again while counting each feature's values over its range,
stats.json with exact quantiles selected in one more pass, publish),
and with --baseline the same repair run by another interpreter (one whose episodekit is an older
checkout: before/after in one run). Reported: wall time and CPU time (user + sys, every thread)
of each; the share of repair's stats step (``build_stats``: the exact quantiles' selection pass;
timed apart inside the repair process); each process's peak RSS above its RSS after the imports, and
repair's peak before its stats step, next to the largest row group (uncompressed) and the file
size. Writes under --dir (default: $EPISODEKIT_BENCH/repair, else ./bench-data/repair).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

TASKS = ["pick up the cube", "open the drawer", "fold the towel", "wipe the table"]

RECORD = r"""
import json, os, sys
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from episodekit.writers import repair_schema as rs
from episodekit.metadata.stats import feature_values
from episodekit.writers.sink_meta import tasks_table

spec = json.loads(sys.argv[1])
root, frames, dims, tasks = Path(spec["root"]), spec["frames"], spec["dims"], spec["tasks"]
lo, hi = spec.get("length", (150, 450))
file_mb = spec.get("file_mb")  # None: one data file and one episodes file, whatever their size
names = [f"j{i}" for i in range(dims)]
scalar = {"shape": [1], "names": None}
features = {
    "observation.state": {"dtype": "float32", "shape": [dims], "names": names},
    "action": {"dtype": "float32", "shape": [dims], "names": names},
    "timestamp": {"dtype": "float32", **scalar},
    **{k: {"dtype": "int64", **scalar} for k in ("frame_index", "episode_index", "index",
                                                 "task_index")},
}
info = {"codebase_version": "v3.0", "robot_type": "bench", "total_episodes": 0, "total_frames": 0,
        "total_tasks": len(tasks), "chunks_size": 1000, "data_files_size_in_mb": file_mb or 100,
        "video_files_size_in_mb": 200, "fps": 30, "splits": {},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": None, "features": features}
schema = rs.data_schema(info)
(root / "meta").mkdir(parents=True)
pq.write_table(tasks_table(tasks), root / "meta/tasks.parquet")
opts = dict(compression="snappy", use_dictionary=True)


class Rolling:
    # One of the recorder's open writers: a new file (the next file index) once this one
    # reaches data_files_size_in_mb (with file_mb; the full file is closed: it has a footer).
    def __init__(self, folder):
        self.folder, self.place, self.writer = folder, [0, 0], None

    def path(self):
        chunk, file = self.place
        return root / self.folder / f"chunk-{chunk:03d}/file-{file:03d}.parquet"

    def write(self, table):
        if self.writer is None:
            self.path().parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.path(), table.schema, **opts)
        self.writer.write_table(table)
        if file_mb and os.path.getsize(self.path()) >= file_mb * 2**20:
            self.writer.close()
            self.writer = None
            chunk, file = self.place
            self.place = [chunk + (file + 1) // 1000, (file + 1) % 1000]


data, meta = Rolling("data"), Rolling("meta/episodes")
intact = None
if spec["intact"]:
    intact = pq.ParquetWriter(root.parent / "intact.parquet", schema, **opts)
rng = np.random.default_rng(0)
buffer, rows, index, ep = [], [], 0, 0
while index < frames:
    n = int(rng.integers(lo, hi + 1))
    state = np.cumsum(rng.normal(0, 0.01, (n, dims)).astype(np.float32), axis=0)
    t = ep % len(tasks)
    cols = {
        "observation.state": pa.FixedSizeListArray.from_arrays(pa.array(state.ravel()), dims),
        "action": pa.FixedSizeListArray.from_arrays(pa.array(np.roll(state, -1, 0).ravel()), dims),
        "timestamp": pa.array((np.arange(n) / 30).astype(np.float32)),
        "frame_index": pa.array(np.arange(n)), "episode_index": pa.array(np.full(n, ep)),
        "index": pa.array(np.arange(index, index + n)), "task_index": pa.array(np.full(n, t)),
    }
    table = pa.table(cols, schema=schema)
    place = tuple(data.place)
    data.write(table)
    if intact is not None:
        intact.write_table(table)
    stats = {k: rs.lerobot_episode_stats(feature_values(table[k], int(features[k]["shape"][0]), k))
             for k in features if k != "timestamp"}
    stats["timestamp"] = rs.lerobot_episode_stats(np.arange(n) / 30)
    row = rs.episode_row(info, ep, [tasks[t]], n, place, index, {}, stats, tuple(meta.place))
    rows.append(row)
    buffer.append(row)
    if len(buffer) == 10:
        meta.write(rs.episodes_table(buffer))
        buffer = []
    index += n
    ep += 1
info.update(total_episodes=ep, total_frames=index, splits={"train": f"0:{ep}"})
(root / "meta/info.json").write_text(json.dumps(info, indent=4))
(root / "meta/stats.json").write_text(json.dumps(rs.lerobot_dataset_stats(info, rows), indent=4))
if intact is not None:
    intact.close()
print(json.dumps({"episodes": ep, "frames": index, "unflushed": len(buffer)}), flush=True)
os._exit(0)  # killed: the recorder's two open writers never close
"""

MEASURE = r"""
import json, resource, sys, time
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
import pyarrow.parquet as pq
from episodekit.writers import repair_build
from episodekit.writers.repair import RepairOptions, repair
start = rss("VmRSS:")
what, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
stats = {}
inner = repair_build.build_stats
def timed(*args, **kwargs):  # repair's stats step (the exact quantiles' selection): timed apart
    stats["peak_before"] = rss("VmHWM:")
    t, c = time.perf_counter(), cpu()
    try:
        return inner(*args, **kwargs)
    finally:
        stats.update(seconds=time.perf_counter() - t, cpu=cpu() - c)
repair_build.build_stats = timed
t0, c0 = time.perf_counter(), cpu()
if what == "read":
    rows = pq.read_table(path).num_rows
else:
    rows = repair(path, RepairOptions(out=out)).frames
seconds, used = time.perf_counter() - t0, cpu() - c0
print(json.dumps({"seconds": seconds, "cpu": used, "rows": rows, "startup": start,
                  "peak": rss("VmHWM:"), "stats": stats}))
"""


def child(code: str, *args: str, python: str = sys.executable) -> dict:
    p = subprocess.run([python, "-c", code, *args], capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"child failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return float(np.median(values))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--dims", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    default = Path(os.environ.get("EPISODEKIT_BENCH", "bench-data")) / "repair"
    ap.add_argument("--dir", type=Path, default=default)
    ap.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="also time repair run by this interpreter (one that imports an older episodekit), "
        "in the same rounds: before/after from one run",
    )
    args = ap.parse_args()
    import pyarrow.parquet as pq

    base = args.dir
    root, intact = base / "crashed", base / "intact.parquet"
    if not (root / "meta/info.json").exists():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        t0 = time.perf_counter()
        spec = {"root": str(root), "frames": args.frames, "dims": args.dims, "tasks": TASKS}
        made = child(RECORD, json.dumps({**spec, "intact": True}))
        print(f"recorded and killed: {made} in {time.perf_counter() - t0:.0f}s")
    crashed = root / "data/chunk-000/file-000.parquet"
    meta = pq.read_metadata(intact)
    largest = max(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    size = crashed.stat().st_size
    print(
        f"footer-less data file: {size / 2**20:.1f} MB, {meta.num_rows:,} frames, "
        f"{meta.num_row_groups:,} row groups (largest {largest / 2**10:.0f} KiB uncompressed)"
    )
    runs = [("read", sys.executable), ("repair", sys.executable)]
    if args.baseline:
        runs.append(("baseline", args.baseline))
    got: dict[str, list[dict]] = {what: [] for what, _ in runs}
    for r in range(args.rounds):
        for what, python in runs:
            out = base / f"out{r}"
            shutil.rmtree(out, ignore_errors=True)
            path = str(intact if what == "read" else root)
            m = child(MEASURE, what, path, str(out), python=python)
            shutil.rmtree(out, ignore_errors=True)
            got[what].append(m)
            st = m["stats"]
            step = f"  stats step {st['seconds']:.2f}s cpu {st['cpu']:.2f}s" if st else ""
            print(
                f"  round {r + 1} {what:8s} {m['seconds']:6.2f}s cpu {m['cpu']:6.2f}s  rows "
                f"{m['rows']:,}  peak RSS +{(m['peak'] - m['startup']) / 2**20:.0f} MB over "
                f"start-up {m['startup'] / 2**20:.0f} MB{step}"
            )
    if not args.rounds:
        return

    def ratio(a: str, b: str, key: str = "seconds") -> str:
        return f"{median([x[key] / y[key] for x, y in zip(got[a], got[b])]):.2f}x"

    def grow(what: str) -> str:
        return f"{median([m['peak'] - m['startup'] for m in got[what]]) / 2**20:.0f} MB"

    rep, read = got["repair"], got["read"]
    stats = median([m["stats"]["seconds"] / y["seconds"] for m, y in zip(rep, read)])
    rest = median(
        [(m["seconds"] - m["stats"]["seconds"]) / y["seconds"] for m, y in zip(rep, read)]
    )
    before = median([m["stats"]["peak_before"] - m["startup"] for m in rep]) / 2**20
    print(
        f"repair / pq.read_table, median of {args.rounds} rounds: wall {ratio('repair', 'read')}, "
        f"CPU {ratio('repair', 'read', 'cpu')} (bar <= 2x); of the wall ratio, its stats step "
        f"(the exact quantiles' selection pass) {stats:.2f}x and the rest {rest:.2f}x"
    )
    if args.baseline:
        print(
            f"baseline repair / pq.read_table: wall {ratio('baseline', 'read')}, CPU "
            f"{ratio('baseline', 'read', 'cpu')}; repair / baseline: wall "
            f"{ratio('repair', 'baseline')}, CPU {ratio('repair', 'baseline', 'cpu')}"
        )
    line = (
        f"peak RSS above start-up (median): read_table {grow('read')}, repair {grow('repair')} "
        f"(before its stats step {before:.0f} MB)"
    )
    line += f", baseline repair {grow('baseline')}" if args.baseline else ""
    print(f"{line}; file {size / 2**20:.0f} MB, largest row group {largest / 2**10:.0f} KiB")


if __name__ == "__main__":
    main()
