"""Shared fixtures: small datasets in the exact LeRobot layout, written once per test run."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from episodekit.core.video import have_av
from episodekit.sample import write_sample


@pytest.fixture(scope="session")
def _sample_cache(tmp_path_factory) -> Path:
    """The folder of written samples, one per test run: under pytest-xdist every worker's base
    temp is a subfolder of the run's, so the workers share it (each sample is written once)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "samples"
    folder.mkdir(exist_ok=True)
    return folder


def cached_sample(folder: Path, spec: dict) -> Path:
    """The sample ``spec`` describes, written into ``folder`` by the first process that asks
    (a file lock per spec; written under a temporary name, then renamed into place)."""
    key = hashlib.sha256(repr(sorted(spec.items())).encode()).hexdigest()[:16]
    path = folder / key
    with FileLock(str(folder / f"{key}.lock")):
        if not path.exists():
            tmp = folder / f"{key}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            write_sample(tmp, **spec)
            os.replace(tmp, path)
    return path


@pytest.fixture
def make_sample(_sample_cache, tmp_path):
    """make_sample(**spec) -> Path of a fresh private copy of a sample dataset.

    Samples are written once per test run per spec and copied, so tests may modify their copy;
    ``copy=False`` gives the shared sample itself, which the test must only read.
    """

    def _make(copy: bool = True, **spec) -> Path:
        if spec.get("videos") and not have_av():
            pytest.skip("PyAV is not installed (pip install 'episodekit[video]')")
        shared = cached_sample(_sample_cache, spec)
        if not copy:
            return shared
        dst = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(shared, dst)
        return dst

    return _make


@pytest.fixture
def small_root(make_sample) -> Path:
    """A 40-episode recorded-style v3.0 sample (private copy)."""
    return make_sample(episodes=40, tasks=6, seed=1)


@pytest.fixture
def on_tty():
    """on_tty(*args) -> what `episodekit *args` printed with a pseudo-terminal as its stdout and
    stderr (progress bars draw only on a terminal); asserts exit 0. EPISODEKIT_DEBUG unset."""
    import os
    import pty
    import sys

    cli = str(Path(sys.executable).parent / "episodekit")

    def run(*args: str) -> str:
        out = bytearray()

        def read(fd: int) -> bytes:
            data = os.read(fd, 65536)
            out.extend(data)
            return data

        saved = os.environ.pop("EPISODEKIT_DEBUG", None)
        try:
            status = pty.spawn([cli, *args], read)
        finally:
            if saved is not None:
                os.environ["EPISODEKIT_DEBUG"] = saved
        text = out.decode(errors="replace")
        assert os.waitstatus_to_exitcode(status) == 0, text
        return text

    return run
