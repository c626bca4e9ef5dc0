"""``edit --drop-frames/--keep-frames/--trim-idle`` on datasets LeRobot wrote (rec40, edited35):
the named frames are gone and nothing else, the cut episodes keep their place with
``frame_index`` and ``timestamp`` renumbered, every other value equals the source's, stats are
recomputed from the kept rows, reruns are no-ops, and every bad input is one line, exit 2."""

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

from episodekit.core.dataset import open_dataset
from episodekit.writers.edit import EditSpec, edit
from episodekit.writers.frames import find_idle, kept_ranges, parse_frame_spec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
CLI = [sys.executable, "-m", "episodekit.cli"]
RENUMBERED = ("index", "frame_index", "timestamp")
DROP = {3: (11, 21), 7: (0, 5), 9: (40, 47)}  # episode: [start, end) dropped
SPEC = "3:11-20,7:0-4,9:40-46"


def rows(root: Path) -> pa.Table:
    ds = open_dataset(str(root))
    return pa.concat_tables(pq.read_table(ds.join(f)) for f in ds.data_files)


def kept_mask(table: pa.Table, drop: dict[int, tuple[int, int]]) -> np.ndarray:
    ep, fi = table["episode_index"].to_numpy(), table["frame_index"].to_numpy()
    keep = np.ones(table.num_rows, dtype=bool)
    for e, (a, b) in drop.items():
        keep &= ~((ep == e) & (fi >= a) & (fi < b))
    return keep


@pytest.fixture(scope="module", params=["rec40", "edited35"])
def cut(request, tmp_path_factory) -> tuple[Path, Path, dict]:
    tmp = tmp_path_factory.mktemp(request.param)
    src = tmp / request.param
    shutil.copytree(FIXTURES / request.param, src)
    r = edit(str(src), tmp / "out", EditSpec(drop_frames=parse_frame_spec(SPEC)))
    assert r.write.status == "written"
    return src, tmp / "out", r.as_dict()


def test_dropped_frames_are_gone_and_every_other_value_equals_the_source(cut):
    src, out, report = cut
    a, b = rows(src), rows(out)
    a = a.filter(pa.array(kept_mask(a, DROP)))
    assert b.num_rows == a.num_rows == open_dataset(str(src)).num_frames - 10 - 5 - 7
    for name in a.column_names:
        if name not in RENUMBERED:
            assert b[name].equals(a[name]), name
    np.testing.assert_array_equal(b["index"].to_numpy(), np.arange(b.num_rows))
    ep, fi = b["episode_index"].to_numpy(), b["frame_index"].to_numpy()
    starts = open_dataset(str(out)).column("dataset_from_index")
    np.testing.assert_array_equal(fi, np.arange(b.num_rows) - starts[ep])
    ts, src_ts = b["timestamp"].to_numpy(), a["timestamp"].to_numpy()
    cut_rows = np.isin(ep, list(DROP))
    np.testing.assert_array_equal(ts[cut_rows], (fi[cut_rows] / 30).astype(np.float32))
    np.testing.assert_array_equal(ts[~cut_rows], src_ts[~cut_rows])  # untouched episodes
    assert report["dropped"] == {}
    assert report["frames_dropped"]["3"] == {"dropped": 10, "ranges": [[11, 20]],
                                             "by": ["--drop-frames"]}  # fmt: skip


