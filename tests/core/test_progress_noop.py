"""Progress only for work that runs: on a terminal, a rerun where every file is already done
draws no row-group bar (it used to draw one, with a rate of skipped bytes, before "skipped")."""

from __future__ import annotations

import sys
from pathlib import Path

EPISODEKIT = str(Path(sys.executable).parent / "episodekit")


def test_no_bar_for_a_no_op_rewrite(make_sample, on_tty):
    root = str(make_sample(episodes=30, style="edited", data_files_size_in_mb=1))
    first = on_tty("prep", "rowgroups", root, "--target-mb", "0.25", "--jobs", "1")
    assert "%|" in first and "MiB/s" in first  # real work: a bar with the byte rate
    again = on_tty("prep", "rowgroups", root, "--target-mb", "0.25", "--jobs", "1")
    assert "%|" not in again and "skipped" in again


def test_no_rowgroups_bar_for_a_no_op_prepare(make_sample, on_tty):
    root = str(make_sample(episodes=30, style="edited", data_files_size_in_mb=1))
    args = ("prepare", root, "--target-mb", "0.25", "--world-size", "1", "--workers", "1")
    on_tty(*args, "--jobs", "1")
    again = on_tty(*args, "--jobs", "1")
    assert "rowgroups: skipped" in again
    before = again.split("rowgroups: skipped")[0]
    assert "%|" not in before and "MiB/s" not in before  # no bar before "skipped"


def test_cli_common_and_progress_do_not_import_each_other():
    import ast

    cli = Path(__file__).resolve().parents[2] / "app" / "cli"
    tree = ast.parse((cli / "progress.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "episodekit.cli.common" not in imported
