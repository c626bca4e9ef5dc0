"""`prepare --executor ray` on a real multi-node Ray cluster (three nodes on this machine, one
module-scoped cluster for every test here): every written file byte-identical to a local run
(the frame store's arrays too), and still identical with a node killed while it runs a task
(Ray retries the task on another node; no temporary is left behind). Skipped without ray."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from ray.cluster_utils import Cluster  # noqa: E402

from episodekit.core.atomic import is_temp_name  # noqa: E402
from episodekit.core.paths import STAMP_FILE  # noqa: E402

pytestmark = pytest.mark.ray

NODES = 3


@pytest.fixture(scope="module")
def cluster():
    """A head and two more nodes, one CPU and a resource of its own each."""
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": {"node0": 1}, "include_dashboard": False},
    )
    for i in range(1, NODES):
        c.add_node(num_cpus=1, resources={f"node{i}": 1})
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (the validation stamp without its mtimes)."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.name == "manifest.json" or p.name == ".lock":
            continue
        data = p.read_bytes()
        if p.name == Path(STAMP_FILE).name:
            doc = json.loads(data)
            doc.pop("state", None)
            doc.pop("rerun", None)
            data = json.dumps(doc, sort_keys=True).encode()
        out[p.relative_to(folder).as_posix()] = hashlib.sha256(data).hexdigest()
    return out


def _prepare(src: Path, out: Path, cache: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "EPISODEKIT_CACHE": str(cache)}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "episodekit.cli", "prepare", str(src), "--out", str(out)]
    cmd += ["--target-mb", "1", "--world-size", "2", "--workers", "2", "--stats", "recompute"]
    cmd += ["--frames", "-q", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen) -> str:
    text = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 0, text
    assert "Traceback" not in text
    return text


def _outputs(out: Path, cache: Path) -> dict[str, str]:
    got = {f"root/{k}": v for k, v in _digests(out).items()}
    stores = list((cache / "frames").iterdir())
    assert len(stores) == 1
    got.update({f"store/{k}": v for k, v in _digests(stores[0]).items()})
    return got


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The sample (several data files, a few MB each) and its local prepare's digests."""
    from episodekit.sample import write_sample

    base = tmp_path_factory.mktemp("ray")
    src = write_sample(base / "src", episodes=400, style="edited", seed=11, data_files_size_in_mb=2)
    _finish(_prepare(src, base / "local", base / "cache-local", "--jobs", "1"))
    return src, _outputs(base / "local", base / "cache-local")


def test_cluster_has_three_nodes_with_their_own_resources(cluster):
    ray.init(address=cluster.address)
    try:
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert len(nodes) == NODES
        assert {
            k for n in nodes for k in n["Resources"] if k.startswith("node") and ":" not in k
        } == {f"node{i}" for i in range(NODES)}
    finally:
        ray.shutdown()


def test_prepare_on_the_cluster_is_byte_identical_to_local(cluster, local_run, tmp_path):
    src, want = local_run
    assert len([k for k in want if k.startswith("root/data/")]) >= 3
    proc = _prepare(
        src, tmp_path / "out", tmp_path / "cache", "--executor", "ray", "--ray-address",
        cluster.address,
    )  # fmt: skip
    _finish(proc)
    assert _outputs(tmp_path / "out", tmp_path / "cache") == want


def _busy_node(cluster) -> object | None:
    """A non-head node with a worker running one of our tasks (``ray::_call_task``) right now."""
    for node in cluster.worker_nodes:
        raylet = node.all_processes["raylet"][0].process.pid
        try:
            kids = psutil.Process(raylet).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for k in kids:
            try:
                if k.cmdline() and k.cmdline()[0].startswith("ray::_call_task"):
                    return node
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return None


def _run_and_kill(cluster, src, out: Path, cache: Path) -> tuple[object | None, str]:
    """Run prepare on the cluster and remove a node as soon as one runs our task."""
    proc = _prepare(src, out, cache, "--executor", "ray", "--ray-address", cluster.address)
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and proc.poll() is None and time.monotonic() < deadline:
        node = _busy_node(cluster)
        if node is not None:
            cluster.remove_node(node)  # kills its raylet and the worker running our task
            killed = node
        time.sleep(0.02)
    return killed, _finish(proc)


def test_a_node_killed_mid_run_changes_nothing(cluster, local_run, tmp_path):
    src, want = local_run
    # A run may end before the watcher sees a task on a worker node (a fast machine): try again.
    for attempt in range(3):
        out, cache = tmp_path / f"out{attempt}", tmp_path / f"cache{attempt}"
        killed, text = _run_and_kill(cluster, src, out, cache)
        if killed is not None:
            break
    assert killed is not None, f"no task was seen running on a worker node\n{text}"
    cluster.add_node(num_cpus=1, resources={"node9": 1})  # the next test has three nodes again
    assert _outputs(out, cache) == want
    assert not [p for p in out.rglob("*") if is_temp_name(p.name)]  # nothing half-written
