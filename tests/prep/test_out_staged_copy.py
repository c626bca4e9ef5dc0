"""``prep rowgroups --out DIR`` reruns: staged (issue 41) and settled by the copy record (issue
39) at once. The staging folder is seeded with hard links of what DIR holds (the record, the
copies, what later steps made), so a rerun with an unchanged source copies nothing and publishes
the very same files; a failed rerun publishes nothing (DIR and its record as they were); a copy
of a source file that is gone since is not carried over."""

from __future__ import annotations

import json
import os
from pathlib import Path

from episodekit.core.dataset import open_dataset
from episodekit.metadata.speed import ensure_speed_file
from episodekit.prep import rewrite_rowgroups
from episodekit.prep.outcopy import RECORD_FILE

TARGET_MB = 0.25
SPEC = dict(episodes=24, style="edited", data_files_size_in_mb=0.3)
LATER = "meta/speed_percentiles.jsonl"  # an artifact a later step makes in DIR


def _files(out: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file of DIR (but the writer's lock): inode, mtime and content."""
    found = (p for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".episodekit.lock")
    return {
        str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
        for p in found
    }


def _staging_left(out: Path) -> list[str]:
    return [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def _record(out: Path) -> dict[str, str]:
    return json.loads((out / RECORD_FILE).read_text())["files"]


def _first_run(root: Path, out: Path) -> None:
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, out=str(out), workers=1)
    assert report.ok and report.copied and report.count("rewritten") == len(report.files)
    ensure_speed_file(open_dataset(str(out)))  # a later step's work in DIR
    assert (out / LATER).is_file()


def test_rerun_carries_the_record_the_copies_and_later_work(make_sample, tmp_path):
    root, out = make_sample(**SPEC), tmp_path / "out"
    _first_run(root, out)
    before = _files(out)
    again = rewrite_rowgroups(str(root), target_mb=TARGET_MB, out=str(out), workers=1)
    assert again.ok and again.copied == []  # nothing copied again: the record said so
    assert again.count("skipped") == len(again.files)
    assert _files(out) == before  # the very same files, the later step's artifact included
    assert not _staging_left(out)


def test_a_failed_rerun_leaves_out_and_its_record_as_they_were(make_sample, tmp_path):
    root, out = make_sample(**SPEC), tmp_path / "out"
    _first_run(root, out)
    before = _files(out)
    ds = open_dataset(str(root))
    tasks = root / "meta/tasks.parquet"  # changed at the source: copied again into the staging
    os.utime(tasks, ns=(tasks.stat().st_atime_ns, tasks.stat().st_mtime_ns + 10**9))
    (root / ds.data_files[0]).write_bytes(b"PAR1 this is not parquet" * 10)
    report = rewrite_rowgroups(str(root), target_mb=TARGET_MB, out=str(out), workers=1)
    assert not report.ok and "nothing was published" in report.failed[0].reason
    assert "meta/tasks.parquet" in report.copied
    assert _files(out) == before  # record included: the failed run's notes were not published
    assert not _staging_left(out)


def test_copies_of_source_files_gone_since_are_not_carried(make_sample, tmp_path):
    root, out = make_sample(**SPEC), tmp_path / "out"
    extra = root / "meta/notes/readme.txt"
    extra.parent.mkdir()
    extra.write_text("a file of the source's meta/")
    _first_run(root, out)
    assert (out / "meta/notes/readme.txt").is_file() and "meta/notes/readme.txt" in _record(out)
    extra.unlink()
    again = rewrite_rowgroups(str(root), target_mb=TARGET_MB, out=str(out), workers=1)
    assert again.ok and again.copied == []
    assert not (out / "meta/notes/readme.txt").exists()
    assert "meta/notes/readme.txt" not in _record(out)
    assert (out / LATER).is_file()  # what a later step made is still carried
