"""``repair --executor ray``: footer-less files walked and data files verified as Ray tasks, the
output byte-identical to the local run."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

import pytest

from episodekit.writers.repair import RepairOptions, repair

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"


def tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def ray_up():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_repair_on_ray_equals_local(ray_up, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "crash_rec7", src)
    for executor in ("local", "ray"):
        result = repair(src, RepairOptions(out=str(tmp_path / executor), executor=executor))
        assert result.status == "repaired" and result.episodes == 7
    assert tree(tmp_path / "local") == tree(tmp_path / "ray")
