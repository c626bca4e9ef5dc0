"""Benchmark: ``validate --metadata-only`` of a >= 1 GB root served over HTTP, against a full run.

Makes the dataset under ``--dir`` unless it is there (``episodekit sample`` + ``episodekit
prepare``, commands printed, fixed seed), serves it with scripts/range_server.py (the standard
library's http.server with Range requests and folder pages, counting the body bytes it sends),
and runs, as a user does, each a new process:

1. ``episodekit validate http://127.0.0.1:PORT --metadata-only --json`` (fsspec's ``http``
   filesystem is the client): bytes the server sent / the dataset's bytes (bar: <= 1 %), by kind
   (meta/, parquet footers, mp4 boxes), requests and seconds;
2. ``episodekit validate DIR --json``, the full local run: every check the metadata-only run ran
   must give the same findings (the checks it ran in part, a subset of the full run's);
3. the same two on a corrupted copy (hard links, each damaged file replaced, never edited in
   place): info.json totals and a video codec, an episodes row pointing at a missing data file,
   a data file's footer cut, a stats.json value: the metadata-only findings equal the full run's;
4. ``--sample-episodes N`` over HTTP: bytes and the row groups it read.

    .venv/bin/python scripts/bench_metadata_only.py --dir $EPISODEKIT_BENCH/remote-1g

Exit 1 when a bar is missed (bytes > 1 %, a finding differs).
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

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from range_server import serve  # noqa: E402 - the server beside this script

EK = [sys.executable, "-m", "episodekit.cli"]
SAMPLE_ARGS = ["--videos", "2", "--video-size", "240x320", "--video-codec", "h264"]
BAR = 0.01


def run(*args: str) -> None:
    print("$ episodekit " + " ".join(args), flush=True)
    subprocess.run([*EK, *args], check=True)


def ensure_dataset(root: Path, episodes: int, seed: int) -> None:
    if (root / "meta" / "info.json").exists():
        return
    run("sample", str(root), "--episodes", str(episodes), "--seed", str(seed), *SAMPLE_ARGS)
    run("prepare", str(root), "--quiet")


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def validate_json(root: str, *extra: str) -> tuple[dict, float]:
    t0 = time.perf_counter()
    cmd = [*EK, "validate", root, "--json", "-q", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        sys.exit(f"validate {root} {' '.join(extra)} exited {r.returncode}: {r.stderr[-2000:]}")
    return json.loads(r.stdout), seconds


def findings(doc: dict, roots: tuple[str, ...]) -> dict[str, set[tuple]]:
    """Findings by check, as (severity, file, episode, message) with the root's name replaced."""
    out: dict[str, set[tuple]] = {}
    for f in doc["findings"]:
        msg = f["message"]
        for r in roots:
            msg = msg.replace(r, "ROOT")
        out.setdefault(f["check"], set()).add((f["severity"], f["file"], f["episode"], msg))
    return out


def compare(meta: dict, full: dict, roots: tuple[str, ...]) -> list[str]:
    """Differences between the metadata-only run and the full one, check by check."""
    a, b = findings(meta, roots), findings(full, roots)
    partial = set(meta.get("checks_partial", {}))
    bad = []
    for check in meta["checks_run"]:
        got, want = a.get(check, set()), b.get(check, set())
        if check in partial:
            if not got <= want:
                bad.append(f"{check}: not in the full run: {sorted(got - want)[:3]}")
        elif got != want:
            bad.append(f"{check}: metadata-only {sorted(got)[:3]} vs full {sorted(want)[:3]}")
    return bad


def by_kind(log: list[tuple[str, str, int]]) -> dict[str, int]:
    kinds = {"meta/": 0, "data/ (footers)": 0, "videos/ (boxes)": 0, "other": 0}
    for _, path, n in log:
        key = next((k for k in kinds if path.lstrip("/").startswith(k.split(" ")[0])), "other")
        kinds[key] += n
    return kinds


