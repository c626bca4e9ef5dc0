"""Which Ray cluster ``--executor ray`` joins without ``--ray-address``: the one ``ray start``
recorded on this machine, else an instance of its own, never the private local instance another
command started for itself (it ends with that command: a second ``prepare --executor ray`` started
6 s after a first failed with "The task's local raylet died" when the first finished)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from episodekit.core import executor  # noqa: E402

pytestmark = pytest.mark.ray

HOLDER = """
import sys, time, ray
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes it
"""


class _FakeRay:
    def __init__(self, fail: set[str] = frozenset()) -> None:
        self.calls: list[dict] = []
        self.fail = fail

    def init(self, **kwargs) -> None:
        self.calls.append(kwargs)
        if kwargs.get("address") in self.fail:
            raise ConnectionError("no cluster there")


def test_without_a_recorded_cluster_an_instance_of_its_own(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(executor, "_recorded_cluster", lambda: None)
    fake = _FakeRay()
    executor._connect_ray(fake, 3)
    assert [c["address"] for c in fake.calls] == ["local"]  # never "auto"
    assert fake.calls[0]["num_cpus"] == 3


def test_a_recorded_cluster_is_joined_and_a_stale_record_falls_back(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(executor, "_recorded_cluster", lambda: "10.0.0.9:6379")
    fake = _FakeRay()
    executor._connect_ray(fake, 2)
    assert [c["address"] for c in fake.calls] == ["10.0.0.9:6379"]
    assert "num_cpus" not in fake.calls[0]  # Ray refuses it for an existing cluster
    stale = _FakeRay(fail={"10.0.0.9:6379"})
    executor._connect_ray(stale, 2)
    assert [c["address"] for c in stale.calls] == ["10.0.0.9:6379", "local"]


def test_another_commands_private_instance_is_not_joined(tmp_path: Path) -> None:
    """As a user runs it: a process holding a local instance of its own (as a running
    ``--executor ray`` command does), then ``validate --executor ray`` on a sample."""
    from episodekit.sample import write_sample

    root = write_sample(tmp_path / "ds", episodes=6, seed=3)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    try:
        held = holder.stdout.readline().strip()
        assert held, "the holder did not start Ray"
        cmd = [sys.executable, "-m", "episodekit.cli", "validate", str(root), "--executor", "ray"]
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert held not in run.stdout + run.stderr  # Ray says where it connects
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
