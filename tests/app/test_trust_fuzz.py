"""Fuzz: hostile edits of a prepared root (info.json, episodes parquet, data parquet bytes, speed
file, plan file: truncation, flipped bytes, huge values, NaN, traversal templates), then the CLI
as a user runs it (subprocess, a bounded number of examples) and the loader in-process.
Never a traceback, never a write outside the root, exit 0 (harmless edit), 1 or 2."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from episodekit.core.errors import DatasetError, EnvironmentProblem

CLI = "import sys; from episodekit.cli import main; sys.argv[0] = 'episodekit'; main()"
PREP = ["--world-size", "2", "--workers", "2"]
TARGETS = (
    "meta/info.json",
    "meta/episodes/chunk-000/file-000.parquet",
    "data/chunk-000/file-000.parquet",
    "meta/speed_percentiles.jsonl",
    "meta/shard_plans/ws2_nw2.json",
)
INFO_VALUES = [
    "../../outside/{chunk_index}.parquet",
    "/etc/{chunk_index}",
    "data/{chunk_index:0>99999999}/{file_index}",
    "{chunk_index.__class__}",
    float("nan"),
    10**30,
    -1,
    None,
    [],
]
INFO_KEYS = ["data_path", "video_path", "fps", "total_frames", "chunks_size", "features"]

mutation = st.one_of(
    st.tuples(st.just("truncate"), st.sampled_from(TARGETS), st.floats(0.0, 0.99)),
    st.tuples(
        st.just("flip"),
        st.sampled_from(TARGETS),
        st.lists(st.tuples(st.floats(0, 0.999), st.integers(1, 255)), min_size=1, max_size=4),
    ),
    st.tuples(st.just("info"), st.sampled_from(INFO_KEYS), st.sampled_from(INFO_VALUES)),
    st.tuples(
        st.just("plan"),
        st.sampled_from(["count", "seed", "world_size", "bin_cost"]),
        st.sampled_from([10**12, float("nan"), -5, None]),
    ),
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    from episodekit.prepare import prepare
    from episodekit.sample import write_sample

    root = tmp_path_factory.mktemp("fuzz") / "root"
    write_sample(root, episodes=16, tasks=2, seed=41)
    assert prepare(str(root), world_sizes=[2], num_workers=2).ok
    return root


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def mutate(root: Path, m: tuple) -> None:
    kind = m[0]
    if kind in ("truncate", "flip"):
        path = root / m[1]
        data = bytearray(path.read_bytes())
        if kind == "truncate":
            data = data[: int(len(data) * m[2])]
        else:
            for pos, x in m[2]:
                data[int(pos * len(data))] ^= x
        path.write_bytes(bytes(data))
    elif kind == "info":
        info = json.loads((root / "meta/info.json").read_text())
        info[m[1]] = m[2]
        (root / "meta/info.json").write_text(json.dumps(info))
    else:
        path = root / "meta/shard_plans/ws2_nw2.json"
        doc = json.loads(path.read_text())
        if m[1] == "count":
            doc["items"]["count"] = m[2]
        else:
            doc[m[1]] = m[2]
        path.write_text(json.dumps(doc))


def run_loader(root: Path) -> None:
    from episodekit.loaders import EpisodeAwareSampler, FrameDataset, load_plan

    try:
        ds = FrameDataset(str(root), delta_timestamps={"action": [0.0, 0.1]})
        plan = load_plan(str(root), 2, 2)
        s = EpisodeAwareSampler(ds, plan=plan, rank=0, world_size=2)
        idx = s.epoch_indices(0)[:8]
        ds.get_batch(idx)
    except (DatasetError, EnvironmentProblem, ValueError):
        pass  # a clear, typed error is the expected outcome for a broken root


@settings(
    max_examples=8,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(m=mutation)
def test_fuzzed_root_never_tracebacks_or_escapes(prepared, m):
    with tempfile.TemporaryDirectory() as tmp:
        box = Path(tmp)
        (box / "outside").mkdir()
        (box / "outside/keep.txt").write_text("x")
        root = box / "root"
        shutil.copytree(prepared, root)
        mutate(root, m)
        before = {k: v for k, v in snapshot(box).items() if not k.startswith("root/")}
        for cmd in (["validate", root], ["prepare", root, *PREP, "--no-wait"]):
            proc = subprocess.run(
                [sys.executable, "-c", CLI, *map(str, cmd)],
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode in (0, 1, 2), (m, cmd, proc.returncode, proc.stderr[-2000:])
            assert "Traceback" not in proc.stderr, (m, cmd, proc.stderr[-2000:])
        run_loader(root)
        after = {k: v for k, v in snapshot(box).items() if not k.startswith("root/")}
        assert after == before, m
