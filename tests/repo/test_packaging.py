"""Packaging: the three folders install as episodekit.* and nothing generic lands top-level."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
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


# --------------------------------------------------------------------------------------------
# What users install: the sdist and the wheel built from it, in a fresh venv outside the repo

PACKAGE_ROOTS = {  # repository folder -> the package it installs as (setup.py's PACKAGE_DIR)
    "app": "episodekit",
    "core": "episodekit.core",
    "prep": "episodekit.prep",
    "metadata": "episodekit.metadata",
    "loaders": "episodekit.loaders",
    "validate": "episodekit.validate",
    "writers": "episodekit.writers",
    "sample": "episodekit.sample",
    "importers": "episodekit.importers",
}
FIXTURES = REPO / "tests" / "fixtures" / "lerobot"
NOT_SOURCE = (".venv", ".git", "build", "dist", "site", "demo-data", "__pycache__", "*.egg-info")


def source_packages() -> dict[str, str]:
    """Every folder of the repository holding an ``__init__.py`` (its path) -> the package it
    must install as."""
    found = {}
    for folder, package in PACKAGE_ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found[init.parent.relative_to(REPO).as_posix()] = ".".join((package, *rel))
    return found


def test_setup_maps_the_same_folders_as_this_test():
    """setup.py's PACKAGE_DIR is the map these tests check against (one edited without the
    other would test the wrong thing)."""
    text = (REPO / "setup.py").read_text()
    for folder, package in PACKAGE_ROOTS.items():
        assert f'"{package}": "{folder}"' in text


def _build(tmp_path: Path) -> tuple[Path, Path]:
    """The sdist of a copy of the repository's sources, and the wheel built from that sdist
    (``python -m build``'s default: so the sdist is shown to be complete)."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)],
        check=True,
        capture_output=True,
    )
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def _installed_packages(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        inits = [n for n in z.namelist() if n.endswith("/__init__.py")]
    return {n[: -len("/__init__.py")].replace("/", ".") for n in inits}


def _in_venv(venv: Path, cwd: Path, *args: str, code: int = 0) -> str:
    """Run ``args`` with the venv's bin first on PATH, from ``cwd`` (outside the repository),
    with no PYTHONPATH: what a user's shell does. Asserts the exit code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    out = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True)
    assert out.returncode == code, f"{args}: exit {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr
    return out.stdout


LOADER = """
import sys
import episodekit.loaders as L
root = sys.argv[1]
assert L.__file__.startswith(sys.prefix), L.__file__
ds = L.FrameDataset(root, delta_timestamps={"action": [0.0, 1 / 30]})
s = ds[7]
assert s["action"].shape == (2, 14), s["action"].shape
plan = L.load_plan(root, world_size=2, num_workers=1)
loader = L.ShardedLoader(root, plan, rank=0, world_size=2, worker=0, num_workers=1,
                         batch_size=64, seed=0)
print(sum(b["index"].shape[0] for b in loader), plan.samples_per_worker)
"""


def test_sdist_and_wheel_install_and_run_in_a_fresh_venv(tmp_path):
    """The sdist and the wheel hold every package of the repository; the wheel, installed with
    its dependencies into a fresh venv, runs validate, prepare, edit, repair and the loader on
    datasets LeRobot wrote, from a folder outside the repository; so does the sdist."""
    sdist, wheel = _build(tmp_path)
    want = source_packages()
    assert _installed_packages(wheel) == set(want.values())
    with tarfile.open(sdist) as t:
        in_sdist = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for folder in want:
        assert f"{folder}/__init__.py" in in_sdist, folder

    venv, work = tmp_path / "venv", tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--disable-pip-version-check", str(wheel)], check=True)
    for name in ("rec40", "crash_rec7"):
        shutil.copytree(FIXTURES / name, work / name)
    for install in (None, sdist):  # the wheel, then the sdist over it (no dependency change)
        if install is not None:
            shutil.rmtree(work / "rec40")
            shutil.copytree(FIXTURES / "rec40", work / "rec40")
            for old in ("edited", "repaired"):
                shutil.rmtree(work / old)
            subprocess.run([*pip, "--no-deps", "--force-reinstall", str(install)], check=True)
        _in_venv(venv, work, "episodekit", "validate", "rec40")
        ek = ("episodekit",)
        _in_venv(venv, work, *ek, "prepare", "rec40", "--world-size", "2", "--workers", "1")
        _in_venv(venv, work, *ek, "validate", "rec40")
        _in_venv(venv, work, *ek, "edit", "rec40", "--out", "edited", "--drop-episodes", "3")
        _in_venv(venv, work, "episodekit", "repair", "crash_rec7", "--out", "repaired")
        _in_venv(venv, work, "episodekit", "validate", "repaired")
        frames, per_worker = _in_venv(venv, work, "python", "-c", LOADER, "rec40").split()
        assert frames == per_worker
