"""`episodekit prepare`: the chained job, freshness skips, remote roots, hub push, ray parity."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from episodekit.cli import main
from episodekit.prepare import STAMP_FILE, prepare

SIZES = (2, 4)


def _tree_hashes(root: Path, skip: tuple[str, ...] = (STAMP_FILE,)) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and str(p.relative_to(root)) not in skip
    }


def _statuses(result) -> dict[str, str]:
    return {s.name: s.status for s in result.steps}


def test_first_run_does_everything_second_run_nothing(make_sample):
    root = make_sample(episodes=60, style="recorded", data_files_size_in_mb=1)
    (root / "meta/stats.json").unlink()  # the dataset's own stats would be kept, not written
    first = prepare(str(root), target_mb=1, world_sizes=SIZES, num_workers=2, jobs=1)
    assert first.ok
    assert _statuses(first) == dict.fromkeys(
        ("rowgroups", "speed", "costs", "plans", "stats", "validate"), "done"
    )
    for rel in ("meta/speed_percentiles.jsonl", "meta/episode_costs.parquet", STAMP_FILE):
        assert (root / rel).exists(), rel
    assert len(list((root / "meta/shard_plans").iterdir())) == len(SIZES)
    before = _tree_hashes(root, skip=())
    second = prepare(str(root), target_mb=1, world_sizes=SIZES, num_workers=2, jobs=1)
    assert second.ok
    assert set(_statuses(second).values()) == {"skipped"}
    assert second.changed == []
    assert _tree_hashes(root, skip=()) == before  # nothing touched, not even the stamp


def test_rerun_after_losing_an_artifact_redoes_only_that(make_sample):
    root = make_sample(episodes=40)
    prepare(str(root), world_sizes=SIZES, num_workers=2, jobs=1)
    (root / "meta/speed_percentiles.jsonl").unlink()
    again = prepare(str(root), world_sizes=SIZES, num_workers=2, jobs=1)
    s = _statuses(again)
    assert s["rowgroups"] == s["costs"] == s["plans"] == s["stats"] == "skipped"
    assert s["speed"] == "done"
    assert s["validate"] == "done"  # an artifact changed: the stamp no longer matches
    assert again.changed == ["meta/speed_percentiles.jsonl"]


def test_validation_failure_exits_nonzero(make_sample):
    root = make_sample(episodes=30, style="edited")
    assert (
        CliRunner()
        .invoke(main, ["prepare", str(root), "--world-size", "2", "--workers", "1"])
        .exit_code
        == 0
    )
    data = sorted((root / "data").rglob("*.parquet"))[0]
    t = pq.read_table(data)
    action = t["action"].combine_chunks()
    values = action.values.to_numpy().copy()
    values[5] = np.nan
    bad = pa.FixedSizeListArray.from_arrays(pa.array(values), action.type.list_size)
    t = t.set_column(t.schema.get_field_index("action"), "action", bad)
    pq.write_table(t, data, row_group_size=t.num_rows)
    r = CliRunner().invoke(
        main, ["prepare", str(root), "--world-size", "2", "--workers", "1", "--jobs", "1"]
    )
    assert r.exit_code == 1, r.output
    assert "validation FAILED" in r.output


def test_cli_json_summary(make_sample):
    root = make_sample(episodes=30)
    r = CliRunner().invoke(
        main,
        ["prepare", str(root), "--world-size", "2,4", "--workers", "2", "--json", "--jobs", "1"],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["ok"] is True
    assert [s["name"] for s in d["steps"]] == [
        "rowgroups",
        "speed",
        "costs",
        "plans",
        "stats",
        "validate",
    ]
    plans = d["steps"][3]["detail"]["plans"]
    assert [p["world_size"] for p in plans] == [2, 4]
    assert all(p["balance"]["plan"]["max_over_lower_bound"] < 1.05 for p in plans)


def test_bad_arguments(make_sample):
    root = make_sample(episodes=10, copy=False)
    r = CliRunner().invoke(main, ["prepare", str(root), "--world-size", "0"])
    assert r.exit_code == 2 and "world-size" in r.output.lower()
    r = CliRunner().invoke(main, ["prepare", str(root), "--world-size", "a,b"])
    assert r.exit_code == 2
    url = _to_memory(root, "bad_arguments_ds")
    r = CliRunner().invoke(main, ["prepare", url])
    assert r.exit_code == 2 and "--out" in r.output


class FakeHub:
    """Stands in for huggingface_hub.HfApi: records commits, stores files in a folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.commits: list[dict] = []

    def create_commit(self, repo_id, operations, commit_message, repo_type=None, revision=None):
        ops = list(operations)
        for op in ops:
            dst = self.folder / repo_id / op.path_in_repo
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(op.path_or_fileobj, dst)
        self.commits.append(
            {
                "repo_id": repo_id,
                "paths": [o.path_in_repo for o in ops],
                "repo_type": repo_type,
                "revision": revision,
                "message": commit_message,
            }
        )
        return f"fake-commit-{len(self.commits)}"


def _to_memory(root: Path, name: str) -> str:
    mem = fsspec.filesystem("memory")
    for p in root.rglob("*"):
        if p.is_file():
            mem.pipe(f"/{name}/{p.relative_to(root)}", p.read_bytes())
    return f"memory://{name}"


def test_remote_root_prepared_into_out_and_pushed_in_one_commit(make_sample, tmp_path):
    src = make_sample(episodes=40, videos=1, style="recorded")
    url = _to_memory(src, "remote_ds")
    out = tmp_path / "out"
    hub = FakeHub(tmp_path / "hub")
    result = prepare(
        url,
        out=str(out),
        world_sizes=(2,),
        num_workers=2,
        jobs=1,
        push_to_hub="hf://datasets/me/prepared",
        hub_api=hub,
    )
    assert result.ok
    assert (out / "meta/info.json").exists()
    assert not (out / "videos").exists()  # never videos unless asked
    assert len(hub.commits) == 1
    commit = hub.commits[0]
    assert commit["repo_id"] == "me/prepared" and commit["repo_type"] == "dataset"
    pushed = set(commit["paths"])
    assert "data/chunk-000/file-000.parquet" in pushed
    assert {"meta/speed_percentiles.jsonl", "meta/episode_costs.parquet"} <= pushed
    assert STAMP_FILE not in pushed
    # The source is untouched; the pushed copy is byte-identical to the prepared one.
    assert _tree_hashes(src) == _tree_hashes(make_sample(episodes=40, videos=1, copy=False))
    for rel in pushed:
        assert (hub.folder / "me/prepared" / rel).read_bytes() == (out / rel).read_bytes()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_executor_is_byte_identical_to_local(make_sample, tmp_path):
    src = make_sample(episodes=80, style="recorded", data_files_size_in_mb=1, copy=False)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    a = prepare(str(src), out=str(local), target_mb=1, world_sizes=(2,), num_workers=2, jobs=2)
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        b = prepare(
            str(src),
            out=str(on_ray),
            target_mb=1,
            world_sizes=(2,),
            num_workers=2,
            executor="ray",
            jobs=2,
        )
    finally:
        ray.shutdown()
    assert a.ok and b.ok
    assert len(list((local / "data").rglob("*.parquet"))) >= 2
    assert _tree_hashes(local) == _tree_hashes(on_ray)
