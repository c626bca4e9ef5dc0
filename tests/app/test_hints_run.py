"""Every message that tells the user to run an ``episodekit ...`` command names one that works,
and fixes what it names: each hint is produced in the situation that prints it, run as a
subprocess there (exit 0), and then the situation is checked again: the finding, error or
warning is gone (a hint that loops, like `metadata stats ROOT` for image stats that only
`--images` computes, fails here).

``HINTS`` maps each hint in the package's source (file, a piece of its text) to a situation that
returns ``(message, root, gone)``: the message, the root that ``ROOT`` in it stands for (or
None), and ``gone(proc)``, which asserts that what the message reported is gone once the hint ran
(``proc``: the hint's completed process). ``test_every_hint_in_the_source_is_covered`` scans the
source's string literals for ``episodekit <command>`` so a new hint without a situation fails.
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
PACKAGES = ("app", "core", "prep", "metadata", "loaders", "validate", "writers", "sample")
COMMAND = re.compile(
    r"episodekit ((?:info|sample|validate|prepare|prep|metadata|repair)\b[^`'();]*)"
)
# String literals that name a command without telling the user to run it.
NOT_HINTS = {
    ("core/hub.py", "episodekit prepare"),  # the hub commit message
    ("prep/videos.py", "episodekit prep videos"),  # the tag written into re-encoded files
    ("sample/writer.py", "episodekit sample"),  # what wrote the folder, in its marker file
    ("writers/repair.py", "episodekit repair"),  # what wrote --out, in its marker and recipe
    ("validate/baseline.py", "episodekit validate baseline"),  # the kind of a baseline file
    ("validate/junit.py", "episodekit validate"),  # the JUnit test suite's name
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


def findings(root: Path, check: str) -> list[str]:
    proc = cli("validate", root, "--json")
    doc = json.loads(proc.stdout)
    return [f["message"] for f in doc["findings"] if f["check"] == check]


def finding(root: Path, check: str, has: str = "") -> str:
    messages = [m for m in findings(root, check) if has in m]
    assert messages, (check, has, findings(root, check))
    return messages[0]


def finding_gone(root: Path, check: str, message: str | None = None) -> Callable:
    """``gone``: validate reports no ``check`` finding any more (``message``: not that one)."""

    def gone(proc) -> None:
        left = findings(root, check)
        assert (message not in left) if message else not left, left

    return gone


def raised(fn: Callable, *args, **kwargs) -> str:
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return str(info.value)


def works(fn: Callable, *args, **kwargs) -> Callable:
    """``gone``: ``fn(*args, **kwargs)`` no longer raises."""
    return lambda proc: fn(*args, **kwargs)


def no_warning(piece: str, fn: Callable, *args, **kwargs) -> Callable:
    """``gone``: ``fn(*args, **kwargs)`` warns nothing containing ``piece`` (the per-process
    warn-once memory cleared first, so a second call could warn again)."""

    def gone(proc) -> None:
        from episodekit.loaders import store

        store._warned.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn(*args, **kwargs)
        assert not [str(w.message) for w in caught if piece in str(w.message)]

    return gone


# -- situations: each returns (message, root the hint runs on or None, gone) ---------------------


def validate_layout(tmp: Path):
    root = sample(tmp / "r")
    return finding(root, "layout.row_groups"), None, finding_gone(root, "layout.row_groups")


def validate_stats_missing(tmp: Path):
    root = sample(tmp / "r")
    (root / "meta/stats.json").unlink()
    return finding(root, "stats.present"), None, finding_gone(root, "stats.present")


def _converted_with_images(tmp: Path) -> Path:
    """A v2.1 root with an image feature, converted (its stats: v2.1's, without quantiles)."""
    src = write_sample(tmp / "v21", episodes=6, tasks=2, seed=4, images=True, version="v2.1")
    assert cli("convert", src, "--out", tmp / "r").returncode == 0
    return tmp / "r"


def validate_quantiles_missing(tmp: Path):
    root = _converted_with_images(tmp)
    msg = finding(root, "stats.present", "compute it with")
    return msg, None, finding_gone(root, "stats.present", msg)


def validate_image_quantiles_missing(tmp: Path):
    """The loop of issue 39: after `metadata stats ROOT` the image features still had no
    quantiles and the same hint repeated; only `--images` computes them."""
    root = _converted_with_images(tmp)
    assert cli("metadata", "stats", root).returncode == 0
    msg = finding(root, "stats.present", "--images")
    return msg, None, finding_gone(root, "stats.present")


def validate_stats_stale(tmp: Path):
    root = sample(tmp / "r")
    assert cli("metadata", "stats", root).returncode == 0
    assert cli("prep", "rowgroups", root, "--target-mb", "0.05").returncode == 0
    return finding(root, "stats.fresh"), None, finding_gone(root, "stats.fresh")


def validate_quantile_rank(tmp: Path):
    """LeRobot's own quantiles (a mean of the episodes') are far from the data in rank."""
    root = tmp / "r"
    shutil.copytree(REPO / "tests/fixtures/lerobot/rec40", root)

    def deep() -> list[str]:
        proc = cli("validate", root, "--deep", "--checks", "stats", "--json")
        doc = json.loads(proc.stdout)
        return [f["message"] for f in doc["findings"] if f["check"] == "stats.quantile_rank"]

    def gone(proc) -> None:
        assert not deep()

    return deep()[0], None, gone


def validate_speed_stale(tmp: Path):
    root = sample(tmp / "r")
    assert cli("metadata", "speed", root).returncode == 0
    f = root / "meta/speed_percentiles.jsonl"
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    f.write_text("".join(json.dumps({**r, "fingerprint": "0" * 32}) + "\n" for r in rows))
    return finding(root, "speed.fresh"), None, finding_gone(root, "speed.fresh")


def plan_missing_small(tmp: Path):
    from episodekit.loaders import load_plan

    root = sample(tmp / "r")  # 20 episodes for 8 x 4 bins: the plan cuts episodes (auto)
    return raised(load_plan, root, 8, 4), None, works(load_plan, root, 8, 4)


def plan_stale(tmp: Path):
    from episodekit.loaders import load_plan

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--world-size", "2", "--workers", "2").returncode == 0
    plans = (root / "meta/shard_plans").rename(tmp / "plans")
    sample(root, seed=5)
    plans.rename(root / "meta/shard_plans")
    return raised(load_plan, root, 2, 2), None, works(load_plan, root, 2, 2)


def canonical_missing(tmp: Path):
    from episodekit.metadata.plans.canonical import load_canonical_plan

    root = sample(tmp / "r")
    return raised(load_canonical_plan, root), None, works(load_canonical_plan, root)


def canonical_stale(tmp: Path):
    from episodekit.metadata.plans.canonical import load_canonical_plan

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--canonical-bins", "auto").returncode == 0
    plans = (root / "meta/shard_plans").rename(tmp / "plans")
    sample(root, seed=5)
    plans.rename(root / "meta/shard_plans")
    return raised(load_canonical_plan, root), None, works(load_canonical_plan, root)


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
    return raised(load_plan, out, 2, 1), None, works(load_plan, out, 2, 1)


def mixture_plan_stale(tmp: Path):
    from episodekit.loaders import load_plan

    a, _, out = _mixture(tmp)
    sample(a, seed=9)
    return raised(load_plan, out, 1, 4), None, works(load_plan, out, 1, 4)


def mixture_stats_missing(tmp: Path):
    from episodekit.metadata.mixture.stats import load_mixture_stats

    _, _, out = _mixture(tmp)
    return raised(load_mixture_stats, out), None, works(load_mixture_stats, out)


def mixture_folder_as_root(tmp: Path):
    """`validate DIR` on a mixture plan folder: the hint lists the sources to validate."""
    a, _, out = _mixture(tmp)
    proc = cli("validate", out)
    assert proc.returncode == 2

    def gone(hint) -> None:
        assert str(a) in hint.stdout  # the sources it names validate
        assert cli("validate", a).returncode == 0

    return proc.stderr, None, gone


def prepare_option_for_root(tmp: Path):
    """An option of `prepare ROOT` given with --mixture: the hint prepares a source as ROOT,
    where the option works."""
    from episodekit.metadata.plans.canonical import load_canonical_plan

    a, m, out = _mixture(tmp)
    proc = cli("prepare", "--mixture", m, "--out", out, "--canonical-bins", "auto")
    assert proc.returncode == 2

    def gone(hint) -> None:
        assert cli("prepare", a, "--canonical-bins", "auto").returncode == 0
        load_canonical_plan(a)

    return proc.stderr, a, gone


def speed_before_episodes_added(tmp: Path):
    from episodekit.core.dataset import open_dataset
    from episodekit.metadata.speed import load_or_compute

    root = sample(tmp / "r", episodes=12, tasks=1)
    assert cli("metadata", "speed", root).returncode == 0
    kept = (root / "meta/speed_percentiles.jsonl").read_bytes()
    sample(root, episodes=30, tasks=1)
    (root / "meta/speed_percentiles.jsonl").write_bytes(kept)

    def logged() -> list[str]:
        logger = logging.getLogger("episodekit.metadata.speed")
        records: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
        logger.addHandler(handler)
        try:
            load_or_compute(open_dataset(str(root)))
        finally:
            logger.removeHandler(handler)
        return [r for r in records if "episodekit metadata speed" in r]

    (message,) = logged()

    def gone(proc) -> None:
        assert logged() == []

    return message, None, gone


def stale_store(tmp: Path):
    from episodekit.core.dataset import open_dataset
    from episodekit.loaders.store import find_store

    root = sample(tmp / "r")
    store = tmp / "store"
    assert cli("prep", "frames", root, "--store", store).returncode == 0
    sample(root, seed=7)
    message = raised(find_store, open_dataset(str(root)), str(store))
    return message, None, lambda proc: find_store(open_dataset(str(root)), str(store))


def frames_cache_warning(tmp: Path):
    from episodekit.loaders.frames import FrameDataset

    root = sample(tmp / "r")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FrameDataset(root, cache_mb=0.001)  # no store in the (test's) cache
    (message,) = [str(w.message) for w in caught if "prep frames" in str(w.message)]
    return message, None, no_warning("prep frames", FrameDataset, root, cache_mb=0.001)


def elastic_needs_canonical(tmp: Path):
    from episodekit.loaders import load_plan
    from episodekit.loaders.elastic import ElasticLoader

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--world-size", "1", "--workers", "1").returncode == 0
    message = raised(ElasticLoader, root, plan=load_plan(root, 1, 1), rank=0, world_size=1)
    return message, None, works(ElasticLoader, root, rank=0, world_size=1)


def elastic_cache_warning(tmp: Path):
    from episodekit.loaders.elastic import ElasticLoader

    root = sample(tmp / "r")
    assert cli("metadata", "plan", root, "--canonical-bins", "auto").returncode == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ElasticLoader(root, rank=0, world_size=1, cache_mb=0.001, store=None)
    (message,) = [str(w.message) for w in caught if "prep frames" in str(w.message)]
    gone = no_warning("prep frames", ElasticLoader, root, rank=0, world_size=1, cache_mb=0.001)
    return message, None, gone


def flags_report_missing_check(tmp: Path):
    """A report that did not run the checks: the hint writes one that did (its stdout, saved as
    the user would), which then gives the flagged episodes."""
    from episodekit.validate.flagged import flagged_episodes

    root = sample(tmp / "r")
    report = tmp / "report.json"
    report.write_text(json.dumps({"findings": [], "checks_run": ["data.rows"]}))
    message = raised(flagged_episodes, str(root), "quality.frozen", report)

    def gone(proc) -> None:
        report.write_text(proc.stdout)
        flagged_episodes(str(root), "quality.frozen", report)

    return message, root, gone


def flags_report_of_other_episodes(tmp: Path):
    """A report of another dataset's episodes: the hint writes one of ROOT's (saved as the user
    would), which then gives the flagged episodes."""
    from episodekit.validate.flagged import flagged_episodes

    root = sample(tmp / "r")
    other = sample(tmp / "o", seed=5)
    report = tmp / "report.json"
    report.write_text(cli("validate", other, "--json", "--checks", "quality.frozen").stdout)
    message = raised(flagged_episodes, str(root), "quality.frozen", report)

    def gone(proc) -> None:
        report.write_text(proc.stdout)
        flagged_episodes(str(root), "quality.frozen", report)

    return message, root, gone


def convert_v3_root(tmp: Path):
    """`convert` on a v3.0 root: nothing to convert; the hint prepares it (its row groups fixed)."""
    from episodekit.writers.convert import convert

    root = sample(tmp / "r")
    assert findings(root, "layout.row_groups")
    return raised(convert, str(root), tmp / "out"), None, finding_gone(root, "layout.row_groups")


LEROBOT = REPO / "tests" / "fixtures" / "lerobot"


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def validate_crashed_recording(tmp: Path):
    """A recording LeRobot 0.6.1 wrote and that was killed: validate suggests a repair dry
    run, which says what it would recover (and writes nothing)."""
    root = tmp / "crash_vid5"
    shutil.copytree(LEROBOT / "crash_vid5", root)
    before = tree(root)

    def gone(proc) -> None:
        assert "kept 5 episodes" in proc.stdout and "dry run: nothing written" in proc.stdout
        assert tree(root) == before

    return finding(root, "episodes.read"), None, gone


def repair_in_place_undo(tmp: Path):
    """An in-place repair names its backup and how to undo it; the undo puts ROOT back."""
    root = tmp / "crash_rec7"
    shutil.copytree(LEROBOT / "crash_rec7", root)
    before = tree(root)
    proc = cli("repair", root, "--in-place")
    assert proc.returncode == 0, proc.stderr
    assert tree(root) != before

    def gone(proc) -> None:
        assert tree(root) == before
        assert [p.name for p in tmp.iterdir()] == ["crash_rec7"]  # the backup is gone too

    return proc.stdout, None, gone


def copy_without_videos(tmp: Path):
    """A copy `prepare --out` made without --videos (LeRobot's vid24): validate warns that its
    videos are not there, naming the rerun with --videos, after which they are."""
    src = tmp / "vid24"
    shutil.copytree(LEROBOT / "vid24", src)
    out = tmp / "out"
    assert cli("prepare", src, "--out", out, "--quiet").returncode == 0
    return finding(out, "info.videos", "--videos"), None, finding_gone(out, "info.videos")


# (file, a piece of the hint's literal text) -> the situation that prints it.
HINTS: dict[tuple[str, str], Callable] = {
    ("validate/raw.py", "episodekit repair"): validate_crashed_recording,
    ("validate/meta.py", "made without --videos"): copy_without_videos,
    ("writers/repair_backup.py", "undo: episodekit repair"): repair_in_place_undo,
    ("writers/convert.py", "prepare it with `episodekit prepare"): convert_v3_root,
    ("validate/flagged.py", "episodekit validate ROOT --json --checks"): flags_report_missing_check,
    ("validate/flagged.py", "for a report"): flags_report_of_other_episodes,
    ("validate/layout.py", "episodekit prep rowgroups"): validate_layout,
    ("validate/stats.py", "missing; compute it with `episodekit metadata stats"): (
        validate_stats_missing
    ),
    ("validate/stats_rules.py", "compute it with `episodekit metadata stats"): (
        validate_quantiles_missing
    ),
    ("validate/stats_rules.py", "compute them with `episodekit metadata stats"): (
        validate_image_quantiles_missing
    ),
    ("validate/stats_quantiles.py", "`episodekit metadata stats"): validate_quantile_rank,
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
def test_hint_runs_and_fixes_what_it_names(key, tmp_path, monkeypatch):
    monkeypatch.setenv("EPISODEKIT_CACHE", str(tmp_path / "cache"))  # frame stores stay here
    message, root, gone = HINTS[key](tmp_path)
    proc = run_hint(message, root)
    assert proc.returncode == 0, f"{message}\n-> {proc.args}\n{proc.stderr}"
    gone(proc)


def test_option_hints_run(tmp_path):
    """Hints that name an option: the failing command, with the option added as the hint says,
    works. 20 episodes for 8 x 4 bins with `--split-long no`: `metadata plan` fails (exit 2,
    nothing written) and `prepare` skips the size, both saying "use --split-long auto"; with it,
    the plan is written (auto is also the default of both)."""
    root = sample(tmp_path / "r")
    for cmd in (["metadata", "plan"], ["prepare"]):
        args = [*cmd, root, "--world-size", "8", "--workers", "4"]
        proc = cli(*args, "--split-long", "no")
        assert "use --split-long auto" in proc.stderr, proc.stderr
        assert proc.returncode == (2 if cmd[0] == "metadata" else 1), proc.stderr
        assert not (root / "meta/shard_plans/ws8_nw4.json").exists()
        proc = cli(*args, "--split-long", "auto")
        assert proc.returncode == 0, proc.stderr
        assert (root / "meta/shard_plans/ws8_nw4.json").is_file()
        (root / "meta/shard_plans/ws8_nw4.json").unlink()