def test_episodes_keep_their_place_and_stats_are_recomputed(cut):
    src, out, _ = cut
    s, o = open_dataset(str(src)), open_dataset(str(out))
    assert o.num_episodes == s.num_episodes
    want = s.column("length") - np.array([DROP[e][1] - DROP[e][0] if e in DROP else 0
                                          for e in range(s.num_episodes)])  # fmt: skip
    np.testing.assert_array_equal(o.column("length"), want)
    assert o.info["total_frames"] == int(want.sum())
    assert s.fingerprint != o.fingerprint  # plans and frame stores of the source are stale
    b = rows(out)
    ep = b["episode_index"].to_numpy()
    act = np.stack(b["action"].to_numpy(zero_copy_only=False)).astype(np.float64)
    meta = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet")
    for e in (3, 7, 0):
        x = act[ep == e]
        row = meta.slice(e, 1).to_pylist()[0]
        np.testing.assert_allclose(row["stats/action/min"], x.min(axis=0))
        np.testing.assert_allclose(row["stats/action/max"], x.max(axis=0))
        np.testing.assert_allclose(row["stats/action/mean"], x.mean(axis=0), rtol=1e-6)
        assert row["stats/action/count"] == [len(x)]
        assert row["stats/frame_index/max"] == [len(x) - 1]
    stats = json.loads((out / "meta/stats.json").read_text())
    assert stats["action"]["count"] == [b.num_rows]
    np.testing.assert_allclose(stats["action"]["mean"], act.mean(axis=0), rtol=1e-5)
    assert not (out / "meta/shard_plans").exists()


