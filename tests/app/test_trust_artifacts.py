"""Artifacts are untrusted input (they come from hubs): a plan's items carry a digest checked on
load; counts are bounded by the dataset before anything is allocated or inflated (a zlib bomb
costs nothing); missing fields and NaN give one error naming the file and the field; a speed
file larger than the dataset's tasks can need is refused before parsing."""

from __future__ import annotations

import base64
import json
import sys
import zlib
from pathlib import Path

import pytest

from episodekit.core.dataset import open_dataset
from episodekit.metadata.plans.load import load_plan
from episodekit.metadata.plans.plan_file import PlanError
from episodekit.metadata.speed import max_speed_bytes, read_speed_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import PLAN, SAMPLE_SPEC, SPEED, write_artifacts  # noqa: E402


@pytest.fixture
def root(make_sample) -> Path:
    r = make_sample(**SAMPLE_SPEC)
    write_artifacts(r)
    return r


def edit_plan(root: Path, fn) -> None:
    doc = json.loads((root / PLAN).read_text())
    fn(doc)
    (root / PLAN).write_text(json.dumps(doc))


def load(root: Path):
    return load_plan(str(root), 2, 2)


def test_clean_plan_loads(root):
    plan = load(root)
    assert len(plan.items) and plan.world_size == 2


def test_edited_items_refused_by_digest(root):
    def fn(doc):
        ep = doc["items"]["episode_index"]
        ep[0], ep[-1] = ep[-1], ep[0]  # two ranks would read the same episode

    edit_plan(root, fn)
    with pytest.raises(PlanError, match=r"ws2_nw2.json: items.digest does not match"):
        load(root)


def test_huge_count_refused_before_allocation(root):
    edit_plan(root, lambda doc: doc["items"].__setitem__("count", 10**12))
    with pytest.raises(PlanError, match=r"ws2_nw2.json: field 'items.count' is 1000000000000"):
        load(root)


def test_zlib_bomb_inflates_no_further_than_the_count(root):
    bomb = base64.b64encode(zlib.compress(b"\0" * (256 << 20), 9)).decode()  # 256 MiB -> ~250 KB

    def fn(doc):
        doc["items"]["episode_index"] = bomb

    edit_plan(root, fn)
    assert (root / PLAN).stat().st_size < 2 << 20
    with pytest.raises(PlanError, match="does not inflate to items.count values"):
        load(root)


@pytest.mark.parametrize("field", ["seed", "world_size", "bin_offsets", "fingerprint"])
def test_missing_field_named(root, field):
    edit_plan(root, lambda doc: doc.pop(field))
    with pytest.raises(PlanError, match=rf"ws2_nw2.json: .*field '{field}' is missing"):
        load(root)


def test_missing_item_column_named(root):
    edit_plan(root, lambda doc: doc["items"].pop("end"))
    with pytest.raises(PlanError, match=r"ws2_nw2.json: .*field 'end' is missing"):
        load(root)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("bin_cost", [float("nan")] * 4, "NaN"),
        ("samples_per_worker", float("nan"), "must be int"),
        ("seed", -1, "must be >= 0"),
        ("num_workers", True, "must be int"),
        ("balance", None, "must be dict"),
    ],
)
def test_bad_values_named(root, field, value, match):
    edit_plan(root, lambda doc: doc.__setitem__(field, value))
    with pytest.raises(PlanError, match=rf"ws2_nw2.json: field '{field}' .*{match}"):
        load(root)


def test_speed_file_larger_than_tasks_refused_before_parsing(root):
    ds = open_dataset(str(root))
    limit = max_speed_bytes(ds)
    assert limit < 200_000  # 3 tasks
    rows = (root / SPEED).read_bytes()
    (root / SPEED).write_bytes(rows + b"\n" * (limit + 1))
    with pytest.raises(Exception, match=r"speed_percentiles.jsonl: \d+ bytes is more than"):
        read_speed_file(ds)
