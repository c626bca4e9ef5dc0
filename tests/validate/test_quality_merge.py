"""The quality.* pass folds each data file's summaries into the merged ones as they arrive, in
whatever order the files finish (with Ray: completion order), and drops them: the merged
summaries and every finding are the same whatever that order; problems seeded in different
files are each reported against their own file and episode (a duplicate across two files too);
a file whose feature is ragged keeps NaN rows wherever it arrives (first, middle, last); and
``executor="ray"`` gives exactly the threaded findings."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from episodekit.validate import quality as q
from episodekit.validate.quality import scan as qscan
from episodekit.validate.raw import read_raw

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # corruptions.py
from corruptions import (  # noqa: E402
    QUALITY_SPEC,
    _matrix_of,
    corrupt_action_wrong_length,
    edit_signal,
    rows_of,
)

SPEC = {**QUALITY_SPEC, "data_files_size_in_mb": 0.3}  # 80 episodes in 6 data files


def _seeded(make_sample) -> tuple[Path, list[tuple[str, int, str]]]:
    """A duplicate across two data files, a frozen action and a spike, each in a data file of
    its own: (check, episode, file) of each."""
    root = make_sample(**SPEC)
    raw = read_raw(str(root))
    eps = raw.episodes["episode_index"].to_pylist()
    files = dict(zip(eps, raw.episodes["data_file"].to_pylist()))
    length = dict(zip(eps, raw.episodes["length"].to_pylist()))
    src, dup = next(
        (i, k)
        for i in eps
        for k in eps
        if i < k and length[i] == length[k] and files[i] != files[k]
    )
    t = pq.read_table(root / files[src])
    for col in ("action", "observation.state"):
        x = _matrix_of(t, col)[rows_of(t, src)]
        edit_signal(root, dup, col, lambda v, x=x: v.__setitem__(slice(None), x), files[dup])
    used = {files[src], files[dup]}
    frozen = next(e for e in eps if files[e] not in used)
    edit_signal(root, frozen, "action", lambda v: v.__setitem__(slice(None), v[0]), files[frozen])
    used.add(files[frozen])
    spike = next(e for e in eps if files[e] not in used)
    edit_signal(root, spike, "action", lambda v: v.__setitem__((10, 3), 1000.0), files[spike])
    return root, [
        ("quality.duplicate", dup, files[dup]),
        ("quality.frozen", frozen, files[frozen]),
        ("quality.jump", spike, files[spike]),
    ]


def _in_order(order: list[int], monkeypatch) -> None:
    """Make the per-file pass hand its results back in ``order`` (positions of the files)."""
    original = qscan._scan_threads

    def reordered(*args, **kwargs):
        got = dict(original(*args, **kwargs))
        for i in order:
            yield i, got.pop(i)
        assert not got

    monkeypatch.setattr(qscan, "_scan_threads", reordered)


def _merged(raw, rels: list[str]) -> q.Merged:
    return qscan.scan_files(raw, rels, q.quality_features(raw), dict(q.DEFAULTS), 1, "local")


def _assert_same(a: q.Merged, b: q.Merged) -> None:
    for key in ("episodes", "rows", "file", "ts_drops", "ts_missing", "ts_maxstep", "ts_interval"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
    assert a.files == b.files and a.failed == b.failed and a.scanned == b.scanned
    assert sorted(a.features) == sorted(b.features)
    for name, cols in a.features.items():
        assert sorted(cols) == sorted(b.features[name])
        for key, x in cols.items():
            assert x.dtype == b.features[name][key].dtype, (name, key)
            np.testing.assert_array_equal(x, b.features[name][key], err_msg=f"{name}.{key}")
        for key, x in a.scales[name].items():
            np.testing.assert_array_equal(x, b.scales[name][key], err_msg=f"{name} {key}")


def test_findings_and_merge_do_not_depend_on_the_order_files_arrive_in(make_sample, monkeypatch):
    root, seeded = _seeded(make_sample)
    raw = read_raw(str(root))
    rels = raw.data_files()
    assert len(rels) >= 5
    want = q.check_quality(raw, rels, threads=1)
    for check, episode, file in seeded:
        assert [f for f in want if (f.check, f.episode, f.file) == (check, episode, file)], check
    dup = next(f for f in want if f.check == "quality.duplicate")
    src = dup.details["duplicate_of"]
    assert raw.episodes["data_file"][src].as_py() != dup.file  # the pair spans two files
    in_order = _merged(raw, rels)
    assert in_order.file.dtype == np.int32 and len(in_order.episodes) == raw.episodes.num_rows
    assert [in_order.files[i] for i in in_order.file] == raw.episodes["data_file"].to_pylist()
    for order in (
        list(range(len(rels)))[::-1],
        list(np.random.default_rng(3).permutation(len(rels))),
    ):
        _in_order([int(i) for i in order], monkeypatch)
        _assert_same(_merged(raw, rels), in_order)
        got = q.check_quality(raw, rels, threads=1)
        assert [f.to_dict() for f in got] == [f.to_dict() for f in want]
    # Threads (completion order) too.
    monkeypatch.undo()
    assert [f.to_dict() for f in q.check_quality(raw, rels, threads=3)] == [
        f.to_dict() for f in want
    ]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_ragged_feature_keeps_nan_rows_wherever_its_file_arrives(make_sample, monkeypatch, where):
    root = make_sample(**SPEC)
    ragged = corrupt_action_wrong_length(root).file
    raw = read_raw(str(root))
    rels = raw.data_files()
    in_order = _merged(raw, rels)
    k = rels.index(ragged)
    rest = [i for i in range(len(rels)) if i != k]
    at = {"first": 0, "middle": len(rest) // 2, "last": len(rest)}[where]
    _in_order(rest[:at] + [k] + rest[at:], monkeypatch)
    got = _merged(raw, rels)
    _assert_same(got, in_order)
    mins = got.features["action"]["mins"]
    assert mins.dtype == np.float64  # NaN rows widen the column, as concatenating did
    own = got.file == k
    assert own.any() and np.isnan(mins[own]).all() and np.isfinite(mins[~own]).all()
    assert np.isfinite(got.features["observation.state"]["mins"]).all()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_executor_gives_the_threaded_findings(make_sample):
    root, seeded = _seeded(make_sample)
    raw = read_raw(str(root))
    rels = raw.data_files()
    want = [f.to_dict() for f in q.check_quality(raw, rels, threads=2)]
    assert {check for check, _, _ in seeded} <= {f["check"] for f in want}
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        got = [f.to_dict() for f in q.check_quality(raw, rels, executor="ray")]
    finally:
        ray.shutdown()
    assert got == want
