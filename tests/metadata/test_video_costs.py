"""The ``decode`` cost model: measured seconds per frame per mp4, stored with the settings, never
re-measured when fresh, checked by validate from the stored timings, usable by plans."""

from __future__ import annotations

import numpy as np
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.metadata import costs as costs_mod
from episodekit.metadata.costs import costs_meta, ensure_costs, read_costs, write_costs
from episodekit.metadata.plans.build import ensure_plans
from episodekit.validate.runner import validate

pytest.importorskip("av")

SPEC = dict(episodes=6, tasks=2, seed=5, mean_length=12, videos=2, video_files_size_in_mb=0.006)


def test_decode_costs_are_length_times_measured_seconds_per_frame(make_sample, monkeypatch):
    root = make_sample(**SPEC)
    table, changed = ensure_costs(str(root), "decode")
    assert changed
    meta = costs_meta(table)
    assert meta["model"] == "decode"
    settings = meta["decode"]
    assert settings["backend"] == "pyav" and settings["sample_frames"] > 0
    spf = settings["seconds_per_frame"]
    mp4s = {p.relative_to(root).as_posix() for p in root.glob("videos/*/*/*.mp4")}
    assert set(spf) == mp4s and all(v > 0 for v in spf.values())
    ds = open_dataset(str(root))
    expected = np.zeros(ds.num_episodes)
    for key in ds.video_keys:
        for row in range(ds.num_episodes):
            rel = ds.video_path(
                key,
                int(ds.column(f"videos/{key}/chunk_index")[row]),
                int(ds.column(f"videos/{key}/file_index")[row]),
            )
            expected[row] += ds.column("length")[row] * spf[rel]
    np.testing.assert_allclose(table["cost"].to_numpy(), expected, rtol=1e-12)

    # Fresh: read back, never re-measured.
    def boom(*a, **k):
        raise AssertionError("re-measured a fresh decode cost table")

    monkeypatch.setattr(costs_mod, "decode_seconds", boom)
    again, changed = ensure_costs(str(root), "decode")
    assert not changed and again.equals(table)
    # validate checks the stored costs against the stored timings (no re-measurement either).
    assert [f for f in validate(str(root), checks="costs").findings] == []
    # Plans balance on it.
    [(path, plan, written)] = ensure_plans(str(root), [2], 1, cost="decode")
    assert plan["cost_model"] == "decode" and written
    assert [f for f in validate(str(root), checks="plans").findings] == []


def test_tampered_decode_cost_is_caught(make_sample):
    root = make_sample(**SPEC)
    table, _ = ensure_costs(str(root), "decode")
    cost = table["cost"].to_numpy().copy()
    cost[2] *= 3
    tampered = table.set_column(
        table.column_names.index("cost"), "cost", __import__("pyarrow").array(cost)
    ).replace_schema_metadata(table.schema.metadata)
    write_costs(str(root), "decode", tampered)
    found = validate(str(root), checks="costs").findings
    assert [(f.check, f.episode) for f in found] == [("costs.content", 2)]
    assert read_costs(str(root)) is not None


def test_decode_model_needs_videos(make_sample):
    root = make_sample(episodes=4, tasks=2)
    with pytest.raises(ValueError, match="video"):
        ensure_costs(str(root), "decode")
