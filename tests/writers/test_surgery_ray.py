"""Dataset writers on Ray (``--executor ray``): surgery's output data files written and verified
as their own Ray tasks, and repair's footer-less files walked and data files verified as Ray
tasks, each output byte-identical to the local run; a source fault raised in a task is the same
clear error. (One module: one Ray cluster for all of them.)"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import DatasetError
from episodekit.writers.convert import ConvertOptions, convert
from episodekit.writers.edit import EditSpec, edit
from episodekit.writers.merge import merge
from episodekit.writers.repair import RepairOptions, repair

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray")

V21 = Path(__file__).parents[1] / "fixtures" / "lerobot" / "v21vid8"
CLI = "import sys; from episodekit.cli import main; sys.exit(main())"


def _tree(root: Path) -> dict[str, str]:
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


def test_edit_merge_convert_on_ray_equal_local(ray_up, make_sample, tmp_path):
    src = make_sample(episodes=16, style="recorded", data_files_size_in_mb=0.1, copy=False)
    for executor in ("local", "ray"):
        spec = EditSpec(drop_episodes=(3, 7, 12), target_mb=0.05, executor=executor)
        edit(str(src), tmp_path / f"edit-{executor}", spec)
        merge([str(src), str(src)], tmp_path / f"merge-{executor}", 0.05, executor=executor)
        opts = ConvertOptions(data_mb=0.05, executor=executor)
        convert(str(V21), tmp_path / f"conv-{executor}", opts)
    for what in ("edit", "merge", "conv"):
        local, on_ray = _tree(tmp_path / f"{what}-local"), _tree(tmp_path / f"{what}-ray")
        data = [k for k in local if k.startswith("data/")]
        assert len(data) >= 2, what  # several files: several tasks
        assert local == on_ray, what


def test_a_fault_found_in_a_ray_task_is_a_dataset_error(ray_up, make_sample, tmp_path):
    src = make_sample(episodes=12, style="recorded", data_files_size_in_mb=0.2)
    f = sorted((src / "data").rglob("*.parquet"))[-1]
    t = pq.read_table(f)
    pq.write_table(t.slice(0, t.num_rows - 5), f)  # the last episode loses rows
    with pytest.raises(DatasetError, match="rows, the episodes table says"):
        edit(str(src), tmp_path / "out", EditSpec(drop_episodes=(0,), executor="ray"))
    assert not (tmp_path / "out").exists()


def test_cli_executor_ray(ray_up, make_sample, tmp_path):
    """As a user runs it, on the cluster --ray-address names (this test's own: not another
    process's local instance, which a bare --executor ray would join)."""
    import ray

    src = make_sample(episodes=10, style="recorded")
    shutil.rmtree(tmp_path / "x", ignore_errors=True)
    address = ray.get_runtime_context().gcs_address
    args = ["edit", str(src), "--drop-episodes", "1", "--json", "--executor", "ray"]
    args += ["--ray-address", address]
    res = subprocess.run(
        [sys.executable, "-c", CLI, *args, "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["status"] == "written" and doc["episodes"] == 9
    assert (
        pa.concat_tables(
            [pq.read_table(p) for p in sorted((tmp_path / "x/data").rglob("*.parquet"))]
        ).num_rows
        == doc["frames"]
    )


def test_frames_cut_and_features_added_on_ray_equal_local(ray_up, make_sample, tmp_path):
    """Episodes cut inside and a feature added: the Ray tasks get the masks and the values."""
    import numpy as np

    from episodekit.writers.frames import parse_frame_spec

    src = make_sample(episodes=16, style="recorded", data_files_size_in_mb=0.1, copy=False)
    t = pa.concat_tables(pq.read_table(p) for p in sorted((src / "data").rglob("*.parquet")))
    values = tmp_path / "reward.parquet"
    pq.write_table(t.select(["episode_index", "frame_index"]).append_column(
        "value", pa.array(np.arange(t.num_rows, dtype=np.float32))), values)  # fmt: skip
    for executor in ("local", "ray"):
        spec = EditSpec(drop_frames=parse_frame_spec("2:0-9,9:5-30"), trim_idle=True,
                        add_features=(("next.reward", str(values)),),
                        rename_features=(("action", "act"),), target_mb=0.05,
                        executor=executor)  # fmt: skip
        edit(str(src), tmp_path / f"cut-{executor}", spec)
    local, on_ray = _tree(tmp_path / "cut-local"), _tree(tmp_path / "cut-ray")
    assert len([k for k in local if k.startswith("data/")]) >= 2
    assert local == on_ray


def test_images_to_video_on_ray_equals_local(ray_up, tmp_path):
    """``--images-to-video``: each image feature encoded and read back as its own Ray task; the
    same data, metadata and decoded quality as the local run."""
    img6 = Path(__file__).parents[1] / "fixtures" / "lerobot" / "img6"
    done = {}
    for executor in ("local", "ray"):
        spec = EditSpec(images_to_video=("all",), executor=executor)
        done[executor] = edit(str(img6), tmp_path / f"i2v-{executor}", spec).write
    local, on_ray = _tree(tmp_path / "i2v-local"), _tree(tmp_path / "i2v-ray")
    assert sorted(local) == sorted(on_ray)
    assert len([k for k in local if k.startswith("videos/")]) == 2
    for k in local:
        if k.startswith(("data/", "meta/info.json", "meta/tasks")):
            assert local[k] == on_ray[k], k
    assert done["ray"].images_to_video == done["local"].images_to_video


def test_repair_on_ray_equals_local(ray_up, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(Path(__file__).parents[1] / "fixtures" / "lerobot" / "crash_rec7", src)
    for executor in ("local", "ray"):
        result = repair(src, RepairOptions(out=str(tmp_path / executor), executor=executor))
        assert result.status == "repaired" and result.episodes == 7
    assert _tree(tmp_path / "local") == _tree(tmp_path / "ray")
