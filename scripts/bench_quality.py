"""Benchmark the quality.* checks: time at ~2M frames, false positives, seeded corruptions.

In one run (the machine is shared and noisy: compare the ratios, measured in the same run):
  1. time, best of --repeat interleaved rounds, wall and CPU: a plain duckdb scan reading
     the same columns the quality checks read (episode_index, index, timestamp, action,
     observation.state); today's `validate` (every check except quality.*); `validate` with
     all checks on; the quality checks alone.
     The bar: all checks <= 2x today's validate.
  2. quality findings on the clean ~2M-frame sample (must be 0).
  3. seeded corruptions at scale: one copy of the 2M sample with a corruption of every signal /
     timing kind in a different episode (plus a distribution shift of the last quarter), one
     validation, caught/missed each with the right episode and feature.
  4. the test corpus (tests/corruptions.py QUALITY_CORRUPTIONS, every kind, 80 episodes):
     caught/missed for `validate` and, when installed (pip install lerobot-doctor), for
     lerobot-doctor, with times: caught = a WARN/FAIL message the clean twin does not have
     that names the episode (per-episode kinds); "vague" = new messages that do not.

    .venv/bin/python scripts/bench_quality.py [--root $EPISODEKIT_BENCH/quality-2m] [--repeat 3]
        [--no-doctor] [--doctor-at-scale]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core.dataset import read_info
from episodekit.sample import write_sample
from episodekit.validate.runner import validate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from corruptions import QUALITY_CORRUPTIONS, QUALITY_SPEC  # noqa: E402

# Where scripts/bench_data.py wrote the benchmark roots (EPISODEKIT_BENCH, default ./bench-data).
BENCH = os.environ.get("EPISODEKIT_BENCH", "bench-data")

SPEC = {"episodes": 6000, "tasks": 8, "seed": 7, "mean_length": 345}
COLUMNS = ("episode_index", "index", "timestamp", "action", "observation.state")


def ensure_sample(root: Path) -> None:
    info = root / "meta/info.json"
    if info.exists() and read_info(str(root))["total_episodes"] == SPEC["episodes"]:
        return
    t0 = time.perf_counter()
    write_sample(root, **SPEC)
    print(f"wrote sample {root} in {time.perf_counter() - t0:.1f}s")


def plain_scan(files: list[str]) -> None:
    con = duckdb.connect()
    con.sql(
        "SELECT count(*), sum(episode_index), sum(index), sum(timestamp), "
        'sum(list_sum(action)), sum(list_sum("observation.state")) '
        f"FROM read_parquet({files!r})"
    ).fetchall()


# ---------------------------------------------------------------------------------------------
# Corruptions at scale: every signal / timing kind in its own episode, one pass over the files.


def scale_corruptions(root: Path) -> list[tuple[str, int | None, str]]:
    """Corrupt ``root`` in place; returns the expected (check, episode, feature) findings."""
    ep_t = pq.read_table(
        root / "meta/episodes/chunk-000/file-000.parquet", columns=["episode_index", "length"]
    )
    lengths = ep_t["length"].to_numpy()
    n = len(lengths)
    long_eps = [int(e) for e in np.flatnonzero(lengths >= 300)]
    fps = read_info(str(root))["fps"]
    frozen_run_ep, offset_ep = long_eps[0], long_eps[1]
    edits = {  # episode -> (feature, how)
        100: ("action", "spike"),
        200: ("action", "frozen"),
        frozen_run_ep: ("observation.state", "frozen_run"),
        offset_ep: ("observation.state", "bump"),
        300: ("action", "clip"),
        400: ("action", "offset"),
        500: ("timestamp", "drop"),
        600: ("timestamp", "slow"),
    }
    expected = [
        ("quality.jump", 100, "action"),
        ("quality.frozen", 200, "action"),
        ("quality.frozen_run", frozen_run_ep, "observation.state"),
        ("quality.out_of_range", offset_ep, "observation.state"),
        ("quality.clipping", 300, "action"),
        ("quality.action_range", 400, "action"),
        ("quality.dropped_frames", 500, "timestamp"),
        ("quality.frame_interval", 600, "timestamp"),
        ("quality.shift", None, "observation.state"),
    ]
    shift_from = n - n // 4
    for path in sorted(root.glob("data/*/*.parquet")):
        t = pq.read_table(path)
        ep = t["episode_index"].to_numpy()
        cols = {}
        for c in ("action", "observation.state"):
            col = t[c].combine_chunks()
            cols[c] = col.values.to_numpy().reshape(len(col), col.type.list_size).copy()
        ts = t["timestamp"].to_numpy().copy()
        state = cols["observation.state"]
        state[ep >= shift_from, 0] += 2.0  # distribution shift of the last quarter
        for e, (feature, how) in edits.items():
            rows = np.flatnonzero(ep == e)
            if not len(rows):
                continue
            if how == "drop":
                ts[rows[10:]] += 3 / fps
                continue
            if how == "slow":
                ts[rows] *= 1.2
                continue
            x = cols[feature]
            part = x[rows]
            if how == "spike":
                part[10, 3] = 1000.0
            elif how == "frozen":
                part[:] = part[0]
            elif how == "frozen_run":
                part[:] = np.concatenate([part[:20], np.repeat(part[20:21], 120, 0), part[20:-120]])
            elif how == "bump":
                part[10:50, 2] += 10.0 * np.sin(np.linspace(0, np.pi, 40)) ** 2
            elif how == "clip":
                u = np.arange(len(part)) / len(part)
                part[:, 1] = part[:, 1].mean() + np.clip(0.5 * np.sin(6 * np.pi * u), -0.3, 0.3)
            elif how == "offset":
                part[:, 4] += 5.0
            x[rows] = part
        for c, x in cols.items():
            i = t.schema.get_field_index(c)
            arr = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
            t = t.set_column(i, t.schema.field(i), arr)
        i = t.schema.get_field_index("timestamp")
        t = t.set_column(i, t.schema.field(i), pa.array(ts, pa.float32()))
        pq.write_table(t, path)
    return expected


def caught(report, check: str, episode, feature) -> bool:
    return any(
        f.check == check and f.episode == episode and (feature is None or f.feature == feature)
        for f in report.findings
    )


# ---------------------------------------------------------------------------------------------
# lerobot-doctor, when installed.


def doctor_bin() -> str | None:
    exe = Path(sys.executable).parent / "lerobot-doctor"
    return str(exe) if exe.exists() else shutil.which("lerobot-doctor")


def doctor_messages(exe: str, root: Path, timeout: float = 900) -> tuple[set[str], float, str]:
    """Non-PASS messages of ``lerobot-doctor ROOT --ci``, seconds, and a status."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            [exe, str(root), "--ci"], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return set(), time.perf_counter() - t0, f"timeout {timeout:.0f}s"
    dt = time.perf_counter() - t0
    try:
        doc = json.loads(out.stdout)
    except ValueError:
        return set(), dt, f"no JSON (exit {out.returncode}): {out.stderr.strip()[-120:]}"
    msgs = {
        f"{c['name']}: {m['message']}"
        for c in doc.get("checks", [])
        for m in c.get("messages", [])
        if m.get("severity") != "PASS"
    }
    return msgs, dt, f"exit {out.returncode}"


