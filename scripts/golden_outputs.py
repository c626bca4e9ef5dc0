"""Pin what every command writes and prints, so a refactor can prove it changed nothing.

Runs each command of :data:`CASES` (as a user does: ``python -m episodekit.cli``) on fresh
copies of the LeRobot-written fixtures and of a sample, and digests every file it leaves under
the work folder and its ``--json`` report (sha256; the work folder's path replaced by
``<BASE>``; timings, mtimes and other per-run values removed, see :func:`_normalize`).

    .venv/bin/python scripts/golden_outputs.py --record   # write tests/fixtures/golden.json
    .venv/bin/python scripts/golden_outputs.py            # compare with it (exit 1 on a change)

``--record`` runs everything twice and refuses to pin a digest that differs between the two
runs (it names the entry: normalize it here, or fix the non-determinism). Re-record only for
an intended change of an output, and say which in the commit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lerobot"
PINNED = REPO / "tests" / "fixtures" / "golden.json"

# Keys of JSON documents (reports and artifacts) that hold per-run values: removed before digests.
VOLATILE = {
    "seconds", "elapsed", "elapsed_s", "mb_per_s", "throughput", "started", "finished",
    "created", "created_at", "written_at", "time", "timestamp_utc", "state", "rerun", "mtime",
    "pid", "host", "hostname", "duration", "wall_s", "took", "mtime_ns",
}  # fmt: skip
# Files whose bytes hold per-run values beyond JSON keys (lock files, our markers).
SKIP_NAMES = {".episodekit.lock", ".episodekit-output"}
ELAPSED = re.compile(rb" in [0-9]+(?:\.[0-9]+)?s\b")
# Per-run keys of particular files (a dataset writer's recipe key covers the inputs' mtimes).
VOLATILE_IN = {".episodekit-surgery.json": {"key"}, ".episodekit-repair.json": {"key"}}

# (name, fixture copies to make, [command, ...]); {X} is the copy of fixture X (or of the
# sample "S"), {OUT} a fresh folder for this case. Every command's stdout is digested.
CASES: list[tuple[str, list[str], list[list[str]]]] = [
    ("info", ["rec40", "vid24", "v21vid8"], [
        ["info", "{rec40}", "--json"], ["info", "{vid24}", "--json"],
        ["info", "{v21vid8}", "--json"],
    ]),
    ("validate", ["rec40", "edited35", "vid24"], [
        ["validate", "{rec40}", "--json"], ["validate", "{edited35}", "--json", "--deep"],
        ["validate", "{vid24}", "--json", "--deep"],
    ]),
    ("prepare", ["rec40"], [
        ["prepare", "{rec40}", "--world-size", "2,4", "--workers", "2", "-j", "1",
         "--canonical-bins", "auto", "--json"],
        ["prepare", "{rec40}", "--world-size", "2,4", "--workers", "2", "-j", "1",
         "--canonical-bins", "auto", "--json"],
        ["validate", "{rec40}", "--json"],
    ]),
    ("prepare_recompute", ["edited35"], [
        ["prepare", "{edited35}", "--world-size", "2", "--workers", "2", "-j", "1",
         "--stats", "recompute", "--json"],
    ]),
    ("prepare_video", ["vid24"], [
        ["prepare", "{vid24}", "--out", "{OUT}", "--videos", "--world-size", "2", "--workers",
         "2", "-j", "1", "--json"],
    ]),
    ("metadata", ["edited35"], [
        ["metadata", "speed", "{edited35}", "--json"],
        ["metadata", "costs", "{edited35}", "--json"],
        ["metadata", "plan", "{edited35}", "--world-size", "2,4", "--workers", "2", "--json"],
        ["metadata", "stats", "{edited35}", "--json"],
    ]),
    ("rowgroups", ["rec40"], [
        ["prep", "rowgroups", "{rec40}", "--out", "{OUT}", "-j", "1", "--json"],
    ]),
    ("frames", ["edited35"], [
        ["prep", "frames", "{edited35}", "--store", "{OUT}", "--json"],
    ]),
    ("edit", ["rec40", "vid24"], [
        ["edit", "{rec40}", "--out", "{OUT}/e", "--drop-episodes", "3,7,10-12", "--json"],
        ["edit", "{vid24}", "--out", "{OUT}/v", "--drop-episodes", "0,5", "--json"],
    ]),
    ("split_merge", ["rec40", "edited35"], [
        ["split", "{rec40}", "--out", "{OUT}/s", "--fractions", "a=0.7,b=0.3", "--seed", "1",
         "--json"],
        ["merge", "{rec40}", "{edited35}", "--out", "{OUT}/m", "--json"],
    ]),
    ("convert", ["v21vid8"], [
        ["convert", "{v21vid8}", "--out", "{OUT}", "--json"],
    ]),
    ("repair", ["crash_rec7", "crash_vid5"], [
        ["repair", "{crash_rec7}", "--dry-run", "--json"],
        ["repair", "{crash_rec7}", "--out", "{OUT}/r", "--json"],
        ["repair", "{crash_vid5}", "--out", "{OUT}/v", "--json"],
        ["validate", "{crash_rec7}", "--json"],
    ]),
    ("sample", [], [
        ["sample", "{OUT}/s", "--episodes", "30", "--seed", "4"],
        ["prepare", "{OUT}/s", "--world-size", "2", "--workers", "2", "-j", "1", "--json"],
    ]),
]  # fmt: skip


def _normalize(doc, volatile: set[str] = VOLATILE):
    """``doc`` without per-run values (recursively)."""
    if isinstance(doc, dict):
        return {k: _normalize(v, volatile) for k, v in sorted(doc.items()) if k not in volatile}
    if isinstance(doc, list):
        return [_normalize(v, volatile) for v in doc]
    if isinstance(doc, str) and doc.startswith("{"):  # a JSON document kept as a string value
        try:
            return json.dumps(_normalize(json.loads(doc), volatile), sort_keys=True)
        except ValueError:
            return doc
    return doc


def _digest(data: bytes, base: Path, as_json: bool, name: str = "") -> str:
    data = data.replace(str(base).encode(), b"<BASE>")
    data = ELAPSED.sub(b" in <T>s", data)  # human lines end with the run's wall time
    if as_json:
        volatile = VOLATILE | VOLATILE_IN.get(name, set())
        try:
            data = json.dumps(_normalize(json.loads(data), volatile), sort_keys=True).encode()
        except ValueError:
            pass
    return hashlib.sha256(data).hexdigest()[:20]


def _files(base: Path, skip: set[str]) -> dict[str, str]:
    out = {}
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base).as_posix()
        if not p.is_file() or p.name in SKIP_NAMES or rel in skip or rel.startswith("cache/"):
            continue
        out[rel] = _digest(p.read_bytes(), base, p.suffix in (".json", ".jsonl"), p.name)
    return out


def run_case(name: str, fixtures: list[str], commands: list[list[str]], tmp: Path) -> dict:
    """Digests of one case: each command's exit code and stdout, then every file left."""
    base = tmp / name
    base.mkdir()
    subs = {"OUT": str(base / "out")}
    for f in fixtures:
        shutil.copytree(FIXTURES / f, base / f)
        subs[f] = str(base / f)
    env = {**os.environ, "EPISODEKIT_CACHE": str(base / "cache"), "NO_COLOR": "1"}
    env.pop("EPISODEKIT_DEBUG", None)
    result: dict = {}
    for i, cmd in enumerate(commands):
        args = [a.format(**subs) for a in cmd]
        proc = subprocess.run(
            [sys.executable, "-m", "episodekit.cli", *args],
            capture_output=True,
            cwd=tmp,
            env=env,
            timeout=900,
        )
        key = f"{i}: {' '.join(cmd)}"
        result[key] = {
            "exit": proc.returncode,
            "stdout": _digest(proc.stdout, base, "--json" in cmd),
        }
        if proc.returncode not in (0, 1):
            result[key]["stderr"] = proc.stderr.decode(errors="replace")[-300:]
    result["files"] = _files(base, set())
    return result


