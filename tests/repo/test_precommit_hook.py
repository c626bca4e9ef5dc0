""".pre-commit-hooks.yaml, run by the real pre-commit: `pre-commit try-repo` installs
episodekit from a copy of this checkout into pre-commit's own environment and runs the
`episodekit-validate` hook in a git repository holding a LeRobot-written dataset: it passes on
the dataset as written, fails on a corrupted info.json and prints the finding, and does not run
when no file under meta/ or data/ is among the files checked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))  # corruptions.py, source_tree.py
from corruptions import edit_info  # noqa: E402
from source_tree import GIT_ENV, commit_all, git, source_repo  # noqa: E402

HOOK = "episodekit-validate"


def test_hook_file_declares_the_validate_hook():
    (hook,) = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == HOOK and hook["language"] == "python"
    assert hook["entry"].startswith("episodekit validate ") and hook["pass_filenames"] is False


def test_pre_commit_try_repo_passes_clean_and_fails_on_a_corrupted_info_json(tmp_path):
    hooks = source_repo(tmp_path / "hooks")
    data = tmp_path / "dataset"
    shutil.copytree(TESTS / "fixtures" / "lerobot" / "rec40", data)
    (data / "README.md").write_text("a dataset\n")
    commit_all(data)
    env = {
        **os.environ,
        **GIT_ENV,
        "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("GITHUB_ACTIONS", None)  # the hook's output as a person sees it
    pre_commit = [sys.executable, "-m", "pre_commit", "try-repo", str(hooks), HOOK]

    def run(*args: str) -> subprocess.CompletedProcess:
        r = subprocess.run(
            [*pre_commit, *args], cwd=data, env=env, capture_output=True, text=True, timeout=1500
        )
        assert "Traceback" not in r.stdout, r.stdout[-3000:]
        return r

    r = run("--all-files")
    assert r.returncode == 0 and "episodekit validate (metadata)" in r.stdout, r.stdout[-3000:]
    assert "Passed" in r.stdout
    # only a file outside meta/ and data/: the hook does not run
    r = run("--files", "README.md")
    assert r.returncode == 0 and "(no files to check)Skipped" in r.stdout, r.stdout[-3000:]

    info = (data / "meta" / "info.json").read_text()
    edit_info(data, total_frames=12330)
    git(data, "add", "-A")
    r = run("--all-files")
    assert r.returncode == 1 and "Failed" in r.stdout, r.stdout[-3000:]
    assert "info.totals" in r.stdout
    assert "total_frames is 12330 but the episodes/tasks tables give 12325" in r.stdout
    (data / "meta" / "info.json").write_text(info)
    git(data, "add", "-A")
    assert run("--all-files").returncode == 0
