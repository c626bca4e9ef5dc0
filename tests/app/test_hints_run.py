"""Every message that tells the user to run an ``episodekit ...`` command names one that works:
each hint is produced in the situation that prints it, then run as a subprocess there (exit 0).

``HINTS`` maps each hint in the package's source (file, a piece of its text) to a situation that
returns the message; ``test_every_hint_in_the_source_is_covered`` scans the source's string
literals for ``episodekit <command>`` so a new hint without a situation fails here.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from episodekit.sample import write_sample

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("app", "core", "prep", "metadata", "loaders", "validate")
COMMAND = re.compile(
    r"episodekit ((?:info|sample|validate|prepare|prep|metadata|repair)\b[^`'();]*)"
)
# String literals that name a command without telling the user to run it.
NOT_HINTS = {
    ("core/hub.py", "episodekit prepare"),  # the hub commit message
    ("prep/videos.py", "episodekit prep videos"),  # the tag written into re-encoded files
    ("app/sample.py", "episodekit sample"),  # what wrote the folder, in its marker file
}


def cli(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def run_hint(message: str, root: Path | None = None) -> subprocess.CompletedProcess:
    """Run the command a message suggests (ROOT, a placeholder, becomes ``root``)."""
    found = COMMAND.search(message)
    assert found, f"no episodekit command in {message!r}"
    text = found.group(1).strip().rstrip(".")
    if root is not None:
        text = re.sub(r"\bROOT\b", str(root), text)
    return cli(*shlex.split(text))


def sample(path: Path, **spec) -> Path:
    return write_sample(path, **{"episodes": 20, "tasks": 2, "seed": 4, **spec})


def finding(root: Path, check: str) -> str:
    proc = cli("validate", root, "--json")
    doc = json.loads(proc.stdout)
    messages = [f["message"] for f in doc["findings"] if f["check"] == check]
    assert messages, (check, doc["findings"])
    return messages[0]


def raised(fn: Callable, *args, **kwargs) -> str:
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return str(info.value)


# -- situations: each returns (message, root the hint runs on or None) ---------------------------


def validate_layout(tmp: Path):
    root = sample(tmp / "r")
    return finding(root, "layout.row_groups"), None


def validate_stats_missing(tmp: Path):
    root = sample(tmp / "r")
    (root / "meta/stats.json").unlink()
    return finding(root, "stats.present"), None


def validate_stats_stale(tmp: Path):
    root = sample(tmp / "r")
    assert cli("metadata", "stats", root).returncode == 0
    assert cli("prep", "rowgroups", root, "--target-mb", "0.05").returncode == 0
    return finding(root, "stats.fresh"), None


def validate_speed_stale(tmp: Path):
    root = sample(tmp / "r")
    assert cli("metadata", "speed", root).returncode == 0
    f = root / "meta/speed_percentiles.jsonl"
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    f.write_text("".join(json.dumps({**r, "fingerprint": "0" * 32}) + "\n" for r in rows))
    return finding(root, "speed.fresh"), None


def plan_missing_small(tmp: Path):
    from episodekit.loaders import load_plan

    root = sample(tmp / "r")  # 20 episodes: too few for 8 x 4 bins without --split-long
    return raised(load_plan, root, 8, 4), None


def plan_stale(tmp: Path):
    from episodekit.loaders import load_plan

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--world-size", "2", "--workers", "2").returncode == 0
    plans = (root / "meta/shard_plans").rename(tmp / "plans")
    sample(root, seed=5)
    plans.rename(root / "meta/shard_plans")
    return raised(load_plan, root, 2, 2), None


def canonical_missing(tmp: Path):
    from episodekit.metadata.plans.canonical import load_canonical_plan

    return raised(load_canonical_plan, sample(tmp / "r")), None


def canonical_stale(tmp: Path):
    from episodekit.metadata.plans.canonical import load_canonical_plan

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--canonical-bins", "auto").returncode == 0
    plans = (root / "meta/shard_plans").rename(tmp / "plans")
    sample(root, seed=5)
    plans.rename(root / "meta/shard_plans")
    return raised(load_canonical_plan, root), None


def _mixture(tmp: Path) -> tuple[Path, Path, Path]:
    a, b = sample(tmp / "a"), sample(tmp / "b", seed=6)
    m = tmp / "m.json"
    m.write_text(
        json.dumps({"sources": [{"root": str(a), "weight": 1}, {"root": str(b), "weight": 1}]})
    )
    out = tmp / "mix"
    proc = cli("metadata", "plan", "--mixture", m, "--out", out, "--world-size", "1")
    assert proc.returncode == 0, proc.stderr
    return a, m, out


def mixture_plan_missing(tmp: Path):
    from episodekit.loaders import load_plan

    _, _, out = _mixture(tmp)
    return raised(load_plan, out, 2, 1), None


def mixture_plan_stale(tmp: Path):
    from episodekit.loaders import load_plan

    a, _, out = _mixture(tmp)
    sample(a, seed=9)
    return raised(load_plan, out, 1, 1), None


def mixture_stats_missing(tmp: Path):
    from episodekit.metadata.mixture.stats import load_mixture_stats

    _, _, out = _mixture(tmp)
    return raised(load_mixture_stats, out), None


def mixture_folder_as_root(tmp: Path):
    _, _, out = _mixture(tmp)
    proc = cli("validate", out)
    assert proc.returncode == 2
    return proc.stderr, None


def prepare_option_for_root(tmp: Path):
    a, m, out = _mixture(tmp)
    proc = cli("prepare", "--mixture", m, "--out", out, "--canonical-bins", "auto")
    assert proc.returncode == 2
    return proc.stderr, a


def speed_before_episodes_added(tmp: Path, caplog=None):
    from episodekit.core.dataset import open_dataset
    from episodekit.metadata.speed import load_or_compute

    root = sample(tmp / "r", episodes=12, tasks=1)
    assert cli("metadata", "speed", root).returncode == 0
    kept = (root / "meta/speed_percentiles.jsonl").read_bytes()
    sample(root, episodes=30, tasks=1)
    (root / "meta/speed_percentiles.jsonl").write_bytes(kept)
    logger = logging.getLogger("episodekit.metadata.speed")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        load_or_compute(open_dataset(str(root)))
    finally:
        logger.removeHandler(handler)
    (message,) = [r for r in records if "episodekit metadata speed" in r]
    return message, None


def stale_store(tmp: Path):
    from episodekit.core.dataset import open_dataset
    from episodekit.loaders.store import find_store

    root = sample(tmp / "r")
    store = tmp / "store"
    assert cli("prep", "frames", root, "--store", store).returncode == 0
    sample(root, seed=7)
    return raised(find_store, open_dataset(str(root)), str(store)), None


def frames_cache_warning(tmp: Path):
    from episodekit.loaders.frames import FrameDataset

    root = sample(tmp / "r")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FrameDataset(root, cache_mb=0.001)  # no store in the (test's) cache
    (message,) = [str(w.message) for w in caught if "prep frames" in str(w.message)]
    return message, None


def elastic_needs_canonical(tmp: Path):
    from episodekit.loaders import load_plan
    from episodekit.loaders.elastic import ElasticLoader

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--world-size", "1", "--workers", "1").returncode == 0
    return raised(ElasticLoader, root, plan=load_plan(root, 1, 1), rank=0, world_size=1), None


def elastic_cache_warning(tmp: Path):
    from episodekit.loaders.elastic import ElasticLoader

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--canonical-bins", "auto").returncode == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ElasticLoader(root, rank=0, world_size=1, cache_mb=0.001, store=None)
    (message,) = [str(w.message) for w in caught if "prep frames" in str(w.message)]
    return message, None


# (file, a piece of the hint's literal text) -> the situation that prints it.
def flags_report_missing_check(tmp: Path):
    from episodekit.validate.flagged import flagged_episodes

    root = sample(tmp / "r")
    report = tmp / "report.json"
    report.write_text(json.dumps({"findings": [], "checks_run": ["data.rows"]}))
    return raised(flagged_episodes, str(root), "quality.frozen", report), root


def convert_v3_root(tmp: Path):
    from episodekit.writers.convert import convert

    root = sample(tmp / "r")
    return raised(convert, str(root), tmp / "out"), None


LEROBOT = REPO / "tests" / "fixtures" / "lerobot"


def validate_crashed_recording(tmp: Path):
    """A recording LeRobot 0.6.1 wrote and that was killed: validate suggests repair."""
    root = tmp / "crash_vid5"
    shutil.copytree(LEROBOT / "crash_vid5", root)
    return finding(root, "episodes.read"), None


def repair_in_place_undo(tmp: Path):
    root = tmp / "crash_rec7"
    shutil.copytree(LEROBOT / "crash_rec7", root)
    proc = cli("repair", root, "--in-place")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, None


HINTS: dict[tuple[str, str], Callable] = {
    ("validate/raw.py", "episodekit repair"): validate_crashed_recording,
    ("app/cli/repair.py", "undo: episodekit repair"): repair_in_place_undo,
    ("writers/convert.py", "prepare it with `episodekit prepare"): convert_v3_root,
    ("validate/flagged.py", "episodekit validate ROOT --json --checks"): flags_report_missing_check,
    ("validate/layout.py", "episodekit prep rowgroups"): validate_layout,
    ("validate/stats.py", "compute it with `episodekit metadata stats"): validate_stats_missing,
    ("validate/stats.py", "recompute with `episodekit metadata stats"): validate_stats_stale,
    ("validate/artifacts.py", "episodekit metadata speed"): validate_speed_stale,
    ("metadata/plans/plan_file.py", "episodekit metadata plan"): plan_missing_small,
    ("metadata/plans/plan_file.py", "stale shard plan"): plan_stale,
    ("metadata/plans/canonical.py", "create it with: episodekit metadata plan"): canonical_missing,
    ("metadata/plans/canonical.py", "recompute it with: episodekit metadata plan"): canonical_stale,
    ("metadata/mixture/plan_file.py", "episodekit metadata plan --mixture"): mixture_plan_missing,
    ("metadata/mixture/plan_file.py", "stale mixture plan"): mixture_plan_stale,
    ("metadata/mixture/stats.py", "episodekit metadata stats --mixture"): mixture_stats_missing,
    ("app/cli/common.py", "episodekit info --mixture"): mixture_folder_as_root,
    ("app/cli/prepare.py", "episodekit prepare ROOT"): prepare_option_for_root,
    ("metadata/speed.py", "episodekit metadata speed"): speed_before_episodes_added,
    ("loaders/store.py", "episodekit prep frames"): stale_store,
    ("loaders/frames.py", "frames_command"): frames_cache_warning,
    ("loaders/elastic.py", "episodekit metadata plan"): elastic_needs_canonical,
    ("loaders/elastic.py", "episodekit prep frames"): elastic_cache_warning,
}


def source_hints() -> set[tuple[str, str]]:
    """(file, literal text) of every string literal (not a docstring) naming a command."""
    found = set()
    for pkg in PACKAGES:
        for f in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(f.read_text())
            docs = {
                id(n.body[0].value)
                for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
                and n.body
                and isinstance(n.body[0], ast.Expr)
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if id(node) not in docs and COMMAND.search(node.value):
                        found.add((str(f.relative_to(REPO)), node.value))
    return found


def test_every_hint_in_the_source_is_covered():
    uncovered = []
    for path, text in source_hints():
        if (path, text.strip()) in NOT_HINTS:
            continue
        if not any(p == path and piece in text for p, piece in HINTS):
            uncovered.append((path, text))
    assert not uncovered, f"hints without a situation in HINTS: {uncovered}"


@pytest.mark.parametrize("key", sorted(HINTS), ids=lambda k: f"{k[0]}:{k[1][:30]}")
def test_hint_runs(key, tmp_path, monkeypatch):
    monkeypatch.setenv("EPISODEKIT_CACHE", str(tmp_path / "cache"))  # frame stores stay here
    message, root = HINTS[key](tmp_path)
    proc = run_hint(message, root)
    assert proc.returncode == 0, f"{message}\n-> {proc.args}\n{proc.stderr}"


def test_option_hints_run(tmp_path):
    """Hints that name an option: the failing command, with the option added as the hint says,
    works. `metadata plan` on 20 episodes for 8 x 4 bins: "use --split-long" (a flag there);
    `prepare`'s warning: "use --split-long auto" (prepare's option takes a value)."""
    root = sample(tmp_path / "r")
    plan = ["metadata", "plan", root, "--world-size", "8", "--workers", "4"]
    proc = cli(*plan)
    assert proc.returncode == 2 and "use --split-long" in proc.stderr, proc.stderr
    assert cli(*plan, "--split-long").returncode == 0
    prep = ["prepare", root, "--world-size", "8", "--workers", "4"]
    said = cli(*prep).stderr
    if "--split-long auto" in said:  # (the pipeline may plan 20 episodes without being told)
        proc = cli(*prep, "--split-long", "auto")
        assert proc.returncode == 0, proc.stderr
        assert (root / "meta/shard_plans/ws8_nw4.json").is_file()