def names_it(message: str, episode: int | None, feature: str | None) -> bool:
    """A lerobot-doctor message counts as catching the corruption when it names the episode
    (per-episode kinds) or, for dataset-level kinds, is new at all (feature named if any)."""
    if episode is not None:
        return re.search(rf"(?<![\d.]){episode}(?![\d.])", message) is not None
    return feature is None or feature in message or "task" in message.lower()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(BENCH, "quality-2m"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-doctor", action="store_true")
    ap.add_argument("--doctor-at-scale", action="store_true", help="also run it on the 2M root")
    args = ap.parse_args()
    root = Path(args.root)
    ensure_sample(root)
    info = read_info(str(root))
    files = sorted(str(p) for p in root.glob("data/*/*.parquet"))
    size = sum(Path(f).stat().st_size for f in files) / 2**20
    print(
        f"sample: {info['total_frames']:,} frames, {info['total_episodes']:,} episodes, "
        f"{len(files)} data files, {size:.0f} MiB"
    )

    # 1. Time: rounds interleave the four runs; best wall and best CPU (process time, all
    # threads) per run. On a shared machine the CPU figures are the steadier ones.
    runs = {
        "scan": lambda: plain_scan(files),
        "today": lambda: validate(str(root), checks="all,-quality"),
        "all": lambda: validate(str(root)),
        "quality": lambda: validate(str(root), checks="quality"),
    }
    wall = {k: float("inf") for k in runs}
    cpu = {k: float("inf") for k in runs}
    out = {}
    for _ in range(args.repeat):
        for k, fn in runs.items():
            w, c = time.perf_counter(), time.process_time()
            out[k] = fn()
            wall[k] = min(wall[k], time.perf_counter() - w)
            cpu[k] = min(cpu[k], time.process_time() - c)
    rep_q = out["quality"]
    labels = {
        "scan": f"plain duckdb scan of {', '.join(COLUMNS)}",
        "today": "validate, every check but quality.* (today)",
        "all": "validate, all checks incl. quality.*",
        "quality": "quality.* alone",
    }
    for k in runs:
        print(f"{labels[k]:<58} wall {wall[k]:6.2f}s  cpu {cpu[k]:6.2f}s")
    print(
        f"all / today: wall {wall['all'] / wall['today']:.2f}x, "
        f"cpu {cpu['all'] / cpu['today']:.2f}x (bar <= 2x);  all / plain scan: "
        f"wall {wall['all'] / wall['scan']:.1f}x, "
        f"cpu {cpu['all'] / cpu['scan']:.1f}x;  quality alone / plain scan: "
        f"wall {wall['quality'] / wall['scan']:.1f}x, cpu {cpu['quality'] / cpu['scan']:.1f}x"
    )
    # 2. False positives.
    print(f"quality findings on the clean sample: {len(rep_q.findings)}")
    for f in rep_q.findings[:10]:
        print(f"   {f.check} episode {f.episode}: {f.message}")

    # 3. Seeded corruptions at scale.
    with tempfile.TemporaryDirectory(dir=root.parent, prefix="quality-corrupt-") as tmp:
        bad = Path(tmp) / "root"
        shutil.copytree(root, bad)
        expected = scale_corruptions(bad)
        t0 = time.perf_counter()
        rep = validate(str(bad), checks="quality")
        dt = time.perf_counter() - t0
        hits = [caught(rep, *e) for e in expected]
        print(f"\nseeded corruptions at scale ({dt:.1f}s): {sum(hits)}/{len(hits)} caught")
        for (check, ep, feat), ok in zip(expected, hits):
            print(f"   {'caught' if ok else 'MISSED'}  {check:<24} episode {ep} {feat}")
        expected_checks = {e[0] for e in expected}
        stray = [f for f in rep.findings if f.check not in expected_checks]
        print(f"   other quality findings: {len(stray)}")
        for f in stray[:5]:
            print(f"      {f.check} episode {f.episode}: {f.message}")
        if args.doctor_at_scale and not args.no_doctor and doctor_bin():
            msgs, dt, status = doctor_messages(doctor_bin(), root)
            print(f"   lerobot-doctor on the clean 2M root: {dt:.1f}s ({status})")

    # 4. The test corpus, validate vs lerobot-doctor.
    exe = None if args.no_doctor else doctor_bin()
    with tempfile.TemporaryDirectory(prefix="quality-corpus-") as tmp:
        base = write_sample(Path(tmp) / "clean", **QUALITY_SPEC)
        clean_msgs, t_doc_clean, _ = doctor_messages(exe, base) if exe else (set(), 0.0, "")
        print(f"\ncorpus: {len(QUALITY_CORRUPTIONS)} kinds on {QUALITY_SPEC}")
        if exe:
            print(f"lerobot-doctor on the clean twin: {len(clean_msgs)} WARN/FAIL messages")
        else:
            print("lerobot-doctor: not installed (pip install lerobot-doctor)")
        head = f"{'kind':<22} {'validate':<9} {'s':>5}   {'lerobot-doctor':<14} {'s':>5}"
        print(head + "  first new message")
        n_ours = n_doc = 0
        t_ours = t_doc = 0.0
        for name, fn in QUALITY_CORRUPTIONS.items():
            r = Path(tmp) / name
            shutil.copytree(base, r)
            exp = fn(r)
            t0 = time.perf_counter()
            rep = validate(str(r), checks="all,-layout")
            dt = time.perf_counter() - t0
            t_ours += dt
            ok = caught(rep, exp.check, exp.episode, exp.feature) or (
                exp.episode is None
                and any(f.check == exp.check and f.feature == exp.feature for f in rep.findings)
            )
            n_ours += ok
            doc_cell, doc_dt, first = "-", 0.0, ""
            if exe:
                msgs, doc_dt, status = doctor_messages(exe, r)
                new = sorted(msgs - clean_msgs)
                named = [m for m in new if names_it(m, exp.episode, exp.feature)]
                t_doc += doc_dt
                n_doc += bool(named)
                if named:
                    doc_cell, first = "caught", named[0][:70]
                elif new:
                    doc_cell, first = "vague", new[0][:70]
                else:
                    doc_cell = "MISSED" if status.startswith("exit") else status
            print(
                f"{name:<22} {'caught' if ok else 'MISSED':<9} {dt:5.2f}   {doc_cell:<14} "
                f"{doc_dt:5.1f}  {first}"
            )
            shutil.rmtree(r)
        total = len(QUALITY_CORRUPTIONS)
        print(f"validate: {n_ours}/{total} caught in {t_ours:.1f}s", end="")
        print(f"; lerobot-doctor: {n_doc}/{total} in {t_doc:.1f}s" if exe else "")


if __name__ == "__main__":
    main()
