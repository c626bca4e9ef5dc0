"""``episodekit import --executor ray`` as a user runs it (a subprocess): the episodes are read
and mapped as Ray tasks, the sink writes them in order on this machine, so the output is the
same bytes as ``--jobs 1``; a corrupt episode found in a task is the same one-line error and
nothing is published; without ray installed, ``--executor ray`` is one line naming the extra
and the local executor never imports ray. (One module: one Ray instance for all of them, started
with ``address="local"``: pytest-xdist workers starting Ray at once would join each other's.)"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from episodekit.core.executor import imap_ordered
from tests.app.hostile import cli as ek
from tests.app.hostile import one_error

FIX = Path(__file__).parents[1] / "fixtures" / "import"
RLDS = FIX / "rlds" / "ek_rlds_fixture" / "1.0.0"
NO_RAY = (
    "import sys\nsys.modules['ray'] = None\nfrom episodekit.cli import main\nmain(sys.argv[1:])"
)
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")


@pytest.fixture(scope="module")
def ray_address():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


CASES = {
    "aloha_jpeg": (FIX / "aloha_jpeg", []),  # JPEG files: decoded by the camera processes
    "aloha_raw": (FIX / "aloha_raw", []),  # raw frames: decoded in the tasks
    "rlds": (RLDS, ["--fps", "10"]),
}


@needs_ray
@pytest.mark.parametrize("name", sorted(CASES))
def test_import_on_ray_writes_the_same_bytes_as_jobs_1(ray_address, tmp_path, name):
    if name == "rlds":
        pytest.importorskip("google_crc32c")
    src, extra = CASES[name]
    one, on_ray = tmp_path / "one", tmp_path / "ray"
    r = ek("import", src, "--out", one, "--jobs", "1", *extra)
    assert r.returncode == 0, r.stderr
    args = ["--executor", "ray", "--ray-address", ray_address, "--jobs", "2", "--json"]
    r = ek("import", src, "--out", on_ray, *extra, *args)
    assert r.returncode == 0, r.stderr
    a, b = _files(one), _files(on_ray)
    assert any(k.startswith("videos/") for k in a) and any(k.startswith("data/") for k in a)
    assert sorted(a) == sorted(b)
    assert [k for k in a if a[k] != b[k]] == []
    # the inputs key ignores the executor: a rerun on the other executor has nothing to do
    r = ek("import", src, "--out", one, *extra, *args)
    assert r.returncode == 0 and '"unchanged"' in r.stdout, r.stdout + r.stderr


@needs_ray
def test_import_on_ray_corrupt_episode_is_one_line_and_publishes_nothing(ray_address, tmp_path):
    src = tmp_path / "aloha"
    shutil.copytree(FIX / "aloha_raw", src)
    path = src / "episode_1.hdf5"
    path.write_bytes(path.read_bytes()[:5000])
    local = one_error(ek("import", src, "--out", tmp_path / "a", "--jobs", "2"), code=1)
    args = ["--executor", "ray", "--ray-address", ray_address]
    line = one_error(ek("import", src, "--out", tmp_path / "b", *args), code=1)
    assert str(path) in line and line == local  # the cause as a local job raises it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aloha"]


@needs_ray
def test_imap_ordered_on_ray_keeps_order_and_its_window(ray_address):
    drawn = []

    def items():
        for i in range(12):
            drawn.append(i)
            yield i

    got = imap_ordered(abs, items(), "ray", workers=2, ahead=3)
    assert next(got) == 0 and len(drawn) == 4  # 3 ahead, the next one submitted when 0 is taken
    assert [0, *got] == list(range(12))


def test_import_ray_without_ray_is_one_line_and_local_never_imports_it(tmp_path):
    """``sys.modules['ray'] = None``: importing ray raises; ``--jobs 2`` (local) does not try."""
    src = FIX / "aloha_jpeg"
    cmd = [sys.executable, "-c", NO_RAY, "import", str(src)]
    r = subprocess.run([*cmd, "--out", str(tmp_path / "x"), "--executor", "ray"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "pip install 'episodekit[ray]'" in one_error(r, code=2)
    assert not (tmp_path / "x").exists()
    r = subprocess.run([*cmd, "--out", str(tmp_path / "y"), "--jobs", "2"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr


@needs_ray
def test_import_on_ray_killed_at_a_checkpoint_resumes_to_the_same_bytes(ray_address, tmp_path):
    """Killed (``kill -9`` at the second journaled checkpoint) while its own Ray instance runs
    (``--ray-address local``): that instance dies with it, nothing is published; the rerun (on
    Ray) keeps the finished data files and writes the same bytes as ``--jobs 1``."""
    import psutil

    from episodekit.core.crashpoint import CRASH_ENV, LOG_ENV
    from tests.importers.test_import_resume import SMALL, files, kept_at, leftovers, write_source

    src = write_source(tmp_path / "src", episodes=24)
    log, ref, out = tmp_path / "points.log", tmp_path / "ref", tmp_path / "out"
    r = ek("import", src, "--out", ref, "--jobs", "1", *SMALL, env={LOG_ENV: str(log)})
    assert r.returncode == 0, r.stderr
    points = [line.split(" ", 1) for line in log.read_text().splitlines()]
    at = [int(n) for n, name in points if name == "import: checkpoint"][1]
    t0 = time.time()
    cmd = [sys.executable, "-m", "episodekit.cli", "import", str(src), "--out", str(out), *SMALL]
    cmd += ["--executor", "ray", "--ray-address", "local", "--jobs", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, CRASH_ENV: f"KILL:{at}"})  # fmt: skip
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert not out.exists() and len(leftovers(out)) == 1
    deadline = time.monotonic() + 30
    while (alive := _orphans(psutil, t0)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive == []  # its Ray instance (gcs, raylet, workers) ended with it

    args = ["--executor", "ray", "--ray-address", ray_address, "--jobs", "2"]
    r = ek("import", src, "--out", out, *SMALL, *args)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["resumed"] == kept_at(ref, 2) > 0
    assert files(out) == files(ref)
    assert leftovers(out) == []


def _orphans(psutil, since: float) -> list[str]:
    """Ray processes started since ``since`` whose driver or raylet is gone (this test's own
    Ray instance, started before, has both). Ray's dashboard and runtime-env agents are left
    out: they watch the raylet and end by themselves (seen ~1 min later at load 15-20), and
    run no task."""
    found = []
    for q in psutil.process_iter(["name", "ppid", "create_time", "status"]):
        info = q.info
        if (info["create_time"] or 0) < since or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        name = info["name"] or ""
        ray_daemon = name in ("gcs_server", "raylet") or name.startswith("ray::")
        ray_daemon = ray_daemon and not name.endswith("Agent")
        if ray_daemon and (info["ppid"] == 1 or not psutil.pid_exists(info["ppid"])):
            found.append(f"{q.pid} {name}")
    return found
