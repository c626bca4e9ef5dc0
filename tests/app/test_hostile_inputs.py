"""Hostile tests of what the dataset writers read (issue 41, items 3, 4, 5), as a user runs the
CLI, on copies of the LeRobot-written fixtures: a rerun says "nothing to do" only when every
input the output depends on is unchanged, empty or foreign selections are refused, and the
output's stats are valid (v2.1 merged with v3.0; image stats of shape [3, 1, 1])."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.app.hostile import cli, copy_fixture, ok, one_error, tree, written

# -- 3. rerun keys cover every input ---------------------------------------------------------


def _edit(src: Path, out: Path) -> dict:
    return written(cli("edit", src, "--out", out, "--drop-episodes", "0", "--json"))


def _keep_times(path: Path):
    st = path.stat()
    return lambda: os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_rerun_after_metadata_stats_writes_again(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    out = tmp_path / "out"
    assert _edit(src, out)["status"] == "written"
    assert _edit(src, out)["status"] == "unchanged"
    ok(cli("metadata", "stats", src))
    assert _edit(src, out)["status"] == "written"
    got = json.loads((out / "meta/stats.json").read_text())
    assert got["action"]["mean"]  # rewritten from the recomputed per-episode stats


def test_rerun_after_a_same_size_stats_json_change_writes_again(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    out = tmp_path / "out"
    _edit(src, out)
    path = src / "meta/stats.json"
    restore = _keep_times(path)
    text = path.read_text()
    i = text.index('"min"')
    path.write_text(text[:i] + '"MIN"' + text[i + 5 :])  # same size, same mtime
    restore()
    assert _edit(src, out)["status"] == "written"


def test_rerun_after_a_same_size_tasks_change_writes_again(tmp_path):
    """Two tasks swap their task_index in meta/tasks.parquet (same mtime; the
    episodes fingerprint, which names tasks by string, does not change)."""
    src = copy_fixture("rec40", tmp_path / "src")
    out = tmp_path / "out"
    _edit(src, out)
    path = src / "meta/tasks.parquet"
    restore = _keep_times(path)
    t = pq.read_table(path)
    col = next(c for c in ("task", "__index_level_0__") if c in t.column_names)
    names = t[col].to_pylist()
    names[0], names[1] = names[1], names[0]
    pq.write_table(t.set_column(t.schema.get_field_index(col), col, pa.array(names)), path)
    restore()
    assert _edit(src, out)["status"] == "written"


def test_rerun_after_a_video_file_changed_writes_again(tmp_path):
    src = copy_fixture("vid24", tmp_path / "src")
    out = tmp_path / "out"
    assert _edit(src, out)["status"] == "written"
    mp4 = sorted((src / "videos").rglob("*.mp4"))[0]
    restore = _keep_times(mp4)
    data = bytearray(mp4.read_bytes())
    mp4.write_bytes(bytes(data))  # rewritten in place (as `prep videos` does), same size
    restore()
    assert _edit(src, out)["status"] == "written"
    assert _edit(src, out)["status"] == "unchanged"


# -- 4. selections that are empty or of another dataset --------------------------------------


@pytest.mark.parametrize("option", ["--keep-episodes", "--drop-episodes"])
def test_an_empty_episode_list_is_refused(tmp_path, option):
    src = copy_fixture("rec40", tmp_path / "src")
    line = one_error(cli("edit", src, "--out", tmp_path / "o", option, ""))
    assert option in line
    assert not (tmp_path / "o").exists()


def test_a_report_of_another_dataset_is_refused(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    other = copy_fixture("edited35", tmp_path / "other")
    checks = "quality.duplicate,quality.frozen"
    for root, name in ((other, "other.json"), (src, "own.json")):
        proc = cli("validate", root, "--json", "--checks", checks)
        assert proc.returncode in (0, 1), proc.stderr
        (tmp_path / name).write_text(proc.stdout)
    before = tree(src)
    line = one_error(
        cli("edit", src, "--out", tmp_path / "o", "--drop-flagged", checks, "--flags-from",
            tmp_path / "other.json")
    )  # fmt: skip
    assert "other.json" in line
    assert not (tmp_path / "o").exists() and tree(src) == before
    ok(cli("edit", src, "--out", tmp_path / "o", "--drop-flagged", checks, "--flags-from",
           tmp_path / "own.json"))  # fmt: skip
    doc = json.loads((tmp_path / "own.json").read_text())
    doc.pop("fingerprint", None)  # a report that does not say which episodes it judged
    (tmp_path / "old.json").write_text(json.dumps(doc))
    one_error(
        cli("edit", src, "--out", tmp_path / "o2", "--drop-flagged", checks, "--flags-from",
            tmp_path / "old.json")
    )  # fmt: skip


def test_plans_refuse_a_report_of_another_dataset(tmp_path):
    src = copy_fixture("rec40", tmp_path / "src")
    other = copy_fixture("edited35", tmp_path / "other")
    proc = cli("validate", other, "--json", "--checks", "quality.frozen")
    (tmp_path / "other.json").write_text(proc.stdout)
    one_error(
        cli("metadata", "plan", src, "--world-size", "1", "--workers", "1",
            "--exclude-flagged", "quality.frozen", "--flags-from", tmp_path / "other.json")
    )  # fmt: skip


# -- 5. valid stats: v2.1 merged with v3.0, image stats of shape [3, 1, 1] ------------------


def test_merge_of_v30_and_v21_gives_valid_stats(tmp_path):
    v21 = copy_fixture("v21vid8", tmp_path / "v21")
    ok(cli("convert", v21, "--out", tmp_path / "v30"))
    ok(cli("merge", tmp_path / "v30", v21, "--out", tmp_path / "m"))
    proc = cli("validate", tmp_path / "m", "--json")
    findings = json.loads(proc.stdout)["findings"]
    errors = [f for f in findings if f["severity"] == "error"]
    assert proc.returncode == 0 and not errors, errors[:3]


def test_image_stats_keep_lerobots_shape_through_edit_and_merge(tmp_path):
    sample = tmp_path / "s"
    ok(cli("sample", sample, "--episodes", "6", "--videos", "1", "--video-size", "16x16"))
    ok(cli("edit", sample, "--out", tmp_path / "e", "--drop-episodes", "0"))
    ok(cli("merge", sample, tmp_path / "e", "--out", tmp_path / "m"))
    ok(cli("validate", tmp_path / "m", "--deep", "--checks", "stats,info,episodes"))
    for root in (sample, tmp_path / "e", tmp_path / "m"):
        stats = json.loads((root / "meta/stats.json").read_text())
        assert [len(stats["observation.images.cam0"]["mean"])] == [3]
        for k in ("min", "max", "mean", "std"):
            shape = _shape(stats["observation.images.cam0"][k])
            assert shape == (3, 1, 1), (root.name, k, shape)
        eps = pq.read_table(next((root / "meta/episodes").rglob("*.parquet")))
        assert _shape(eps["stats/observation.images.cam0/mean"][0].as_py()) == (3, 1, 1)


def test_image_stats_of_lerobots_videos_keep_their_shape(tmp_path):
    src = copy_fixture("vid24", tmp_path / "src")
    ok(cli("edit", src, "--out", tmp_path / "e", "--drop-episodes", "0"))
    stats = json.loads((tmp_path / "e/meta/stats.json").read_text())
    assert _shape(stats["observation.images.top"]["mean"]) == (3, 1, 1)


def _shape(x) -> tuple:
    import numpy as np

    return np.asarray(x).shape
