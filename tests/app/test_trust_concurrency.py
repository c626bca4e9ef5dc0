"""Concurrent writers and crashes, as a user meets them (subprocesses).

- A second writer on the same root waits (and says so), or exits 2 with ``--no-wait``; a live
  writer's temporaries are never removed by the second one.
- ``kill -9`` just before each ``os.replace`` prepare does (data file, speed, costs, plan, stamp;
  the test-only hook in core/atomic.py) leaves a temporary, and the next run removes it and
  completes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from episodekit.core.atomic import KILL_HOOK_ENV, is_temp_name

CLI = "import sys; from episodekit.cli import main; sys.argv[0] = 'episodekit'; main()"
PREP = ["--world-size", "2", "--workers", "2", "--target-mb", "0.05"]
HOLD = r"""
import sys, time
from episodekit.core.lock import writer_lock
with writer_lock(sys.argv[1]):
    print("HELD", flush=True)
    time.sleep(600)
"""


def cli(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        **kw,
    )


def temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if is_temp_name(p.name)]


def test_second_writer_waits_or_exits_2(make_sample):
    root = make_sample(episodes=16, tasks=2, seed=5)
    planted = root / "meta" / f".speed_percentiles.jsonl{'.tmp-'}{uuid.uuid4().hex}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(root)], stdout=subprocess.PIPE, text=True
    )
    waiting = None
    try:
        assert holder.stdout.readline().strip() == "HELD"
        planted.write_text("a live writer's temporary")
        for cmd in (
            ["prepare", root, *PREP, "--no-wait"],
            ["prep", "rowgroups", root, "--no-wait", "--quiet"],
            ["metadata", "speed", root, "--no-wait"],
            ["metadata", "costs", root, "--no-wait"],
            ["metadata", "plan", root, "--world-size", "2", "--no-wait"],
        ):
            proc = cli(*cmd)
            assert proc.returncode == 2, (cmd, proc.stderr)
            assert "Traceback" not in proc.stderr
            assert "another episodekit process is writing here" in proc.stderr
        assert planted.exists()  # not removed while the other writer lives
        assert not (root / "meta/speed_percentiles.jsonl").exists()
        waiting = subprocess.Popen(
            [sys.executable, "-c", CLI, "prepare", str(root), *PREP],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = ""
        while "waiting for another episodekit process" not in line:
            line = waiting.stderr.readline()
            assert line, "the second writer ended without waiting"
        time.sleep(0.5)
        assert waiting.poll() is None and planted.exists()
    finally:
        holder.kill()
        holder.wait()
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err
    assert "validation PASSED" in out
    assert temporaries(root) == []


def test_kill_before_each_replace_then_rerun_cleans_up(make_sample):
    root = make_sample(episodes=16, tasks=2, seed=6)
    assert cli("prepare", root, *PREP).returncode == 0
    for target in (
        "data/chunk-000/file-000.parquet",
        "meta/speed_percentiles.jsonl",
        "meta/episode_costs.parquet",
        "meta/shard_plans/ws2_nw2",
        "meta/episodekit_validation.json",
    ):
        env = dict(os.environ, **{KILL_HOOK_ENV: target})
        killed = cli("prepare", root, *PREP, "--force", env=env)
        assert killed.returncode == -9, (target, killed.stderr)
        left = temporaries(root)
        assert len(left) == 1 and left[0].name.startswith("." + Path(target).name[:8]), left
        rerun = cli("prepare", root, *PREP)
        assert rerun.returncode == 0, (target, rerun.stderr)
        assert temporaries(root) == [], target
