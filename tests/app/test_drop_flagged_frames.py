"""Issue 37: ``edit --drop-flagged`` at frame granularity. On a sample with a seeded frozen tail
(episode 5), a seeded 3-frame spike (episode 9) and a seeded duplicate episode, ``validate
--json`` names the frozen and spike frames in ``details.frames``; ``edit --drop-flagged`` (fresh
run or the report) drops exactly those frames, keeps both episodes, and drops the duplicate whole
(a check that judges episodes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from episodekit.core.dataset import open_dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import QUALITY_SPEC, edit_signal, episode_lengths, quality_duplicate  # noqa: E402

CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
CHECKS = "quality.frozen,quality.jump,quality.out_of_range,quality.duplicate"


def run(*args: object) -> subprocess.CompletedProcess:
    r = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    return pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)


def seed(root: Path) -> dict[int, list[list[int]]]:
    """A frozen tail on episode 5 (the last 60% of its frames hold one vector) and a 3-frame
    spike on episode 9 (frames 10..12 of action[3] at 1000): the frames each finding must name."""
    n = int(episode_lengths(root)[5])
    start = n - int(0.6 * n)
    edit_signal(root, 5, "action", lambda x: x.__setitem__(slice(start, None), x[start]))
    edit_signal(root, 9, "action", lambda x: x.__setitem__((slice(10, 13), 3), 1000.0))
    return {5: [[start, n - 1]], 9: [[10, 12]]}


def test_drop_flagged_drops_exactly_the_flagged_frames(make_sample, tmp_path):
    root = make_sample(**QUALITY_SPEC)
    want = seed(root)
    dup = quality_duplicate(root).episode
    v = run("validate", root, "--checks", CHECKS, "--json")
    report = json.loads(v.stdout)
    frames = {}
    for f in report["findings"]:
        if f["check"] in ("quality.frozen", "quality.jump", "quality.out_of_range"):
            frames.setdefault(f["episode"], []).append(f["details"]["frames"])
    assert frames == {5: [want[5]], 9: [want[9], want[9]]}, frames  # jump and out_of_range
    assert not any("frames" in (f.get("details") or {}) for f in report["findings"]
                   if f["check"] == "quality.duplicate")  # fmt: skip
    (tmp_path / "report.json").write_text(v.stdout)
    for name, extra in (("fresh", []), ("report", ["--flags-from", tmp_path / "report.json"])):
        out = tmp_path / name
        r = run("edit", root, "--out", out, "--drop-flagged", CHECKS, *extra, "--json")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["dropped"] == {str(dup): "flagged by quality.duplicate"}
        got = {int(e): info["ranges"] for e, info in doc["frames_dropped"].items()}
        assert got == want
        assert doc["frames_dropped"]["9"]["flagged_by"] == ["quality.jump", "quality.out_of_range"]
        assert doc["frames_dropped"]["5"]["by"] == ["--drop-flagged"]
        a, b = rows(root), rows(out)
        ep, fi = a["episode_index"].to_numpy(), a["frame_index"].to_numpy()
        keep = ep != dup
        for e, ranges in want.items():
            for lo, hi in ranges:
                keep &= ~((ep == e) & (fi >= lo) & (fi <= hi))
        a = a.filter(pa.array(keep))
        assert b.num_rows == a.num_rows
        np.testing.assert_array_equal(
            b["action"].combine_chunks().values.to_numpy(),
            a["action"].combine_chunks().values.to_numpy(),
        )
        assert open_dataset(str(out)).num_episodes == QUALITY_SPEC["episodes"] - 1
    after = run("validate", tmp_path / "fresh", "--checks", CHECKS, "--json")
    assert [f["check"] for f in json.loads(after.stdout)["findings"]] == []