def test_the_output_validates_and_a_rerun_is_a_no_op(cut, tmp_path):
    src, out, _ = cut
    v = subprocess.run([*CLI, "validate", str(out), "--json"], capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert v.returncode == 0 and json.loads(v.stdout)["counts"]["error"] == 0, v.stdout
    again = edit(str(src), out, EditSpec(drop_frames=parse_frame_spec(SPEC)))
    assert again.write.status == "unchanged"
    other = edit(str(src), out, EditSpec(drop_frames=parse_frame_spec("3:11-19")))
    assert other.write.status == "written"  # another selection is another output
    assert (
        open_dataset(str(out)).column("length")[3] == open_dataset(str(src)).column("length")[3] - 9
    )


def test_keep_frames_and_an_episode_left_without_frames(tmp_path):
    src = FIXTURES / "rec40"
    n0 = int(open_dataset(str(src)).column("length")[0])
    ranges = tmp_path / "keep.jsonl"
    ranges.write_text('{"episode": 2, "start": 5, "end": 15}\n[4, 0, 3]\n')
    r = edit(str(src), tmp_path / "out", EditSpec(
        keep_frames=parse_frame_spec(str(ranges), "--keep-frames"),
        drop_frames=parse_frame_spec(f"0:0-{n0 - 1}"),
    ))  # fmt: skip
    d = r.as_dict()
    assert d["dropped"] == {"0": "all frames dropped by --drop-frames"}
    o, s = open_dataset(str(tmp_path / "out")), open_dataset(str(src))
    assert o.num_episodes == s.num_episodes - 1
    np.testing.assert_array_equal(o.column("length")[[1, 3]], [10, 3])  # old episodes 2 and 4
    b, a = rows(tmp_path / "out"), rows(src)
    old2 = a.filter(pa.array(a["episode_index"].to_numpy() == 2))
    new1 = b.filter(pa.array(b["episode_index"].to_numpy() == 1))
    assert new1["action"].equals(old2["action"].slice(5, 10))


def seeded(tmp: Path, name: str) -> tuple[Path, dict[int, int], dict[int, int]]:
    """A copy of ``name`` with still heads (frames equal to a later frame) and tails seeded."""
    src = tmp / name
    shutil.copytree(FIXTURES / name, src)
    ds = open_dataset(str(src))
    head, tail = {2: 5, 11: 1}, {5: 7, 11: 4}
    for rel in ds.data_files:
        t = pq.read_table(src / rel)
        ep, fi = t["episode_index"].to_numpy(), t["frame_index"].to_numpy()
        cols = {}
        for name_ in ("action", "observation.state"):
            x = np.stack(t[name_].to_numpy(zero_copy_only=False)).copy()
            for e, h in head.items():
                sel = np.flatnonzero(ep == e)
                x[sel[:h]] = x[sel[h]]
            for e, k in tail.items():
                sel = np.flatnonzero(ep == e)
                x[sel[-k:]] = x[sel[-k - 1]]
            cols[name_] = pa.FixedSizeListArray.from_arrays(
                pa.array(x.ravel(), pa.float32()), x.shape[1]
            )
        for name_, col in cols.items():
            t = t.set_column(t.schema.get_field_index(name_), t.schema.field(name_), col)
        assert len(fi)
        pq.write_table(t, src / rel)
    return src, head, tail


@pytest.mark.parametrize("name", ["rec40", "vid24"])
def test_trim_idle_removes_exactly_the_seeded_still_frames(name, tmp_path):
    src, head, tail = seeded(tmp_path, name)
    found = find_idle(open_dataset(str(src)))
    assert found.head == head and found.tail == tail and found.still == []
    r = subprocess.run([*CLI, "edit", str(src), "--out", str(tmp_path / "out"), "--trim-idle",
                        "--json"], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)["frames_dropped"]
    assert report["2"] == {"dropped": 5, "ranges": [[0, 4]], "by": ["--trim-idle"], "head": 5,
                           "tail": 0}  # fmt: skip
    assert sorted(report) == ["11", "2", "5"]
    s, o = open_dataset(str(src)), open_dataset(str(tmp_path / "out"))
    cut = {e: head.get(e, 0) + tail.get(e, 0) for e in set(head) | set(tail)}
    np.testing.assert_array_equal(
        o.column("length"), s.column("length") - [cut.get(e, 0) for e in range(s.num_episodes)]
    )
    a = rows(src)
    drop = {e: (0, h) for e, h in head.items()}
    keep = kept_mask(a, drop)
    for e, k in tail.items():
        n = int(s.column("length")[e])
        keep &= ~((a["episode_index"].to_numpy() == e) & (a["frame_index"].to_numpy() >= n - k))
    assert rows(tmp_path / "out")["action"].equals(a.filter(pa.array(keep))["action"])


@pytest.mark.parametrize("name", ["rec40", "edited35", "vid24"])
def test_trim_idle_finds_nothing_on_lerobot_recordings(name):
    found = find_idle(open_dataset(str(FIXTURES / name)))
    assert found.head == {} and found.tail == {} and found.still == []


def test_frame_spec_parsing(tmp_path):
    np.testing.assert_array_equal(parse_frame_spec("3:11-20, 7:4"), [[3, 11, 21], [7, 4, 5]])
    f = tmp_path / "r.json"
    f.write_text(json.dumps([{"episode": 1, "start": 2, "end": 4}]))
    np.testing.assert_array_equal(parse_frame_spec(str(f)), [[1, 2, 4]])
    for bad in ("3:20-11", "3-4", "x:1", "3:1,oops", ""):
        with pytest.raises(ValueError, match="--drop-frames"):
            parse_frame_spec(bad)
    assert kept_ranges(np.array([0, 1, 1, 0, 1], bool)) == ((1, 3), (4, 5))


@pytest.mark.parametrize(
    "args, words",
    [
        (["--drop-frames", "3:20-11"], "is not a valid range"),
        (["--drop-frames", "3:900-950"], "frames 900..950 of episode 3 are out of range"),
        (["--keep-frames", "99:0-4"], "no episode [99]"),
        (["--drop-frames", "nofile.json"], "neither EPISODE:FRAMES"),
        (["--trim-idle", "--idle-threshold", "0"], "--idle-threshold 0"),
    ],
)
def test_cli_bad_frames_are_one_line_exit_2(args, words, tmp_path):
    r = subprocess.run([*CLI, "edit", str(FIXTURES / "rec40"), "--out", str(tmp_path / "o"),
                        *args], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o").exists()


def test_cli_reports_per_episode(tmp_path):
    r = subprocess.run([*CLI, "edit", str(FIXTURES / "rec40"), "--out", str(tmp_path / "o"),
                        "--drop-frames", "3:11-20"], capture_output=True, text=True,
                       timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "episode 3: dropped 10 frames (11-20) by --drop-frames" in r.stdout
