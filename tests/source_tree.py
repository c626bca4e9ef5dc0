"""A copy of what ``pip install .`` needs from this repository (the package folders,
pyproject.toml, setup.py, README.md) plus the CI integration files (.pre-commit-hooks.yaml,
action.yml), as a git repository with one commit: what `pre-commit try-repo` and the
GitHub Action install from. The working tree is copied, so uncommitted changes are tested."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ("pyproject.toml", "setup.py", "README.md", ".pre-commit-hooks.yaml", "action.yml")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def package_folders() -> list[str]:
    """The folders setup.py maps to packages (each top-level folder with an __init__.py,
    tests excluded)."""
    return sorted(
        p.name for p in REPO.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"
    )


def git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV}
    )


def commit_all(folder: Path) -> Path:
    """``git init`` + add + commit everything in ``folder``."""
    git(folder, "init", "-q", "-b", "main")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "snapshot")
    return folder


def source_repo(dst: Path) -> Path:
    """The installable copy of this repository at ``dst``, committed."""
    dst.mkdir(parents=True)
    for name in FILES:
        shutil.copy2(REPO / name, dst / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in package_folders():
        shutil.copytree(REPO / folder, dst / folder, ignore=ignore)
    return commit_all(dst)
