"""The no-op `prepare` (issues 25 and 29): a rerun where everything is fresh answers from the
validation stamp (no parquet/dataframe import, same result as the step-by-step path), is
invalidated by any change of a file or an option, and draws no progress bar on a terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from episodekit.core.paths import STAMP_FILE
from episodekit.prepare import format_result, prepare

EPISODEKIT = str(Path(sys.executable).parent / "episodekit")
KW = {"world_sizes": (2, 4), "num_workers": 2, "jobs": 1}


def _plain(result) -> dict:
    d = result.to_dict()
    d["seconds"] = 0
    for s in d["steps"]:
        s["seconds"] = 0
        s["detail"].pop("seconds", None)
        s["detail"].pop("mb_per_s", None)
    return d


def _no_stamp_path(monkeypatch) -> None:
    import episodekit.prepare_noop as noop

    real = noop.eligible
    monkeypatch.setattr(
        noop, "eligible", lambda r, o, recording=False: recording and real(r, o, True)
    )


def test_stamp_rerun_equals_the_step_by_step_rerun(make_sample, monkeypatch):
    root = make_sample(episodes=40, style="recorded", data_files_size_in_mb=1)
    assert prepare(str(root), target_mb=1, canonical_bins=None, **KW).ok
    fast = prepare(str(root), target_mb=1, canonical_bins=None, **KW)
    assert "rerun" in json.loads((root / STAMP_FILE).read_text())
    _no_stamp_path(monkeypatch)
    slow = prepare(str(root), target_mb=1, canonical_bins=None, **KW)
    assert {s.status for s in slow.steps} == {"skipped"}
    assert _plain(fast) == _plain(slow)
    strip = lambda r: [line.split()[:2] for line in format_result(r).splitlines()[2:9]]  # noqa: E731
    assert strip(fast) == strip(slow)
    assert format_result(fast).splitlines()[9:-1] == format_result(slow).splitlines()[9:-1]


def test_any_change_of_a_file_or_an_option_takes_the_step_path(make_sample):
    root = make_sample(episodes=40)
    assert prepare(str(root), **KW).ok
    speed = root / "meta/speed_percentiles.jsonl"
    speed.write_text(speed.read_text() + "\n")  # an artifact touched by hand: size changes
    again = prepare(str(root), **KW)
    assert again.step("validate").status == "done"  # validated again, not answered from stamp
    speed.unlink()
    again = prepare(str(root), **KW)
    assert again.step("speed").status == "done" and again.step("validate").status == "done"
    other = prepare(str(root), **{**KW, "world_sizes": (2,)})  # another option: validated again?
    assert {s.status for s in other.steps} == {"skipped"}  # (the stamp is fresh) but no record
    assert [p["world_size"] for p in other.step("plans").detail["plans"]] == [2]
    assert prepare(str(root), **{**KW, "world_sizes": (2, 4)}).step("plans").detail["plans"]


def test_noop_rerun_imports_no_parquet_or_dataframe_library(make_sample):
    root = make_sample(episodes=30)
    assert prepare(str(root)).ok
    code = (
        "import sys; from episodekit.cli import main\n"
        f"try: main(['prepare', {str(root)!r}, '-q'])\n"
        "except SystemExit as e: assert e.code in (0, None), e.code\n"
        "heavy = ('pyarrow', 'polars', 'duckdb', 'numpy', 'fsspec')\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == "[]"


def test_a_rerun_with_other_options_records_them_for_the_next(make_sample, monkeypatch):
    """`prepare ROOT --frames` (what the demo runs) records no stamp-only rerun for a plain
    `prepare ROOT`; the first plain rerun (all steps skipped) leaves that record, the second
    answers from the stamp."""
    monkeypatch.setenv("EPISODEKIT_CACHE", str(make_sample(episodes=2).parent / "cache"))
    root = make_sample(episodes=30)
    assert prepare(str(root), frames=True).ok
    stamp = root / STAMP_FILE
    first = prepare(str(root))  # the step path: everything fresh, validation skipped
    assert {s.status for s in first.steps} == {"skipped"}
    import episodekit.prepare_noop as noop

    rec = json.loads(stamp.read_text()).get("rerun")
    assert rec and rec["options"]["stats"] == "keep"  # this run's options, not --frames'

    calls = []
    real = noop.noop_result
    monkeypatch.setattr(noop, "noop_result", lambda *a: calls.append(1) or real(*a))
    second = prepare(str(root))
    assert calls and {s.status for s in second.steps} == {"skipped"}
    assert _plain(second)["steps"] == _plain(first)["steps"]


@pytest.mark.parametrize("record", [True, False])
def test_noop_prepare_on_a_terminal_draws_no_bar(make_sample, record, on_tty):
    """Progress only for work that runs: the stamp path and the step path alike."""
    root = make_sample(episodes=30, style="edited", data_files_size_in_mb=1)
    args = ["prepare", str(root), "--world-size", "2", "--workers", "2", "-j", "1"]
    assert subprocess.run([EPISODEKIT, *args], capture_output=True, timeout=300).returncode == 0
    if not record:  # the step-by-step path: every step reads its own headers
        stamp = json.loads((root / STAMP_FILE).read_text())
        del stamp["rerun"]
        (root / STAMP_FILE).write_text(json.dumps(stamp))
    text = on_tty(*args)
    assert "rowgroups: skipped" in text
    assert "%|" not in text and "MiB/s" not in text and "files/s" not in text, text


def test_out_copy_settles_videos_included(make_sample, tmp_path):
    """`prepare ROOT --out DIR` redid costs and validate on every rerun ("9 files changed") and,
    with --videos, copied every mp4 again: the second run is all skipped, nothing changed, the
    mp4s untouched; a source file that changes is picked up by the next run, then it settles."""
    import os

    root = make_sample(episodes=6, tasks=2, seed=3, videos=1)
    (root / "meta/stats.json").unlink()  # computed in DIR: a rerun must keep it
    out = tmp_path / "out"
    cmd = [EPISODEKIT, "prepare", root, "--out", out, "--videos", "-j", "1", "--json"]
    cmd += ["--world-size", "1,2", "--workers", "2"]

    def run() -> dict:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    first = run()
    assert "meta/stats.json" in first["changed"]
    mp4s = sorted(out.glob("videos/**/*.mp4"))
    assert mp4s and all(s["status"] in ("done", "skipped") for s in first["steps"])

    def files() -> dict:  # every file of DIR but the writer's lock (staging never carries it)
        found = (p for p in out.rglob("*") if p.is_file() and p.name != ".episodekit.lock")
        return {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in found}

    state = files()
    second = run()
    assert second["changed"] == [], second["changed"]
    assert [s["status"] for s in second["steps"]] == ["skipped"] * len(second["steps"])
    assert files() == state  # the very same files (the staged rerun carried them over)
    data = sorted(root.glob("data/*/*.parquet"))[0]
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 10**9))
    third = run()  # the source's data file changed (its key): written again, the rest kept
    assert str(data.relative_to(root)) in third["changed"], third["changed"]
    assert not any(c.endswith(".mp4") for c in third["changed"])
    assert run()["changed"] == []