def run_all(only: set[str] | None = None) -> dict:
    table = {}
    with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
        for name, fixtures, commands in CASES:
            if only and name not in only:
                continue
            print(f"  {name} ...", file=sys.stderr, flush=True)
            table[name] = run_case(name, fixtures, commands, Path(tmp))
    return table


def _diff(a, b, where: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{where}/{k}: new")
            elif k not in b:
                out.append(f"{where}/{k}: gone")
            else:
                out += _diff(a[k], b[k], f"{where}/{k}")
        return out
    return [] if a == b else [f"{where}: {a} -> {b}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="(re)write the pinned digests")
    ap.add_argument("--only", help="comma-separated case names")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    first = run_all(only)
    if args.record:
        second = run_all(only)
        unstable = _diff(first, second)
        if unstable:
            print("not deterministic between two runs:\n  " + "\n  ".join(unstable))
            return 1
        pinned = json.loads(PINNED.read_text()) if PINNED.exists() and only else {}
        pinned.update(first)
        PINNED.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
        print(f"recorded {len(first)} cases into {PINNED.relative_to(REPO)}")
        return 0
    pinned = json.loads(PINNED.read_text())
    if only:
        pinned = {k: v for k, v in pinned.items() if k in only}
    changes = _diff(pinned, first)
    print("\n".join(changes) if changes else f"all {len(first)} cases unchanged")
    return 1 if changes else 0


if __name__ == "__main__":
    sys.exit(main())
