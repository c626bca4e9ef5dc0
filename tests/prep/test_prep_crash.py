"""prep rowgroups under kill -9, and its command line."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
from click.testing import CliRunner

from episodekit.cli import main
from episodekit.core.band import MARKER_KEY
from episodekit.core.dataset import open_dataset
from episodekit.core.footer import file_layout
from episodekit.prep import rewrite_rowgroups

SPEC = dict(episodes=60, style="edited", data_files_size_in_mb=0.6)

# Rewrites ROOT in this process (workers=1, files in order) but hangs after the first row group
# of the second data file, so a kill -9 lands mid-rewrite with a partly written temporary.
CHILD = r"""
import sys, time
from episodekit.core.parquet_write import RowGroupWriter
real_group = RowGroupWriter.write_group
def group(w, rows):
    real_group(w, rows)
    if "file-001" in w.path:
        print("HANG", flush=True)
        time.sleep(600)
RowGroupWriter.write_group = group
from episodekit.prep import rewrite_rowgroups
rewrite_rowgroups(sys.argv[1], target_mb=0.25, workers=1)
"""


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_kill_mid_rewrite_leaves_old_or_new_and_next_run_completes(make_sample):
    root = make_sample(**SPEC)
    ds = open_dataset(str(root))
    assert len(ds.data_files) >= 3
    originals = {rel: pq.read_table(root / rel) for rel in ds.data_files}
    sha = {rel: _sha(root / rel) for rel in ds.data_files}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "HANG"
        temps = list((root / "data").rglob(".*tmp-*"))
        assert len(temps) == 1 and temps[0].stat().st_size > 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    first, second, *rest = ds.data_files
    # fully new: marked and equal to the original rows
    assert MARKER_KEY in file_layout(str(root / first)).key_value
    assert pq.read_table(root / first).equals(originals[first], check_metadata=True)
    # fully old: byte-identical
    for rel in [second, *rest]:
        assert _sha(root / rel) == sha[rel]
    # the next run removes the temporary and completes
    report = rewrite_rowgroups(str(root), target_mb=0.25, workers=2)
    assert report.ok and report.removed_temporaries == 1
    assert report.count("skipped") == 1 and report.count("rewritten") == len(ds.data_files) - 1
    assert not list(root.rglob(".*tmp-*"))
    for rel, table in originals.items():
        assert pq.read_table(root / rel).equals(table, check_metadata=True)


def test_cli_rowgroups(make_sample):
    root = make_sample(**SPEC)
    runner = CliRunner()
    res = runner.invoke(main, ["prep", "rowgroups", "--help"])
    assert res.exit_code == 0 and "--target-mb" in res.output and "--dry-run" in res.output
    res = runner.invoke(main, ["prep", "rowgroups", str(root), "--target-mb", "0.25", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "would rewrite data/chunk-000/file-000.parquet" in res.output
    res = runner.invoke(main, ["prep", "rowgroups", str(root), "--target-mb", "0.25", "-q"])
    assert res.exit_code == 0, res.output
    assert "before" in res.output and "after" in res.output and "rewritten" in res.output
    res = runner.invoke(main, ["prep", "rowgroups", str(root), "--target-mb", "0.25", "--json"])
    assert res.exit_code == 0, res.output
    assert '"skipped": ' in res.output


def test_cli_exit_code_on_corrupt_file(make_sample):
    root = make_sample(**SPEC)
    bad = root / open_dataset(str(root)).data_files[0]
    bad.write_bytes(b"garbage")
    res = CliRunner().invoke(main, ["prep", "rowgroups", str(root), "--target-mb", "0.25", "-q"])
    assert res.exit_code == 1
    assert str(bad) in res.output and "FAILED" in res.output
    res = CliRunner().invoke(main, ["prep", "rowgroups", str(root / "nope")])
    assert res.exit_code == 2 and "no such folder" in res.output
