"""LeRobot main's language columns (issue 38) through every loader, on a LeRobot-written root
with both columns added as ``lerobot-annotate`` writes them (``fixtures/lerobot/lang5``): every
sample's value equals the parquet row's (lists of dicts, as LeRobot returns them), a batch holds
a list, a window on them is one clear error, and ``validate`` checks them."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.loaders import (
    ElasticLoader,
    EpisodeAwareSampler,
    FrameDataset,
    ShardedLoader,
    load_canonical_plan,
    load_plan,
)
from episodekit.metadata.mixture.plan import ensure_mixture_plans
from episodekit.metadata.plans.build import ensure_plans
from episodekit.metadata.plans.canonical import ensure_canonical_plan

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "lang5"
LANG = ("language_persistent", "language_events")
HAS_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    r = tmp_path_factory.mktemp("lang") / "lang5"
    shutil.copytree(FIXTURE, r)
    ensure_plans(str(r), [1], 2, locality="rowgroup")
    ensure_canonical_plan(str(r), 2, locality="rowgroup")
    return r


@pytest.fixture(scope="module")
def rows(root):
    """The parquet's rows by global index: {index: {column: value}}, as pyarrow reads them."""
    t = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    index = t.column("index").to_pylist()
    return {c: dict(zip(index, t.column(c).to_pylist())) for c in LANG}


def check_batch(batch, rows, n=None):
    for c in LANG:
        assert isinstance(batch[c], list), c  # a batch holds a list (of lists of dicts)
        want = [rows[c][i] for i in np.asarray(batch["index"]).tolist()]
        assert batch[c] == want, c
        if n is not None:
            assert len(batch[c]) == n


def test_fixture_is_what_lerobot_main_writes():
    info = json.loads((FIXTURE / "meta" / "info.json").read_text())
    for c in LANG:
        assert info["features"][c] == {"dtype": "language", "shape": [1], "names": None}
    t = pq.read_table(FIXTURE / "data" / "chunk-000" / "file-000.parquet")
    persistent = t.schema.field("language_persistent").type.value_type
    events = t.schema.field("language_events").type.value_type
    assert [persistent.field(i).name for i in range(persistent.num_fields)] == [
        "role", "content", "style", "timestamp", "camera", "tool_calls"
    ]  # fmt: skip
    assert [events.field(i).name for i in range(events.num_fields)] == [
        "role", "content", "style", "camera", "tool_calls"
    ]  # fmt: skip
    ev = t.column("language_events").to_pylist()
    assert sum(1 for x in ev if x) < len(ev) / 2  # empty except where an event fires
    assert any(r["style"] == "vqa" and r["camera"] for x in ev for r in x)


def test_frame_dataset_items_and_batches_equal_the_parquet(root, rows):
    ds = FrameDataset(root, video_backend=None)
    for i in range(len(ds)):
        item = ds[i]
        for c in LANG:
            assert item[c] == rows[c][int(item["index"])], (c, i)
            assert isinstance(item[c], list)
    check_batch(ds.get_batch(np.arange(len(ds))[::-1]), rows, len(ds))
    sampler = EpisodeAwareSampler(ds, seed=1)
    check_batch(ds.get_batch(sampler.epoch_indices(0)[:17]), rows, 17)


def test_frame_store_root_reads_language_from_parquet(root, rows, tmp_path):
    from episodekit.prep.frames import build_frame_store

    build_frame_store(root, store=tmp_path / "store")
    ds = FrameDataset(root, store=tmp_path / "store", video_backend=None, delta_timestamps={
        "action": [0.0, 1 / 30]})  # fmt: skip
    assert ds.store is not None and "language_events" not in ds.store.columns
    check_batch(ds.get_batch([0, 5, 40, 3]), rows, 4)
    item = ds[7]
    assert item["language_events"] == rows["language_events"][int(item["index"])]


