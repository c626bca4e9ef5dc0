"""A corruption corpus made from datasets LeRobot wrote (tests/fixtures/lerobot): each case
damages a copy one way; ``validate`` must catch every one (exit 1, the named check among the
errors) and print JSON that parses; the clean copies pass. Also: ``--json`` prints valid JSON on
every exit path, and finding values of every numpy dtype go through ``validate --json``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-c", "from episodekit.cli import main; main()"]
DATA = "data/chunk-000/file-000.parquet"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
BIN = 5000  # LeRobot's quantile histogram bins


def validate_json(root: Path, *extra: str) -> tuple[int, dict, str]:
    r = subprocess.run(
        [*CLI, "validate", str(root), "--json", *extra], capture_output=True, text=True, timeout=300
    )
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    return r.returncode, json.loads(r.stdout), r.stderr


def edit_table(path: Path, fn) -> None:
    t = pq.read_table(path)
    pq.write_table(fn(t), path)


def set_column(t: pa.Table, name: str, values) -> pa.Table:
    i = t.column_names.index(name)
    return t.set_column(i, t.schema.field(i), pa.array(values, type=t.schema.field(i).type))


def edit_json(path: Path, fn) -> None:
    d = json.loads(path.read_text())
    fn(d)
    path.write_text(json.dumps(d, indent=4))


def edit_episode_stat(root: Path, feature: str, fn) -> None:
    """Apply ``fn(stats: dict[key, list of per-episode lists])`` to meta/episodes' stats columns."""

    def go(t):
        keys = ("min", "max", "mean", "q01", "q10", "q50", "q90", "q99")
        got = {k: t[f"stats/{feature}/{k}"].to_pylist() for k in keys}
        fn(got)
        for k in keys:
            t = set_column(t, f"stats/{feature}/{k}", got[k])
        return t

    edit_table(root / EPISODES, go)


def _truncate(root):
    p = root / DATA
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _q_swap(root):  # stats.json: q01 and q99 swapped in every dimension
    def fn(d):
        d["action"]["q01"], d["action"]["q99"] = d["action"]["q99"], d["action"]["q01"]

    edit_json(root / "meta/stats.json", fn)


def _mean_outside(root):
    def fn(d):
        d["observation.state"]["mean"][2] = d["observation.state"]["max"][2] + 0.5

    edit_json(root / "meta/stats.json", fn)


def _episode_q_order(root):  # one episode's q01 two bins above its q99
    def fn(s):
        w = (s["max"][5][0] - s["min"][5][0] + 2e-10) / BIN
        s["q01"][5][0] = s["q99"][5][0] + 2 * w

    edit_episode_stat(root, "action", fn)


def _total_frames(root):
    edit_json(root / "meta/info.json", lambda d: d.update(total_frames=d["total_frames"] + 7))


def _missing_data_file(root):
    (root / DATA).unlink()


def _episode_pointers(root):  # episode 4 points 10 frames too late
    def fn(t):
        frm = t["dataset_from_index"].to_pylist()
        frm[4] += 10
        return set_column(t, "dataset_from_index", frm)

    edit_table(root / EPISODES, fn)


def _index_gap(root):
    def fn(t):
        idx = t["index"].to_numpy().copy()
        idx[500:] += 1
        return set_column(t, "index", idx)

    edit_table(root / DATA, fn)


def _timestamp_jump(root):
    def fn(t):
        ts = t["timestamp"].to_numpy().copy()
        ts[301] += 1.0
        return set_column(t, "timestamp", ts)

    edit_table(root / DATA, fn)


def _length_wrong(root):
    def fn(t):
        n = t["length"].to_pylist()
        n[2] -= 3
        return set_column(t, "length", n)

    edit_table(root / EPISODES, fn)


def _unknown_task(root):  # frames of a task the tasks table does not have
    def fn(t):
        ti = t["task_index"].to_numpy().copy()
        ti[100:140] = 99
        return set_column(t, "task_index", ti)

    edit_table(root / DATA, fn)


def _missing_video(root):
    (root / "videos/observation.images.top/chunk-000/file-001.mp4").unlink()


def _top(root):
    return root / "meta/info.json", "observation.images.top"


def _video_shape(root):  # the shape says 128 rows, video.height (and the stream) 96
    path, key = _top(root)
    edit_json(path, lambda d: d["features"][key].update(shape=[128, 96, 3]))


def _video_channels(root):  # declared grayscale: video.channels and shape agree, the stream not
    path, key = _top(root)

    def fn(d):
        d["features"][key]["shape"][2] = 1
        d["features"][key]["info"]["video.channels"] = 1

    edit_json(path, fn)


def _state_names(root):  # two joints' names where fourteen are declared
    edit_json(
        root / "meta/info.json",
        lambda d: d["features"]["observation.state"].update(names=["left", "right"]),
    )