def measure(root: Path, label: str, size: int, extra: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """Metadata-only (or ``extra``) over HTTP, then the full local run; prints both."""
    with serve(root) as server:
        doc, secs = validate_json(server.url, "--metadata-only", *extra)
        sent, requests, log = server.body_bytes, server.requests, list(server.counters.log)
        url = server.url
    kinds = ", ".join(f"{k} {v:,}" for k, v in by_kind(log).items() if v)
    print(
        f"{label}: --metadata-only {' '.join(extra)} over HTTP: {sent:,} bytes sent of {size:,} "
        f"= {sent / size:.4%} ({kinds}); {requests} requests; {secs:.1f} s; "
        f"{len(doc['checks_run'])} checks run, {len(doc.get('checks_skipped', {}))} not run; "
        f"{doc['counts']}"
    )
    full, fsecs = validate_json(str(root))
    n = len(full["checks_run"])
    print(f"{label}: full local run {fsecs:.1f} s, {n} checks, {full['counts']}")
    doc["_bytes"], doc["_url"] = sent, url
    return doc, full


def corrupt_copy(src: Path, dst: Path) -> list[str]:
    """A copy of ``src`` as hard links, with five files replaced by damaged ones."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, copy_function=os.link)

    def replace(rel: str, data: bytes) -> None:
        p = dst / rel
        p.unlink()  # a new file: the hard-linked source stays as it was
        p.write_bytes(data)

    info = json.loads((src / "meta/info.json").read_text())
    info["total_frames"] += 7
    cam = next(k for k, f in info["features"].items() if f.get("dtype") == "video")
    info["features"][cam]["info"]["video.codec"] = "av1"
    replace("meta/info.json", json.dumps(info, indent=4).encode())
    stats = json.loads((src / "meta/stats.json").read_text())
    stats["action"]["max"][0] = stats["action"]["min"][0] - 1.0
    replace("meta/stats.json", json.dumps(stats, indent=4).encode())
    data = sorted((src / "data").rglob("*.parquet"))
    cut = data[-1].relative_to(src).as_posix()
    replace(cut, data[-1].read_bytes()[:-100])  # the footer's end: no magic bytes
    ep = sorted((src / "meta/episodes").rglob("*.parquet"))[0]
    t = pq.read_table(ep)
    i = t.column_names.index("data/file_index")
    t = t.set_column(i, t.schema.field(i), [[999] + t["data/file_index"].to_pylist()[1:]])
    rel = ep.relative_to(src).as_posix()
    (dst / rel).unlink()
    pq.write_table(t, dst / rel)
    return ["info.totals", "video.codec", "stats.order", "data.read", "info.paths"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench = os.environ.get("EPISODEKIT_BENCH", "./bench-data")
    ap.add_argument("--dir", default=os.path.join(bench, "remote-1g"), help="the dataset root")
    ap.add_argument("--episodes", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--sample", type=int, default=8, help="--sample-episodes N also measured")
    ap.add_argument("--no-corrupt", action="store_true", help="skip the corrupted copy")
    args = ap.parse_args()
    root = Path(args.dir).resolve()
    ensure_dataset(root, args.episodes, args.seed)
    size = tree_bytes(root)
    print(f"dataset {root}: {size:,} bytes ({size / 2**30:.2f} GiB)")
    failed = []
    meta, full = measure(root, "clean", size)
    if meta["_bytes"] > BAR * size:
        failed.append(f"{meta['_bytes'] / size:.4%} of the dataset read (bar {BAR:.0%})")
    failed += compare(meta, full, (str(root), meta["_url"]))
    if args.sample:
        doc, _ = measure(root, "clean", size, ("--sample-episodes", str(args.sample)))
        print(f"  sampled episodes {doc['scope']['sample_episodes']}; notes {doc.get('notes', [])}")
    if not args.no_corrupt:
        bad = root.with_name(root.name + "-corrupt")
        expected = corrupt_copy(root, bad)
        meta, full = measure(bad, "corrupted", tree_bytes(bad))
        got = {f["check"] for f in meta["findings"] if f["severity"] == "error"}
        missing = [c for c in expected if c not in got]
        if missing:
            failed.append(f"corruptions not found by --metadata-only: {missing}")
        failed += compare(meta, full, (str(bad), meta["_url"]))
        print(f"corrupted copy: metadata-only errors {sorted(got)}")
        shutil.rmtree(bad)
    for line in failed:
        print(f"FAILED: {line}")
    if not failed:
        print("OK: bytes within the bar, the same findings as the full run for every check run")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
