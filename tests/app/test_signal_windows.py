"""Ctrl-C in the moment after a command made its staging folder and before the code that
discards it on the way out has taken it over (core/staging.py's "staging: made" point): the
command exits 130 and nothing of it is left next to its output. Timing-based runs
(tests/app/test_signals.py) hit this window only now and then; here each writer is stopped
exactly there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from episodekit.core.crashpoint import CRASH_ENV, LOG_ENV
from episodekit.core.store import CACHE_ENV
from tests.app.hostile import LEROBOT, cli, ok

MADE = "staging: made"
ALOHA = Path(__file__).resolve().parents[1] / "fixtures" / "import" / "aloha_raw"

# name: the command's arguments ({src}: a LeRobot-written dataset, {out}: the output folder)
WRITERS = {
    "prepare --out": ["prepare", "{src}", "--out", "{out}", "--world-size", "2"],
    "prepare --frames": ["prepare", "{src}", "--out", "{out}", "--frames", "--world-size", "2"],
    "prep rowgroups --out": ["prep", "rowgroups", "{src}", "--out", "{out}"],
    "edit --out": ["edit", "{src}", "--out", "{out}", "--drop-episodes", "0"],
    "sample": ["sample", "{out}", "--episodes", "3"],
    "import": ["import", str(ALOHA), "--out", "{out}", "--video", "h264"],
}


def _args(name: str, out: Path) -> list[str]:
    src = LEROBOT / "rec40"
    return [a.format(src=src, out=out) for a in WRITERS[name]]


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_sigint_just_after_the_staging_folder_is_made(name, tmp_path):
    env = {CACHE_ENV: str(tmp_path / "cache")}
    log = tmp_path / "points.log"
    ok(cli(*_args(name, tmp_path / "ref" / "out"), env={**env, LOG_ENV: str(log)}))
    steps = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    made = [n for n, step in enumerate(steps, 1) if step == MADE]
    assert made, steps  # the command stages its output
    for n in made:
        work = tmp_path / f"at-{n}"
        work.mkdir()
        cache = work / "cache"
        run = cli(*_args(name, work / "out"), env={CACHE_ENV: str(cache), CRASH_ENV: f"INT:{n}"})
        where = f"{name}: SIGINT at point {n}: exit {run.returncode}\n{run.stderr}"
        assert run.returncode == 130 and "Traceback" not in run.stderr, where
        left = sorted(os.listdir(work))
        assert left in ([], ["cache"], ["out"], ["cache", "out"]), where + str(left)
        for folder in (work, cache, work / "out"):
            if folder.is_dir():
                stray = [
                    e for e in os.listdir(folder) if ".episodekit-" in e and e != ".episodekit.lock"
                ]
                assert not stray, f"{where}: left {stray} in {folder}"