# name: (dataset, damage, a check that must be among the errors)
CASES = {
    "truncated_parquet": ("rec40", _truncate, "data."),
    "stats_q_swap": ("edited35", _q_swap, "stats.order"),
    "stats_mean_outside": ("rec40", _mean_outside, "stats.order"),
    "episode_stats_q_order": ("rec40", _episode_q_order, "stats.order"),
    "info_total_frames": ("edited35", _total_frames, "info."),
    "missing_data_file": ("rec40", _missing_data_file, ""),
    "episode_pointers": ("rec40", _episode_pointers, "episodes."),
    "index_gap": ("edited35", _index_gap, "data."),
    "timestamp_jump": ("rec40", _timestamp_jump, "data."),
    "episode_length": ("edited35", _length_wrong, ""),
    "unknown_task": ("rec40", _unknown_task, ""),
    "missing_video": ("vid24", _missing_video, "info.videos"),
    "video_shape": ("vid24", _video_shape, "info.video"),
    "video_channels": ("vid24", _video_channels, "video.channels"),
    "state_names": ("edited35", _state_names, "info.names"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_corruption_is_caught(case, tmp_path):
    name, damage, check = CASES[case]
    if name == "vid24":
        pytest.importorskip("av")
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    damage(root)
    code, doc, err = validate_json(root)
    assert code == 1 and doc["exit_code"] == 1 and not doc["ok"], (case, doc)
    errors = [f["check"] for f in doc["findings"] if f["severity"] == "error"]
    assert errors and any(c.startswith(check) for c in errors), (case, errors)


@pytest.mark.parametrize("name", ["rec40", "edited35", "vid24"])
def test_clean_copies_pass(name, tmp_path):
    root = tmp_path / name
    shutil.copytree(FIXTURES / name, root)
    code, doc, _ = validate_json(root, "--checks", "info,tasks,episodes,data,stats")
    assert code == 0 and doc["ok"] and doc["counts"]["error"] == 0, doc["findings"]


# --------------------------------------------------------------------------------------------
# the stats order tolerance: LeRobot's rounding passes, one bin more does not


def _stats_findings(root: Path) -> list[str]:
    from episodekit.validate.raw import read_raw
    from episodekit.validate.stats import check_stats

    return [f.check for f in check_stats(read_raw(str(root)))]


@pytest.mark.parametrize("shift, caught", [(0.5, False), (2.0, True)], ids=["half-bin", "two-bins"])
def test_quantile_outside_max_by_bins(tmp_path, shift, caught):
    root = tmp_path / "r"
    shutil.copytree(FIXTURES / "rec40", root)

    def fn(s):
        for e in range(len(s["q99"])):
            w = (s["max"][e][1] - s["min"][e][1] + 2e-10) / BIN
            s["q99"][e][1] = s["max"][e][1] + shift * w

    edit_episode_stat(root, "observation.state", fn)
    assert ("stats.order" in _stats_findings(root)) == caught


@pytest.mark.parametrize("excess, caught", [(0.5, False), (3.0, True)], ids=["inside", "outside"])
def test_mean_outside_min_max_by_more_than_the_tolerance(tmp_path, excess, caught):
    from episodekit.validate.stats import order_tolerance

    root = tmp_path / "r"
    shutil.copytree(FIXTURES / "rec40", root)

    def fn(d):
        got = {k: np.asarray(d["action"][k], dtype=np.float64) for k in ("min", "max")}
        tol = order_tolerance(got)
        d["action"]["mean"][0] = float(got["min"][0] - excess * tol[0])

    edit_json(root / "meta/stats.json", fn)
    assert ("stats.order" in _stats_findings(root)) == caught


# --------------------------------------------------------------------------------------------
# --json on every exit path, and values of every numpy dtype


def test_json_on_every_exit_path(tmp_path):
    root = tmp_path / "r"
    shutil.copytree(FIXTURES / "rec40", root)
    code, doc, _ = validate_json(root)
    assert code == 0 == doc["exit_code"]
    code, doc, _ = validate_json(root, "--fail-on", "warning")  # layout warnings fail
    assert code == 1 == doc["exit_code"]
    _timestamp_jump(root)
    code, doc, _ = validate_json(root)
    assert code == 1 == doc["exit_code"]
    code, doc, err = validate_json(tmp_path / "nowhere")
    assert code == 2 == doc["exit_code"] and doc["error"] and err.count("\n") == 1
    code, doc, err = validate_json(root, "--checks", "bogus")
    assert code == 2 == doc["exit_code"] and "bogus" in doc["error"]
    (root / "meta/info.json").write_text("{not json")
    code, doc, _ = validate_json(root)
    assert code == 1 == doc["exit_code"]  # the data is at fault (docs/exit-codes.md)


DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.longdouble, np.complex64, np.complex128,
    np.dtype("datetime64[s]"), np.dtype("timedelta64[ms]"), np.dtype("U3"), np.dtype("S3"),
]  # fmt: skip


@pytest.mark.filterwarnings("error::numpy.exceptions.ComplexWarning")  # no value cast lossily
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arr=st.sampled_from(DTYPES).flatmap(
        lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=2, max_side=3))
    ),
    exit_code=st.sampled_from([0, 1]),
)
def test_validate_json_carries_values_of_every_numpy_dtype(arr, exit_code):
    """A finding whose value/details are numpy values of any dtype (NaN, inf included) prints
    valid JSON through ``validate --json``; a non-finite value is null and stays in the text."""
    import episodekit.validate.runner as runner
    from episodekit.cli import main
    from episodekit.validate.raw import ERROR, WARNING, Finding

    scalar = arr.reshape(-1)[0] if arr.size else arr
    severity = ERROR if exit_code else WARNING
    finding = Finding(
        "quality.jump", severity, "spike", "f", 1, "action", np.int64(2),
        value=scalar, details={"signal": arr, "score": scalar, np.int32(3): arr},
    )  # fmt: skip
    real = runner.validate

    def fake(root, **kwargs):
        report = runner.Report(root=root, findings=[finding], strict=kwargs.get("strict", False))
        return report

    runner.validate = fake
    try:
        res = CliRunner().invoke(main, ["validate", str(FIXTURES / "rec40"), "--json"])
    finally:
        runner.validate = real
    assert res.exit_code == exit_code, res.output
    doc = json.loads(res.stdout if hasattr(res, "stdout") else res.output)
    f = doc["findings"][0]
    if f["value"] is None and np.asarray(scalar).dtype.kind in "fc" and np.asarray(scalar).size:
        assert any(t in f["message"] for t in ("nan", "inf")), f
