"""The README and docs/ say what is true: the check reference is the registry, no path of a
developer's machine is anywhere in the repository, the README stays a front door, and every code
block runs as written.

Code blocks, by their info string:
- ``python``: run as a script in a fresh process (no RANK / WORLD_SIZE set), in a folder holding
  ``demo-data`` (a small prepared sample, with the canonical plan and the frame store), a second
  sample ``other-data``, ``mixture.json`` over the two and its plans in ``mix-plans``;
- ``bash``: each line run in that folder, which also holds ``.venv`` (this interpreter's
  environment) and ``scripts`` (the repository's), so ``.venv/bin/episodekit ...`` works as
  printed; every line must exit 0;
- ``json``: must parse;
- ``console``: the set-up commands (``make ...``): what CI itself runs, so not run again here;
- ``text``: output and synopses, never run.
A block with any other info string (or none) fails the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)
KINDS = {"python", "bash", "json", "console", "text"}
MACHINE_PATH = re.compile(r"(?<![\w.~$<-])(/work/|/root/|/home/\w|/tmp/pytest-|/Users/\w)")


def blocks() -> list[tuple[str, int, str, str]]:
    """(file, line, info string, code) of every fenced block in the README and docs/."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append((str(path.relative_to(REPO)), line, m.group(1).strip(), m.group(2)))
    return out


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder laid out as the docs assume: prepared ``demo-data`` etc. (built once)."""
    d = tmp_path_factory.mktemp("docs")
    ek = [sys.executable, "-m", "episodekit.cli"]
    env = _env() | {"EPISODEKIT_CACHE": str(d / "cache")}

    def run(*args: str) -> None:
        subprocess.run([*ek, *args], cwd=d, env=env, check=True, capture_output=True)

    run("sample", "demo-data", "--episodes", "200", "--style", "edited", "--seed", "0")
    run("prepare", "demo-data", "--frames", "--canonical-bins", "auto", "--quiet")
    run("sample", "other-data", "--episodes", "150", "--seed", "1")
    spec = {"sources": [{"root": "demo-data", "weight": 2}, {"root": "other-data", "weight": 1}]}
    (d / "mixture.json").write_text(json.dumps(spec))
    run("metadata", "plan", "--mixture", "mixture.json", "--out", "mix-plans",
        "--world-size", "8", "--workers", "4")  # fmt: skip
    (d / ".venv").symlink_to(Path(sys.prefix))
    (d / "scripts").symlink_to(REPO / "scripts")
    return d


def _ids(kind: str) -> list:
    return [pytest.param(code, id=f"{f}:{line}") for f, line, k, code in blocks() if k == kind]


def test_every_block_has_a_known_kind():
    unknown = [f"{f}:{line} '{k}'" for f, line, k, _ in blocks() if k not in KINDS]
    assert unknown == [], "label each block with one of " + ", ".join(sorted(KINDS))


def test_there_are_blocks_to_run():
    kinds = [k for *_, k, _ in [(b[0], b[1], b[2], b[3]) for b in blocks()]]
    assert kinds.count("python") >= 3 and kinds.count("bash") >= 2


@pytest.mark.parametrize("code", _ids("python"))
def test_python_block_runs(code, workdir):
    if "torch" in code:
        pytest.importorskip("torch")
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=workdir, env=_env() | {
            "EPISODEKIT_CACHE": str(workdir / "cache")}, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.parametrize("code", _ids("bash"))
def test_bash_block_runs(code, workdir):
    env = _env() | {"EPISODEKIT_CACHE": str(workdir / "cache")}
    for line in code.splitlines():
        cmd = line.split("  #")[0].strip()
        if not cmd or cmd.startswith("#"):
            continue
        p = subprocess.run(
            ["bash", "-c", cmd], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
        )
        assert p.returncode == 0, f"{cmd}: {p.stderr[-3000:]}"


@pytest.mark.parametrize("code", _ids("json"))
def test_json_block_parses(code):
    json.loads(code)


@pytest.mark.parametrize("code", _ids("console"))
def test_console_blocks_are_the_setup_commands(code):
    cmds = [ln.split("#")[0].strip() for ln in code.splitlines()]
    assert all(c.startswith("make ") for c in cmds if c), code


def test_check_reference_is_the_registry():
    """docs/validate-checks.md is what scripts/gen_check_docs.py makes from the registry (the
    same registry `validate --list-checks` prints); rerun the script after changing a check."""
    p = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_check_docs.py"), "--check"], cwd=REPO
    )
    assert p.returncode == 0, "docs/validate-checks.md is stale: run scripts/gen_check_docs.py"
    listed = subprocess.run(
        [sys.executable, "-m", "episodekit.cli", "validate", "--list-checks"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    page = (REPO / "docs" / "validate-checks.md").read_text()
    ids = [line.split()[0] for line in listed if line.strip()]
    assert ids and all(f"`{i}`" in page for i in ids)


def tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    files = []
    for name in filter(None, out):
        p = REPO / name.decode()
        if p.suffix in {".parquet", ".mp4", ".npz", ".npy", ".png"} or not p.is_file():
            continue
        files.append(p)
    return files


def machine_paths(text: str) -> list[str]:
    return [m.group(0) for m in MACHINE_PATH.finditer(text)]


def test_no_path_of_a_developers_machine_in_the_repository():
    found = []
    for p in tracked_text_files():
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for i, line in enumerate(text.splitlines(), 1):
            if machine_paths(line) and p.name != "test_docs.py":
                found.append(f"{p.relative_to(REPO)}:{i}: {line.strip()[:120]}")
    assert found == []


def test_the_path_finder_finds_them():
    assert machine_paths("see /work/bench-data/big10m and /root/.cache") == ["/work/", "/root/"]
    assert machine_paths("--root $BENCH/big10m ~/.cache/episodekit <repo>/demo-data") == []


def test_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines: move reference text to docs/"
