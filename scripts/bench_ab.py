"""A/B: the same commands run by two versions of episodekit, CPU time compared in one run.

"No benchmark slower" after a refactor needs the old and the new code measured side by side on
the same data while the machine's load is the same for both. This installs the ``--base``
revision (any git revision of this repository) into a folder of its own, then runs each case in
a fresh process, alternating base and head for ``--rounds`` rounds, and reports the median of
head / base of the children's CPU time (user + sys: less sensitive to a shared machine than wall
time, which is shown too). Each version runs each case once first, unmeasured, so that both
import from bytecode caches and read the data from the page cache.

    make the data (once):  .venv/bin/episodekit sample DIR/src --episodes 3000 --seed 7
    measure:               .venv/bin/python scripts/bench_ab.py --base REV --data DIR/src \
                               [--rounds 8] [--case prep-rowgroups --case edit ...]

Cases (each a command on ``--data``, outputs under ``--work``): prep-rowgroups (``prep rowgroups
--out``), edit (``edit --drop-episodes 1,2,3 --out``), validate (``validate``), get-batch (one
process reading 200 random batches of 256 frames with ``FrameDataset.get_batch``). A ratio below
1 means head is cheaper.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GET_BATCH = """
import numpy as np, sys
from episodekit.loaders import FrameDataset
ds = FrameDataset(sys.argv[1], speed="memory", video_backend="paths")
rng = np.random.default_rng(0)
for _ in range(200):
    ds.get_batch(np.sort(rng.choice(len(ds), 256, replace=False)))
"""


def case_argv(case: str, data: Path, out: Path) -> list[str]:
    """The command of ``case`` (after the python executable)."""
    cli = ["-m", "episodekit.cli"]
    return {
        "prep-rowgroups": [*cli, "prep", "rowgroups", str(data), "--out", str(out)],
        "edit": [*cli, "edit", str(data), "--out", str(out), "--drop-episodes", "1,2,3"],
        "validate": [*cli, "validate", str(data)],
        "get-batch": ["-c", GET_BATCH, str(data)],
    }[case]


def install(rev: str, into: Path) -> Path:
    """``rev`` of this repository installed (not editable) under ``into``; the folder to put
    first on PYTHONPATH."""
    tree = into / "tree"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev],
        check=True,
        capture_output=True,
    )
    site = into / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(tree),
        ],
        check=True,
    )
    return site


def run_once(argv: list[str], pythonpath: str | None, cwd: Path) -> tuple[float, float]:
    """CPU seconds (user + sys of the child and its children) and wall seconds of one run."""
    env = {**os.environ, "EPISODEKIT_SPEED_IN_MEMORY": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # both versions import from bytecode caches
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):  # (validate may find warnings-as-errors on a sample)
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def which_code(pythonpath: str | None, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    code = "import episodekit.core, os; print(os.path.dirname(episodekit.core.__file__))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", required=True, help="git revision to compare against (e.g. a tag)")
    p.add_argument("--data", required=True, type=Path, help="a dataset root (see above)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument(
        "--case", action="append", choices=["prep-rowgroups", "edit", "validate", "get-batch"]
    )
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temp one)")
    args = p.parse_args()
    cases = args.case or ["prep-rowgroups", "edit", "validate", "get-batch"]
    work = args.work or Path(tempfile.mkdtemp(prefix="episodekit-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir = work / "cwd"  # not the repository: `python -m` must not import head from its cwd
    run_dir.mkdir(exist_ok=True)
    try:
        base_site = str(install(args.base, work / "base"))
        versions = {"base": base_site, "head": None}
        for name, path in versions.items():
            print(f"{name}: {which_code(path, run_dir)}")
        for case in cases:
            cpu: dict[str, list[float]] = {"base": [], "head": []}
            wall: dict[str, list[float]] = {"base": [], "head": []}
            for name in versions:  # warm-up: bytecode caches written, page cache filled
                out = work / f"out-{name}"
                shutil.rmtree(out, ignore_errors=True)
                run_once(case_argv(case, args.data, out), versions[name], run_dir)
            for r in range(args.rounds):
                order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
                for name in order:
                    out = work / f"out-{name}"
                    shutil.rmtree(out, ignore_errors=True)
                    c, w = run_once(case_argv(case, args.data, out), versions[name], run_dir)
                    cpu[name].append(c)
                    wall[name].append(w)
            ratios = [h / b for h, b in zip(cpu["head"], cpu["base"])]
            print(
                f"{case:15s} cpu head/base median {statistics.median(ratios):.2f} "
                f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}); "
                f"median cpu s base {statistics.median(cpu['base']):.2f} "
                f"head {statistics.median(cpu['head']):.2f}; "
                f"wall s base {statistics.median(wall['base']):.2f} "
                f"head {statistics.median(wall['head']):.2f}"
            )
    finally:
        tree = work / "base" / "tree"
        if tree.exists():
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                capture_output=True,
            )
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
