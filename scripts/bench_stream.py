"""Benchmark the streaming loader (``ShardedLoader``) at user scale, baseline in the same run.

    .venv/bin/python scripts/bench_stream.py --root $EPISODEKIT_BENCH/big10m \
        --workdir $EPISODEKIT_BENCH/stream-root             # 8x2 and 64x4, one worker each
    .venv/bin/python scripts/bench_stream.py --snippet ROOT   # the README snippet, as written

``--root`` is a prepared dataset (32 MiB row groups); it is never written to: its ``meta/`` is
copied to ``--workdir`` and its data files are hard-linked there, and the shard plans are written in
that copy. For each shape, one worker (rank 0, worker 0) of the ``rowgroup``-locality plan is read
for a whole epoch in a child process, with the README's windows (50-frame action, 3-frame state),
default ``cache_mb``. Reported:

- read amplification: bytes decoded (footer uncompressed bytes per row of the columns read, times
  the rows the reader decoded in each row group) / uncompressed bytes of the rows the worker
  needs (the frames it yields and their window frames, each row at its row group's bytes per
  row);
- frames/s of the epoch, against a baseline in the same run: ``pq.read_table`` of the same row
  groups (same columns), one at a time, + a numpy gather of the same rows and windows;
- peak RSS (VmHWM) of the child;
- shuffle quality of three orders over the same number of samples: the old order (``none``-locality
  LPT plan, 8 random episodes per pool), the new pool order, and a global shuffle of the whole
  dataset: distinct episodes per batch of 256 and the lag-1 autocorrelation of the batches' mean
  episode id.
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

# Where scripts/bench_data.py wrote the benchmark roots (EPISODEKIT_BENCH, default ./bench-data).
BENCH = os.environ.get("EPISODEKIT_BENCH", "bench-data")

FPS = 30
DELTAS = {
    "action": [k / FPS for k in range(50)],
    "observation.state": [-2 / FPS, -1 / FPS, 0.0],
}
BATCH = 256


def peak_rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def make_workdir(src: Path, dst: Path) -> Path:
    """dst/meta = a copy of src/meta; dst/data/** = hard links to src's data files (read only)."""
    if not (dst / "meta/info.json").exists():
        shutil.copytree(src / "meta", dst / "meta", dirs_exist_ok=True)
        for f in sorted((src / "data").rglob("*.parquet")):
            link = dst / f.relative_to(src)
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists():  # a hard link: symlinks out of a root are refused
                os.link(f.resolve(), link)
    return dst


# -- shuffle quality ---------------------------------------------------------------------------


def quality(frames: np.ndarray, starts: np.ndarray) -> dict:
    """Distinct episodes per batch of 256, and lag-1 autocorrelation of batch mean episode ids."""
    ep = np.searchsorted(starts, frames, side="right") - 1
    n = len(ep) // BATCH * BATCH
    batches = ep[:n].reshape(-1, BATCH)
    distinct = np.array([len(np.unique(b)) for b in batches])
    means = batches.mean(axis=1)
    x = means - means.mean()
    r1 = float((x[1:] * x[:-1]).sum() / max((x * x).sum(), 1e-12)) if len(x) > 2 else float("nan")
    return {
        "distinct_per_batch_mean": round(float(distinct.mean()), 1),
        "distinct_per_batch_min": int(distinct.min()),
        "lag1_autocorr": round(r1, 3),
    }


def old_order(base: np.ndarray, size: np.ndarray, seed: int, bin_id: int, n: int) -> np.ndarray:
    """The previous ShardedLoader order (epoch 0): items permuted, pools of 8 items, Feistel."""
    from episodekit.loaders.sampler import FEISTEL_ROUNDS, feistel_permute

    rng = np.random.default_rng([seed, 0, bin_id, 0x5EED])
    perm = rng.permutation(len(size))
    base, size = base[perm], size[perm]
    cum = np.concatenate([[0], np.cumsum(size)])
    starts = np.arange(0, len(size), 8)
    bounds = cum[np.append(starts, len(size))]
    keys = rng.integers(0, 2**63, size=(len(starts), FEISTEL_ROUNDS), dtype=np.uint64)
    out = []
    for j in range(len(starts)):
        g0, g1 = int(bounds[j]), int(bounds[j + 1])
        q = feistel_permute(np.arange(g1 - g0), g1 - g0, keys[j]) + g0
        slot = np.searchsorted(cum, q, side="right") - 1
        out.append(base[slot] + (q - cum[slot]))
    return np.concatenate(out)[:n]


# -- one worker in a child process -------------------------------------------------------------


def child_loader(root: str, ws: int, nw: int) -> dict:
    from episodekit.core.footer import read_footer
    from episodekit.loaders import ShardedLoader, load_plan

    t0 = time.perf_counter()
    plan = load_plan(root, ws, nw)
    loader = ShardedLoader(
        root, plan, rank=0, world_size=ws, worker=0, batch_size=BATCH, delta_timestamps=DELTAS
    )
    t_open = time.perf_counter() - t0
    reader = loader.frames.reader
    t0 = time.perf_counter()
    yielded = []
    for batch in loader:
        yielded.append(batch["index"])
    t_iter = time.perf_counter() - t0
    frames = np.concatenate(yielded)
    rss = peak_rss_mib()
    # Bytes decoded and bytes needed, from the footers (columns the reader reads).
    cols = set(reader.columns)
    rg_bytes = np.zeros(len(reader.rg_start))
    for fid in np.unique(reader.rg_file).tolist():
        md = read_footer(loader.frames.ds.data_path(fid), loader.frames.ds.fs)
        for g in np.flatnonzero(reader.rg_file == fid).tolist():
            rg = md.row_group(int(reader.rg_local[g]))
            rg_bytes[g] = sum(
                rg.column(j).total_uncompressed_size
                for j in range(rg.num_columns)
                if rg.column(j).path_in_schema.split(".")[0] in cols
                or rg.column(j).path_in_schema in cols
            )
    # rows decoded per row group (a shared one may be decoded only up to the bin's range)
    decoded = float((reader.rg_rows_decoded * rg_bytes / np.maximum(reader.rg_rows, 1)).sum())
    ds = loader.frames
    starts = ds.ds.column("dataset_from_index")
    lengths = ds.ds.column("length")
    ep = np.searchsorted(starts, frames, side="right") - 1
    s, e = starts[ep], starts[ep] + lengths[ep]
    rows = [frames]
    for off in ds.offsets.values():
        rows.append(np.clip(frames[:, None] + off[None, :], s[:, None], e[:, None] - 1).ravel())
    needed = np.unique(np.concatenate(rows))
    rg = reader.rg_of(needed)
    useful = float((rg_bytes[rg] / reader.rg_rows[rg]).sum())
    return {
        "shape": f"{ws}x{nw}",
        "frames": int(len(frames)),
        "samples_per_worker": plan.samples_per_worker,
        "open_s": round(t_open, 2),
        "epoch_s": round(t_iter, 2),
        "frames_per_s": round(len(frames) / t_iter),
        "row_groups_decoded": int(reader.rg_decodes.sum()),
        "row_groups_max_decodes": int(reader.rg_decodes.max()),
        "bytes_decoded_mib": round(decoded / 2**20, 1),
        "bytes_needed_mib": round(useful / 2**20, 1),
        "read_amplification": round(decoded / useful, 3),
        "peak_rss_mib": round(rss, 1),
        "decoded_rgs": np.flatnonzero(reader.rg_decodes).tolist(),
        "pools": loader.bin_order(0, 0).num_pools,
        "pool_rows": loader.pool_rows,
    }


def child_baseline(root: str, ws: int, nw: int, rgs: list[int]) -> dict:
    """pq.read_table of the same row groups (one at a time) + numpy gather of the same rows."""
    import pyarrow.parquet as pq

    from episodekit.loaders import ShardedLoader, load_plan
    from episodekit.loaders.reader import column_to_numpy

    plan = load_plan(root, ws, nw)
    loader = ShardedLoader(
        root, plan, rank=0, world_size=ws, worker=0, batch_size=BATCH, delta_timestamps=DELTAS
    )
    frames = loader.epoch_frames(0)
    reader, fds = loader.frames.reader, loader.frames
    starts, lengths = fds.ds.column("dataset_from_index"), fds.ds.column("length")
    ep = np.searchsorted(starts, frames, side="right") - 1
    s, e = starts[ep], starts[ep] + lengths[ep]
    requests = [(c, frames) for c in reader.columns if c not in fds.offsets]
    for key, off in fds.offsets.items():
        requests.append((key, np.clip(frames[:, None] + off[None, :], s[:, None], e[:, None] - 1)))
    t0 = time.perf_counter()
    out = {c: [] for c, _ in requests}
    n = 0
    for g in rgs:
        path = fds.ds.data_path(int(reader.rg_file[g]))
        lo, hi = int(reader.rg_start[g]), int(reader.rg_start[g] + reader.rg_rows[g])
        table = pq.ParquetFile(path).read_row_group(
            int(reader.rg_local[g]), columns=list(reader.columns)
        )
        cols = {c: column_to_numpy(table.column(c), shp) for c, shp in reader.columns.items()}
        del table
        sel = (frames >= lo) & (frames < hi)
        n += int(sel.sum())
        for c, idx in requests:
            ix = idx[sel] - lo
            out[c].append(cols[c][np.clip(ix, 0, hi - lo - 1)])
        del cols
    t = time.perf_counter() - t0
    return {"frames": n, "seconds": round(t, 2), "frames_per_s": round(n / t)}


def child_quality(root: str, ws: int, nw: int) -> dict:
    import pyarrow.parquet as pq

    from episodekit.core.dataset import open_dataset
    from episodekit.loaders import ShardedLoader, load_plan
    from episodekit.loaders.sampler import items_to_ranges
    from episodekit.metadata.plans.build import plan_for_dataset
    from episodekit.metadata.plans.plan_file import Plan

    ds = open_dataset(root)
    starts = ds.column("dataset_from_index")
    plan = load_plan(root, ws, nw)
    loader = ShardedLoader(root, plan, rank=0, world_size=ws, worker=0, speed=False)
    new = loader.epoch_frames(0)
    n = len(new)
    costs = pq.read_table(os.path.join(root, "meta/episode_costs.parquet"))
    old_plan = Plan(plan_for_dataset(ds, costs, ws, nw, locality="none"))
    base, size = items_to_ranges(
        old_plan.bin_items(0, 0), ds.column("episode_index"), ds.column("length"), starts
    )
    old = old_order(base, size, 0, 0, n)
    rng = np.random.default_rng(0)
    glob = rng.choice(ds.num_frames, size=n, replace=False)
    return {
        "old (none plan, pools of 8 episodes)": quality(old, starts),
        "new (rowgroup plan, row-group pools)": quality(new, starts),
        "global shuffle": quality(glob, starts),
        "old_order_bin_episodes": int(len(size)),
    }


def amplification_per_bin(root: str, ws: int, nw: int) -> dict:
    """Read amplification of every bin of a plan from the footers alone (nothing decoded): the
    bytes of the row groups holding its episodes / the bytes of its episodes' rows (windows stay
    inside episodes). The measured worker above is one of these."""
    from episodekit.core.dataset import open_dataset
    from episodekit.core.footer import read_footer
    from episodekit.loaders import load_plan

    ds = open_dataset(root)
    plan = load_plan(ds, ws, nw)
    cols = {k for k, f in ds.features.items() if f.get("dtype") != "video"}
    frm, length = ds.column("dataset_from_index"), ds.column("length")
    rg_lo, rg_rows, rg_bytes = [], [], []
    for fid in range(len(ds.data_files)):
        md = read_footer(ds.data_path(fid), ds.fs)
        first = int(frm[ds.column("file_id") == fid].min())
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            rg_lo.append(first)
            rg_rows.append(rg.num_rows)
            rg_bytes.append(
                sum(
                    rg.column(j).total_uncompressed_size
                    for j in range(rg.num_columns)
                    if rg.column(j).path_in_schema.split(".")[0] in cols
                    or rg.column(j).path_in_schema in cols
                )
            )
            first += rg.num_rows
    order = np.argsort(rg_lo)
    lo = np.asarray(rg_lo)[order]
    rows = np.asarray(rg_rows)[order]
    per_row = (np.asarray(rg_bytes) / np.maximum(rg_rows, 1))[order]
    out = []
    for b in range(plan.num_bins):
        items = plan.bin_items(b // nw, b % nw)
        eps = np.unique(items[:, 0])
        s, n = frm[eps], length[eps]
        a = np.searchsorted(lo, s, side="right") - 1
        z = np.searchsorted(lo, s + n - 1, side="right") - 1
        touched = np.unique(np.concatenate([np.arange(x, y + 1) for x, y in zip(a, z)]))
        decoded = float((per_row[touched] * rows[touched]).sum())
        needed = float(sum((per_row[x] * (t - f)) for x, f, t in zip(a, items[:, 1], items[:, 2])))
        out.append(decoded / needed)
    out = np.asarray(out)
    return {
        "bins": len(out),
        "min": round(float(out.min()), 3),
        "median": round(float(np.median(out)), 3),
        "max": round(float(out.max()), 3),
        "share_at_most_1.5": round(float((out <= 1.5).mean()), 3),
    }


def run_child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- the README snippet ----------------------------------------------------------------------


def snippet(root: str) -> dict:
    """The README's loader snippet, as written (root replaced), timed over one epoch (its first,
    which decodes the worker's row groups), then over the next epoch as a training loop runs it."""
    t0 = time.perf_counter()
    from episodekit.loaders import EpisodeAwareSampler, FrameDataset, ShardedLoader, load_plan

    fps = 30
    ds = FrameDataset(
        root,
        delta_timestamps={
            "action": [k / fps for k in range(50)],  # 50-frame action chunk
            "observation.state": [-2 / fps, -1 / fps, 0.0],  # 3-frame state history
        },
    )
    sample = ds[123]  # noqa: F841
    batch = ds.get_batch([1, 5, 9])  # noqa: F841
    plan = load_plan(root, world_size=8, num_workers=4)  # error if missing or stale
    sampler = EpisodeAwareSampler(ds, seed=0, plan=plan, rank=0, world_size=8)  # noqa: F841
    loader = ShardedLoader(
        root,
        plan,
        rank=0,
        world_size=8,
        worker=0,
        num_workers=4,
        batch_size=256,
        seed=0,
    )
    t_setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = 0
    for batch in loader:  # exactly plan.samples_per_worker frames
        n += len(batch["index"])
    t = time.perf_counter() - t0
    state = loader.state_dict()  # noqa: F841
    t0 = time.perf_counter()
    n2 = sum(len(b["index"]) for b in loader)  # epoch 1 (a training loop runs many)
    t2 = time.perf_counter() - t0
    return {
        "epoch1_frames_per_s": round(n2 / t2),
        "frames": n,
        "setup_s": round(t_setup, 2),
        "epoch_s": round(t, 3),
        "frames_per_s": round(n / t),
        "frames_per_s_incl_setup": round(n / (t + t_setup)),
        "locality": plan.locality,
        "row_groups_decoded": int(loader.frames.reader.rg_decodes.sum()),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", help="A prepared ~10M-frame root (read-only here).")
    p.add_argument("--workdir", default=os.path.join(BENCH, "stream-root"))
    p.add_argument("--shapes", default="8x2,64x4")
    p.add_argument("--snippet", help="Run the README snippet on this prepared root.")
    p.add_argument("--estimate", action="store_true", help="Footer-only amplification, all bins.")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        kind, root, ws, nw, *rest = a.child
        if kind == "loader":
            res = child_loader(root, int(ws), int(nw))
        elif kind == "baseline":
            res = child_baseline(root, int(ws), int(nw), json.loads(rest[0]))
        elif kind == "quality":
            res = child_quality(root, int(ws), int(nw))
        else:
            res = snippet(root)
        print(json.dumps(res))
        return
    if a.snippet:
        res = run_child("snippet", a.snippet, "0", "0")
        print(json.dumps(res, indent=2))
        return
    from episodekit.metadata.plans.build import ensure_plans, format_balance

    root = str(make_workdir(Path(a.root), Path(a.workdir)))
    if a.estimate:
        for shape in a.shapes.split(","):
            ws, nw = (int(x) for x in shape.split("x"))
            ensure_plans(root, [ws], nw, locality="rowgroup")
            print(shape, json.dumps(amplification_per_bin(root, ws, nw)))
        return
    report = {}
    for shape in a.shapes.split(","):
        ws, nw = (int(x) for x in shape.split("x"))
        t0 = time.perf_counter()
        ((_, plan, _),) = ensure_plans(root, [ws], nw, locality="rowgroup")
        print(format_balance(plan), f"\n  planned in {time.perf_counter() - t0:.1f}s", flush=True)
        load = run_child("loader", root, str(ws), str(nw))
        base = run_child("baseline", root, str(ws), str(nw), json.dumps(load["decoded_rgs"]))
        qual = run_child("quality", root, str(ws), str(nw))
        load.pop("decoded_rgs")
        res = {
            "amplification_all_bins": amplification_per_bin(root, ws, nw),
            "plan_max_over_lb": plan["balance"]["plan"]["max_over_lower_bound"],
            "row_groups": plan.get("row_groups"),
            "loader": load,
            "baseline": base,
            "speed_ratio": round(load["frames_per_s"] / base["frames_per_s"], 3),
            "shuffle": qual,
        }
        report[shape] = res
        print(json.dumps({shape: res}, indent=2), flush=True)


if __name__ == "__main__":
    main()