def test_stream_elastic_and_mixture_loaders(root, rows, tmp_path):
    plan = load_plan(str(root), 1, 2)
    for w in (0, 1):
        for batch in ShardedLoader(root, plan, 0, 1, w, 2, 8, video_backend=None):
            check_batch(batch, rows)
    sample = next(iter(ShardedLoader(root, plan, 0, 1, 0, 2, video_backend=None)))
    assert sample["language_persistent"] == rows["language_persistent"][int(sample["index"])]
    canon = load_canonical_plan(str(root))
    for batch in ElasticLoader(root, canon, micro_batch=3, video_backend=None):
        check_batch(batch, rows)
    other = tmp_path / "other"
    shutil.copytree(root, other)
    spec = {"sources": [{"root": str(root), "weight": 1}, {"root": str(other), "weight": 1}]}
    ensure_mixture_plans(spec, tmp_path / "mix", [1], 1)
    mplan = load_plan(tmp_path / "mix", 1, 1)
    mds = FrameDataset(mplan, video_backend=None)
    batch = mds.get_batch([0, len(mds) - 1, 3])  # rows of both sources
    check_batch(batch, rows, 3)
    assert mds[len(mds) - 1]["language_events"] == rows["language_events"][len(mds) // 2 - 1]
    for batch in ShardedLoader(str(tmp_path / "mix"), mplan, 0, 1, 0, 1, 16, video_backend=None):
        check_batch(batch, rows)


def test_a_window_on_a_language_column_is_one_clear_error(root):
    with pytest.raises(ValueError, match=r"language_events.*language column.*never windowed"):
        FrameDataset(root, delta_timestamps={"language_events": [0.0, 1 / 30]})
    plan = load_plan(str(root), 1, 2)
    with pytest.raises(ValueError, match=r"language_persistent.*language column"):
        ShardedLoader(root, plan, 0, 1, 0, 2, 8, delta_timestamps={"language_persistent": [0.0]})


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_torch_adapters_and_make_loader(root, rows):
    from torch.utils.data import DataLoader

    from episodekit.loaders.torch import TorchFrameDataset, collate, make_loader

    ds = FrameDataset(root, video_backend=None)
    loader = DataLoader(TorchFrameDataset(ds), batch_size=7, collate_fn=collate)
    for batch in loader:
        check_batch({**batch, "index": batch["index"].numpy()}, rows)
    plan = load_plan(str(root), 1, 2)
    for workers in (0, 2):
        with make_loader(root, plan, 8, workers, copy=True, video_backend=None) as ml:
            got = list(ml)
        assert len(got) and all(
            b["language_events"] == [rows["language_events"][i] for i in b["index"].tolist()]
            for b in got
        )


def test_other_nested_and_string_columns_come_back_as_python_objects(make_sample, tmp_path):
    root = make_sample(episodes=2, seed=3, mean_length=10)
    path = next((root / "data").glob("*/*.parquet"))
    t = pq.read_table(path)
    n = t.num_rows
    tags = pa.array([[f"t{i}"] * (i % 3) for i in range(n)])  # list<string>, unequal lengths
    notes = pa.array([{"who": "op", "n": i} for i in range(n)])  # a struct
    t = t.append_column("tags", tags).append_column("notes", notes)
    pq.write_table(t, path)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["tags"] = {"dtype": "string", "shape": [1], "names": None}
    info["features"]["notes"] = {"dtype": "struct", "shape": [1], "names": None}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    ds = FrameDataset(root, store=None)
    assert ds[4]["tags"] == ["t4"] and ds[4]["notes"] == {"who": "op", "n": 4}
    batch = ds.get_batch([5, 0])
    assert list(batch["tags"]) == [["t5", "t5"], []]  # a string feature: an object array, as before
    assert batch["notes"] == [{"who": "op", "n": 5}, {"who": "op", "n": 0}]  # nested: a list


def _rewrite_events(root: Path, edit) -> None:
    """Rewrite the data file with ``edit(events rows)`` applied (inferred types, as LeRobot)."""
    path = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(path)
    events = edit(t.column("language_events").to_pylist())
    i = t.column_names.index("language_events")
    pq.write_table(t.set_column(i, "language_events", pa.array(events)), path)


def _validate(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "episodekit.cli", "validate", str(root), "--checks", "data"],
        capture_output=True,
        text=True,
    )


def test_validate_accepts_lerobot_language_and_fails_a_vqa_event_without_camera(tmp_path):
    root = tmp_path / "lang5"
    shutil.copytree(FIXTURE, root)
    ok = _validate(root)
    assert ok.returncode == 0, ok.stdout + ok.stderr

    def drop_camera(events):
        for frame in events:
            for r in frame:
                if r["style"] == "vqa" and r["camera"] == "observation.images.top":
                    r["camera"] = None
                    return events
        raise AssertionError("no vqa event")

    _rewrite_events(root, drop_camera)
    bad = _validate(root)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "data.language" in bad.stdout and "vqa/trace row without camera" in bad.stdout


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(style="dance"), "unknown style 'dance'"),
        (lambda r: r.update(camera="observation.images.side"), "'observation.images.side' is not"),
        (lambda r: r.update(style="interjection"), "camera set on a style that is not view"),
    ],
)
def test_validate_language_violations(tmp_path, edit, message):
    from episodekit.validate import validate

    root = tmp_path / "lang5"
    shutil.copytree(FIXTURE, root)

    def apply(events):
        for frame in events:
            for r in frame:
                if r["style"] == "vqa":
                    edit(r)
                    return events
        raise AssertionError("no vqa event")

    _rewrite_events(root, apply)
    found = [f for f in validate(str(root), checks="data").findings if f.check == "data.language"]
    assert found and all(f.severity == "error" for f in found)
    assert any(message in f.message for f in found), [f.message for f in found]


def test_validate_persistent_timestamp_outside_its_episode(tmp_path):
    from episodekit.validate import validate

    root = tmp_path / "lang5"
    shutil.copytree(FIXTURE, root)
    path = root / "data" / "chunk-000" / "file-000.parquet"
    t = pq.read_table(path)
    persistent = t.column("language_persistent").to_pylist()
    ep = t.column("episode_index").to_pylist()
    for k, e in enumerate(ep):
        if e == 1:
            persistent[k] = [dict(r, timestamp=99.0) if r["style"] == "motion" else r
                             for r in persistent[k]]  # fmt: skip
    i = t.column_names.index("language_persistent")
    pq.write_table(t.set_column(i, "language_persistent", pa.array(persistent)), path)
    found = [f for f in validate(str(root), checks="data").findings if f.check == "data.language"]
    assert [(f.episode, f.message) for f in found] == [
        (1, f"language_persistent: timestamp outside its episode ({ep.count(1)} rows)")
    ]
