"""Packaging: the three folders install as episodekit.* and nothing generic lands top-level."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, cwd: Path, env_path: str | None = None) -> str:
    env = {"PYTHONPATH": env_path} if env_path else None
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, env=env, check=True
    )
    return out.stdout.strip()


def test_editable_install_maps_subpackages(tmp_path):
    code = (
        "import importlib.util as u, episodekit.prep, episodekit.metadata, episodekit.loaders;"
        "print(u.find_spec('prep') is None, u.find_spec('metadata') is None,"
        " episodekit.metadata.__file__)"
    )
    no_prep, no_meta, meta_file = _run(code, cwd=tmp_path).split()
    assert no_prep == "True" and no_meta == "True"
    assert Path(meta_file).resolve().parent == REPO / "metadata"


def test_wheel_install_has_no_generic_top_level(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    top = sorted(p.name for p in target.iterdir() if not p.name.endswith(".dist-info"))
    assert "episodekit" in top
    assert not {"prep", "metadata", "loaders"} & set(top)
    for sub in ("prep", "metadata", "loaders"):
        assert (target / "episodekit" / sub / "__init__.py").exists()
    # A regular (non-editable) install imports from the repository root too: no folder there is
    # named like the import package, so nothing shadows the installed one.
    assert not (REPO / "episodekit").exists()
    code = "import episodekit.loaders, episodekit.cli; print(episodekit.loaders.__file__)"
    loaders_file = _run(code, cwd=REPO, env_path=str(target))
    assert Path(loaders_file).resolve().is_relative_to(target.resolve())
