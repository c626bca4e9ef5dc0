"""Shared fixtures: small datasets in the exact LeRobot layout, written on the fly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from episodekit.core.video import have_av
from episodekit.sample import write_sample


@pytest.fixture(scope="session")
def _sample_cache(tmp_path_factory) -> dict:
    return {"dir": tmp_path_factory.mktemp("samples"), "made": {}}


@pytest.fixture
def make_sample(_sample_cache, tmp_path):
    """make_sample(**spec) -> Path of a fresh private copy of a sample dataset.

    Samples are written once per session per spec and copied, so tests may modify their copy.
    """

    def _make(copy: bool = True, **spec) -> Path:
        if spec.get("videos") and not have_av():
            pytest.skip("PyAV is not installed (pip install 'episodekit[video]')")
        key = tuple(sorted(spec.items()))
        made = _sample_cache["made"]
        if key not in made:
            path = _sample_cache["dir"] / f"s{len(made)}"
            write_sample(path, **spec)
            made[key] = path
        if not copy:
            return made[key]
        dst = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(made[key], dst)
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
