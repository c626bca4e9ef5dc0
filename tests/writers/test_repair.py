"""``episodekit repair`` on recordings LeRobot 0.6.1 itself wrote and that were killed (SIGKILL)
mid-recording (tests/fixtures/lerobot/crash_*, recipes in tests/fixtures/lerobot/README.md):
every saved episode comes back, each row bit-equal to the uninterrupted run of the same
recording (ref/crash_*_ref.json.gz), and the source is never changed."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from episodekit.core.dataset import open_dataset
from episodekit.core.errors import EnvironmentProblem
from episodekit.writers.repair import (
    NothingRecoverable,
    RepairOptions,
    repair,
    restore,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
# name -> (episodes saved, episodes kept with --keep-partial)
CRASHED = {
    "crash_rec7": (7, 7),
    "crash_img5": (5, 5),
    "crash_vid5": (5, 5),
    "crash_vid3_saving": (3, 4),
    "crash_rollover": (14, 14),
}


def reference(name: str) -> dict:
    return json.loads(gzip.decompress((FIXTURES / "ref" / f"{name}_ref.json.gz").read_bytes()))


def _row_bytes(col: pa.Array) -> list[bytes]:
    """As tools/make_crash_reference.py: each row's values as bytes."""
    n = len(col)
    if pa.types.is_struct(col.type):
        parts = [_row_bytes(col.field(i)) for i in range(col.type.num_fields)]
        return [b"".join(p[r] for p in parts) for r in range(n)]
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type):
        flat = pa.compute.list_flatten(col).to_numpy(zero_copy_only=False).reshape(n, -1)
        return [np.ascontiguousarray(flat[r]).tobytes() for r in range(n)]
    if pa.types.is_binary(col.type) or pa.types.is_string(col.type):
        values = col.to_pylist()
        return [
            b"\0null" if v is None else (v if isinstance(v, bytes) else v.encode()) for v in values
        ]
    flat = col.to_numpy(zero_copy_only=False).reshape(n, 1)
    return [np.ascontiguousarray(flat[r]).tobytes() for r in range(n)]


def row_digests(table: pa.Table) -> list[str]:
    """As tools/make_crash_reference.py: per row, sha256 over every column's values."""
    parts = [_row_bytes(table[name].combine_chunks()) for name in sorted(table.column_names)]
    rows = [b"".join(p[r] for p in parts) for r in range(table.num_rows)]
    return [hashlib.sha256(r).hexdigest()[:16] for r in rows]


def packet_digests(path: Path, start: float, stop: float, fps: float) -> list[str]:
    """sha256 of each packet of an mp4 in [start, stop) seconds (as the reference tool)."""
    import av

    from episodekit.core.video import mp4_sample_table

    with open(path, "rb") as fh:
        table = mp4_sample_table(fh, str(path))
    data = path.read_bytes()
    with av.open(str(path)) as c:
        tb = float(c.streams.video[0].time_base)
    t = table.pts * tb
    sel = np.flatnonzero((t >= start - 0.5 / fps) & (t < stop - 0.5 / fps))
    sel = sel[np.argsort(table.pts[sel], kind="stable")]
    spans = [(int(table.offset[i]), int(table.offset[i] + table.size[i])) for i in sel]
    return [hashlib.sha256(data[a:b]).hexdigest()[:16] for a, b in spans]


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and folder of a tree: content digest and mode."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out[rel] = (digest, p.stat().st_mode)
    return out


def copy(name: str, tmp: Path) -> Path:
    dst = tmp / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def episodes_of(root: Path) -> pa.Table:
    files = sorted(root.glob("meta/episodes/*/*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files])


def data_of(root: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in sorted(root.glob("data/*/*.parquet"))])


def check_against_reference(out: Path, name: str, episodes: int, rebuilt: list[int]) -> None:
    ref = reference(name)
    data = data_of(out)
    assert data["index"].to_pylist() == list(range(data.num_rows))
    assert row_digests(data) == ref["rows"][: data.num_rows]  # every row, bit for bit
    assert data.num_rows == sum(r["length"] for r in ref["episodes"][:episodes])
    got = episodes_of(out).to_pylist()
    assert len(got) == episodes
    info = json.loads((out / "meta/info.json").read_text())
    videos = {k for k, f in info["features"].items() if f["dtype"] == "video"}
    for row, want in zip(got, ref["episodes"]):
        for key, value in want.items():
            video = key.split("/")[1] in videos if key.startswith("stats/") else False
            if video and row["episode_index"] in rebuilt and key.split("/")[-1] != "count":
                # rebuilt from the decoded mp4; LeRobot measured the frames before encoding
                assert np.allclose(row[key], value, atol=0.05), key
            else:
                assert row[key] == value, (row["episode_index"], key)
        for key, per in ref["videos"].items():
            rel = info["video_path"].format(
                video_key=key,
                chunk_index=row[f"videos/{key}/chunk_index"],
                file_index=row[f"videos/{key}/file_index"],
            )
            start, stop = row[f"videos/{key}/from_timestamp"], row[f"videos/{key}/to_timestamp"]
            assert packet_digests(out / rel, start, stop, info["fps"]) == per[row["episode_index"]]


@pytest.mark.parametrize("name", sorted(CRASHED))
def test_recorded_crash_comes_back(name, tmp_path):
    if name == "crash_img5":
        pytest.importorskip("PIL")  # the image stats of rebuilt rows decode the PNGs
    src = copy(name, tmp_path)
    before = snapshot(src)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert result.status == "repaired"
    saved = CRASHED[name][0]
    assert result.episodes == saved
    check_against_reference(out, name, saved, result.rebuilt)
    assert result.rebuilt  # every crash lost buffered metadata rows
    assert snapshot(src) == before  # the source is only read
    ds = open_dataset(str(out))
    info = json.loads((out / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (ds.num_episodes, ds.num_frames)
    assert info["splits"] == {"train": f"0:{saved}"}
    assert not (out / "images").exists()
    # rerunning does nothing; the output has nothing to repair
    assert repair(src, RepairOptions(out=str(out))).status == "unchanged"
    assert repair(out, RepairOptions(dry_run=True)).status == "nothing to repair"


def test_out_rerun_sees_a_rewrite_that_keeps_size_and_mtime(tmp_path):
    """The --out rerun key identifies ROOT's files as edit's does (size, mtime, ctime, inode):
    a file rewritten in place with its size and mtime kept (a copy tool, a user's touch -r)
    makes the rerun repair again, never "unchanged" with an output of the old content."""
    import os

    src = copy("crash_rec7", tmp_path)
    out = tmp_path / "out"
    assert repair(src, RepairOptions(out=str(out))).status == "repaired"
    assert repair(src, RepairOptions(out=str(out))).status == "unchanged"
    info = src / "meta/info.json"
    st = info.stat()
    text = info.read_bytes()
    changed = text.replace(b'"robot_type": "aloha"', b'"robot_type": "koch1"')  # the same size
    assert changed != text and len(changed) == len(text)
    info.write_bytes(changed)
    os.utime(info, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (info.stat().st_size, info.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert repair(src, RepairOptions(out=str(out))).status == "repaired"
    assert json.loads((out / "meta/info.json").read_text())["robot_type"] == "koch1"


def test_keep_partial_keeps_the_episode_being_saved(tmp_path):
    """Killed inside save_episode: rows and both cameras' frames of episode 3 are on disk, its
    metadata row and info.json never were. Dropped by default (with its task and the mp4 tail),
    kept whole with --keep-partial; stats.json is then what LeRobot wrote for the 4 episodes."""
    src = copy("crash_vid3_saving", tmp_path)
    plain = repair(src, RepairOptions(out=str(tmp_path / "plain")))
    assert [d["episode"] for d in plain.dropped] == [3]
    assert "meta/tasks.parquet" in plain.files  # the task only episode 3 used is gone
    assert open_dataset(str(tmp_path / "plain")).tasks.num_rows == 3
    out = tmp_path / "kept"
    kept = repair(src, RepairOptions(out=str(out), keep_partial=True))
    assert kept.episodes == 4 and kept.dropped == []
    check_against_reference(out, "crash_vid3_saving", 4, kept.rebuilt)
    stats = json.loads((out / "meta/stats.json").read_text())
    want = reference("crash_vid3_saving")["stats"]
    for feature, values in want.items():  # quantiles: the data's, not LeRobot's mean of them
        if not feature.startswith("observation.images"):
            assert _without_quantiles(stats[feature]) == _without_quantiles(values), feature


def test_in_place_and_restore(tmp_path):
    src = copy("crash_vid5", tmp_path)
    before = snapshot(src)
    separate = tmp_path / "out"
    repair(copy("crash_vid5", tmp_path / "other"), RepairOptions(out=str(separate)))
    result = repair(src, RepairOptions(in_place=True))
    assert result.status == "repaired" and result.backup
    backup = Path(result.backup)
    assert backup.parent == src.parent
    for rel in result.files:  # the same files as a repair to a new folder
        assert (src / rel).read_bytes() == (separate / rel).read_bytes(), rel
    assert not list((src / "images").rglob("*.png"))  # staged PNGs moved to the backup
    check_against_reference(src, "crash_vid5", 5, result.rebuilt)
    assert repair(src, RepairOptions(in_place=True)).status == "nothing to repair"
    restore(backup)
    assert snapshot(src) == before
    assert not backup.exists()


def test_rollover_crash_with_every_footer_whole(tmp_path):
    """Killed inside save_episode right after the data file rolled over (crash_rollover): the
    data file and the meta/episodes file were both closed (footers whole), but the metadata
    rows of episodes 10-13 were still buffered. That is damage, never "nothing to repair"."""
    src = copy("crash_rollover", tmp_path)
    plan = repair(src, RepairOptions(dry_run=True))
    assert plan.status == "planned" and plan.rebuilt == [10, 11, 12, 13]
    damages = {d["file"]: d["damage"] for d in plan.damages}
    assert "no metadata row for episodes 10-13" in damages["meta/episodes"]
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert result.status == "repaired" and result.episodes == 14
    assert result.files["meta/episodes/chunk-000/file-001.parquet"] == "4 rows (4 rebuilt)"
    check_against_reference(out, "crash_rollover", 14, result.rebuilt)
    placed = episodes_of(out)  # where LeRobot would have flushed them: the next file
    assert placed["meta/episodes/file_index"].to_pylist() == [0] * 10 + [1] * 4


def test_dry_run_writes_nothing(tmp_path):
    src = copy("crash_rec7", tmp_path)
    before = snapshot(tmp_path)
    result = repair(src, RepairOptions(dry_run=True, out=str(tmp_path / "out")))
    assert result.status == "planned" and result.rebuilt == [4, 5, 6]
    damages = {d["file"]: d["damage"] for d in result.damages}
    assert "no parquet footer" in damages["data/chunk-000/file-001.parquet"]
    assert snapshot(tmp_path) == before


def test_healthy_root_is_left_alone(tmp_path):
    src = copy("rec40", tmp_path)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert result.status == "nothing to repair"
    assert not out.exists()


def test_power_loss_mid_row_group(tmp_path):
    """A complete root whose data file lost its end (a power cut after write() returned):
    the episodes whose rows are whole stay, the rest are dropped with a reason."""
    src = copy("rec40", tmp_path)
    f = src / "data/chunk-000/file-000.parquet"
    meta = pq.read_metadata(f)
    g = meta.row_group(29)
    cut = g.column(2).data_page_offset + 10  # inside the 30th episode's row group
    f.write_bytes(f.read_bytes()[:cut])
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert result.episodes == 29
    assert [d["episode"] for d in result.dropped] == list(range(29, 40))
    assert all("not in the data" in d["reason"] for d in result.dropped)
    want = pq.read_table(FIXTURES / "rec40/data/chunk-000/file-000.parquet").slice(
        0, sum(meta.row_group(i).num_rows for i in range(29))
    )
    assert data_of(out).equals(want)
    stats = json.loads((out / "meta/stats.json").read_text())
    assert stats["action"]["count"] == [want.num_rows]  # recomputed for the kept episodes


def test_mp4_cut_short_drops_the_episodes_it_lost(tmp_path):
    """The last mp4 of a camera lost its tail (a copy cut short): episodes whose frames are
    not all there are dropped, never kept with missing frames."""
    src = copy("crash_vid5", tmp_path)
    mp4 = src / "videos/observation.images.wrist/chunk-000/file-001.mp4"
    mp4.write_bytes(mp4.read_bytes()[: mp4.stat().st_size - 1500])
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    dropped = {d["episode"]: d["reason"] for d in result.dropped}
    assert 4 in dropped and "observation.images.wrist" in dropped[4]
    assert result.episodes == min(dropped)
    check_against_reference(out, "crash_vid5", result.episodes, result.rebuilt)


def test_missing_stats_and_wrong_totals_are_rebuilt(tmp_path):
    src = copy("crash_rec7", tmp_path)
    (src / "meta/stats.json").unlink()
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert "meta/stats.json" in result.files
    stats = json.loads((out / "meta/stats.json").read_text())
    lerobot = json.loads((FIXTURES / "crash_rec7/meta/stats.json").read_text())
    assert {f: _without_quantiles(v) for f, v in stats.items()} == {
        f: _without_quantiles(v) for f, v in lerobot.items()
    }
    assert stats["action"]["q99"] != lerobot["action"]["q99"]  # exact: tests/metadata/...ranks


def _without_quantiles(entry: dict) -> dict:
    """A stats.json entry without q01..q99 (repair writes the data's quantiles, exactly)."""
    return {k: v for k, v in entry.items() if k not in ("q01", "q10", "q50", "q90", "q99")}


def test_zero_length_episode_is_dropped(tmp_path):
    """A metadata row of an episode with no frames (another tool wrote it) is dropped with
    its reason; the rest of the recording comes back as usual."""
    src = copy("crash_rec7", tmp_path)
    f = src / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(f)
    empty = t.slice(3, 1).to_pylist()[0]
    empty.update(episode_index=9, length=0, dataset_from_index=164, dataset_to_index=164)
    pq.write_table(pa.concat_tables([t, pa.Table.from_pylist([empty], t.schema)]), f)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert result.dropped == [{"episode": 9, "frames": 0, "reason": "zero-length episode"}]
    check_against_reference(out, "crash_rec7", 7, result.rebuilt)


def test_nothing_recoverable(tmp_path):
    src = copy("crash_vid5", tmp_path)
    (src / "data/chunk-000/file-000.parquet").write_bytes(b"PAR1")
    shutil.rmtree(src / "meta/episodes")
    with pytest.raises(NothingRecoverable):
        repair(src, RepairOptions(out=str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


def test_cannot_run(tmp_path):
    src = copy("crash_rec7", tmp_path)
    with pytest.raises(EnvironmentProblem):
        repair(src, RepairOptions(out=str(src / "inside")))
    with pytest.raises(ValueError):
        repair(src, RepairOptions(out=str(tmp_path / "o"), in_place=True))
    other = tmp_path / "taken"
    other.mkdir()
    (other / "mine.txt").write_text("a user's file")
    with pytest.raises(EnvironmentProblem):
        repair(src, RepairOptions(out=str(other)))
    with pytest.raises(EnvironmentProblem):
        restore(tmp_path)  # not a backup


def test_metadata_row_disagreeing_with_rows_is_rebuilt(tmp_path):
    """A recovered row whose length disagrees with the rows is rebuilt from them (here the
    complete meta file of crash_rec7 says episode 2 is one frame longer)."""
    src = copy("crash_rec7", tmp_path)
    f = src / "meta/episodes/chunk-000/file-000.parquet"
    t = pq.read_table(f)
    length = t["length"].to_numpy().copy()
    length[2] += 1
    t = t.set_column(t.schema.get_field_index("length"), "length", pa.array(length))
    pq.write_table(t, f)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert 2 in result.rebuilt
    check_against_reference(out, "crash_rec7", 7, result.rebuilt)


def test_episodes_lost_in_the_middle_are_renumbered(tmp_path):
    """The first mp4 of a camera is gone: episodes 0-2 lose their frames and are dropped; 3 and
    4 are kept, renumbered 0 and 1 by the dataset writer (rows and frames unchanged)."""
    src = copy("crash_vid5", tmp_path)
    (src / "videos/observation.images.top/chunk-000/file-000.mp4").unlink()
    with pytest.raises(EnvironmentProblem, match="--out"):
        repair(src, RepairOptions(in_place=True))
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    assert [d["episode"] for d in result.dropped] == [0, 1, 2]
    assert result.episodes == 2
    ds = open_dataset(str(out))
    assert ds.column("episode_index").tolist() == [0, 1]
    assert data_of(out)["index"].to_pylist() == list(range(ds.num_frames))
    whole = tmp_path / "whole"  # the same recording repaired with every episode
    repair(copy("crash_vid5", tmp_path / "w"), RepairOptions(out=str(whole)))
    before = open_dataset(str(whole))
    first = int(before.column("dataset_from_index")[3])
    renumbered = ["index", "episode_index", "task_index"]
    want = data_of(whole).slice(first).drop_columns(renumbered)
    assert data_of(out).drop_columns(renumbered).equals(want)
    assert ds.episodes["tasks"].to_pylist() == before.episodes["tasks"].to_pylist()[3:]
    assert repair(src, RepairOptions(out=str(out))).status == "unchanged"


def test_a_rewritten_data_file_is_read_back_against_the_rows_written(tmp_path, monkeypatch):
    """vid24 (LeRobot's recorder) with its last wrist mp4 cut short: the data file loses its
    last episodes, rewritten by the episode sink's data files (one row group per kept episode)
    and read back against the checksums of the rows written. A value changed between those
    checksums and the file's bytes (a pipeline bug; repair's own verification checks the
    rows' index and episodes, not their values) stops the run: nothing is published."""
    from episodekit.core.parquet_write import RowGroupWriter, VerificationError

    src = copy("vid24", tmp_path)
    mp4 = src / "videos/observation.images.wrist/chunk-000/file-001.mp4"
    mp4.write_bytes(mp4.read_bytes()[: int(mp4.stat().st_size * 0.6)])
    result = repair(src, RepairOptions(out=str(tmp_path / "out")))
    rel = "data/chunk-000/file-000.parquet"
    assert result.files[rel].startswith("rewritten")
    source = pq.read_table(src / rel)
    got = data_of(tmp_path / "out")
    assert got.equals(source.slice(0, got.num_rows))
    assert pq.read_metadata(tmp_path / "out" / rel).num_row_groups == result.episodes
    real = RowGroupWriter._put

    def corrupt(writer, table):  # after the group's checksum, before its bytes
        if "action" not in table.column_names:
            return real(writer, table)
        i = table.schema.get_field_index("timestamp")
        ts = table.column(i).to_numpy().copy()
        ts[-1] += 1.0
        real(writer, table.set_column(i, "timestamp", pa.array(ts, table.schema.field(i).type)))

    monkeypatch.setattr(RowGroupWriter, "_put", corrupt)
    with pytest.raises(VerificationError, match=r"columns \['timestamp'\]"):
        repair(src, RepairOptions(out=str(tmp_path / "bad")))
    assert not (tmp_path / "bad").exists()


# -- staging, backup and signals (core/staging, core/interrupt) -------------------------------


def _ours(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".episodekit-" in p.name)


def _backup(parent: Path) -> Path:
    (backup,) = [parent / n for n in _ours(parent) if ".episodekit-backup-" in n]
    return backup


def _without_lock(tree: dict) -> dict:
    return {k: v for k, v in tree.items() if k != ".episodekit.lock"}


def _repaired(tmp_path: Path, name: str) -> dict:
    """The tree an uninterrupted in-place repair of ``name`` leaves."""
    ref = copy(name, tmp_path / "reference")
    repair(ref, RepairOptions(in_place=True))
    return _without_lock(snapshot(ref))


def test_in_place_backup_is_named_and_marked_as_ours(tmp_path):
    """The backup is a hidden sibling with a random token and our marker (a name a user's
    folder never has); a user's lookalike folders next to ROOT stay, and --restore refuses
    a folder without our marker or of another root."""
    from episodekit.core import staging

    src = copy("crash_rec7", tmp_path)
    fake = tmp_path / f".crash_rec7.episodekit-backup-{'0' * 32}"  # our name, not our marker
    (fake / "files").mkdir(parents=True)
    (fake / "manifest.json").write_text(
        json.dumps({"root": str(src), "replaced": [], "created": [], "removed": []})
    )
    mine = [tmp_path / "crash_rec7.repair-backup-1", fake]
    (mine[0] / "meta").mkdir(parents=True)
    result = repair(src, RepairOptions(in_place=True))
    backup = Path(result.backup)
    assert backup.parent == tmp_path and backup.name.startswith(".crash_rec7.episodekit-backup-")
    assert staging.is_backup(backup, src) and not staging.is_backup(fake, src)
    doc = json.loads((backup / staging.STAGING_MARKER).read_text())
    doc["pid"] = 2**22 + 12345  # its writer long gone: still the user's way back
    (backup / staging.STAGING_MARKER).write_text(json.dumps(doc))
    assert staging.remove_stale(src) == [] and backup.is_dir()  # clean-up never takes it
    with pytest.raises(EnvironmentProblem, match="not a repair backup of"):
        restore(fake)
    other = copy("crash_rec7", tmp_path / "elsewhere")
    with pytest.raises(EnvironmentProblem, match="not of"):
        restore(backup, expect_root=other)
    assert all(p.is_dir() for p in mine)
    restore(backup)
    assert not backup.exists() and all(p.is_dir() for p in mine)


def test_in_place_interrupted_during_the_commit_finishes_it(tmp_path, monkeypatch, capsys):
    """SIGINT while files are replaced: the replacing goes on to the end (ROOT fully
    repaired, never half), then the run ends 130, naming the backup, which restores ROOT."""
    import os
    import signal
    import time

    from episodekit.core import interrupt
    from episodekit.writers import repair_backup as repair_mod

    want = _repaired(tmp_path, "crash_vid5")
    src = copy("crash_vid5", tmp_path)
    before = snapshot(src)
    real_move = repair_mod._move
    moves = []

    def move_then_signal(a, b):
        real_move(a, b)
        moves.append(b)
        if len(moves) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs here: deferred

    monkeypatch.setattr(repair_mod, "_move", move_then_signal)
    assert interrupt.run_command(lambda: repair(src, RepairOptions(in_place=True)) and 0) == 130
    assert len(moves) > 1  # the signal did not stop the replacing
    assert _without_lock(snapshot(src)) == want
    backup = _backup(tmp_path)
    err = capsys.readouterr().err
    assert f"are in {backup} (undo: episodekit repair {src} --restore {backup})" in err
    assert _ours(tmp_path) == [backup.name]  # the staging folder is gone
    restore(backup)
    assert snapshot(src) == before


def test_in_place_interrupted_before_the_commit_changes_nothing(tmp_path, monkeypatch):
    """SIGINT while the repaired files are staged or verified: ROOT as it was, no backup, no
    staging folder left."""
    import os
    import signal
    import time

    from episodekit.core import interrupt
    from episodekit.writers import repair as repair_mod

    src = copy("crash_vid5", tmp_path)
    before = snapshot(src)
    real_verify = repair_mod.verify

    def verify_then_signal(*args, **kwargs):
        real_verify(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)
        raise AssertionError("the signal was not raised")

    monkeypatch.setattr(repair_mod, "verify", verify_then_signal)
    assert interrupt.run_command(lambda: repair(src, RepairOptions(in_place=True)) and 0) == 130
    assert _without_lock(snapshot(src)) == _without_lock(before)
    assert _ours(tmp_path) == []


def test_in_place_error_during_the_commit_puts_root_back(tmp_path, monkeypatch):
    """A full disk half-way through the replacing: every file is put back, the backup is
    removed, and the error says so much (exit 2)."""
    import errno

    from episodekit.writers import repair_backup as repair_mod

    src = copy("crash_vid5", tmp_path)
    before = snapshot(src)
    real_move = repair_mod._move
    moves = []

    def move_until_full(a, b):
        moves.append(b)
        if len(moves) == 3:
            raise repair_mod.os_problem(OSError(errno.ENOSPC, "No space left"), a, "move")
        real_move(a, b)

    monkeypatch.setattr(repair_mod, "_move", move_until_full)
    with pytest.raises(EnvironmentProblem, match="No space left"):
        repair(src, RepairOptions(in_place=True))
    assert _without_lock(snapshot(src)) == _without_lock(before)
    assert _ours(tmp_path) == []


def test_in_place_killed_during_the_commit_is_restored_from_its_backup(tmp_path):
    """kill -9 half-way through the replacing (ROOT part old, part new): the backup it left is
    marked and half-made; --restore puts ROOT back as it was, and the next repair removes the
    killed run's staging folder and repairs ROOT."""
    import signal
    import subprocess
    import sys

    want = _repaired(tmp_path, "crash_vid5")
    src = copy("crash_vid5", tmp_path)
    before = snapshot(src)
    code = (
        "import os, signal, sys\n"
        "from episodekit.writers import repair as r, repair_backup as b\n"
        "real, n = b._move, []\n"
        "def move(a, b):\n"
        "    n.append(b)\n"
        "    if len(n) == 3:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    real(a, b)\n"
        "b._move = move\n"
        "r.repair(sys.argv[1], r.RepairOptions(in_place=True))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(src)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    now = _without_lock(snapshot(src))
    assert now != _without_lock(before) and now != want  # half repaired
    backup = _backup(tmp_path)
    assert json.loads((backup / "manifest.json").read_text())["complete"] is False
    assert len(_ours(tmp_path)) == 2  # the backup and the killed run's staging folder
    restore(backup, expect_root=src)
    assert snapshot(src) == before
    repair(src, RepairOptions(in_place=True))
    assert _without_lock(snapshot(src)) == want
    assert len(_ours(tmp_path)) == 1  # the new backup; the stale staging folder is gone


def test_out_staging_follows_the_staging_rules(tmp_path, monkeypatch):
    """--out is built in a marked staging folder next to it; a failed run leaves DIR as it
    was and no folder behind; a killed run's staging folder is removed by the next run, a
    user's lookalike is not."""
    import os
    import uuid

    from episodekit.core import staging
    from episodekit.writers import repair as repair_mod

    src = copy("crash_rec7", tmp_path)
    out = tmp_path / "out"
    seen = []
    real_publish = staging.publish

    def fail_publish(work, dest):
        seen.append(Path(work))
        assert staging.owned(work, dest) and Path(work).parent == tmp_path
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(staging, "publish", fail_publish)
    with pytest.raises(EnvironmentProblem, match=f"nothing was published to {out}"):
        repair(src, RepairOptions(out=str(out)))
    assert not out.exists() and not seen[0].exists()
    monkeypatch.setattr(staging, "publish", real_publish)
    stale = staging.new_staging(out)  # as a killed run leaves it: marked, its writer gone
    doc = json.loads((stale / staging.STAGING_MARKER).read_text())
    doc["pid"] = 2**22 + 12345  # no such process
    (stale / staging.STAGING_MARKER).write_text(json.dumps(doc))
    lookalike = tmp_path / f".out.episodekit-partial-{uuid.uuid4().hex}"  # no marker
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    assert repair_mod.repair(src, RepairOptions(out=str(out))).status == "repaired"
    assert not stale.exists() and lookalike.is_dir()
    assert sorted(os.listdir(tmp_path)) == sorted(["crash_rec7", "out", lookalike.name])


def test_in_place_interrupted_in_its_final_clean_up_names_the_backup(tmp_path, monkeypatch, capsys):
    """SIGINT while the staging folder is removed, ROOT already repaired: the run ends 130 and
    still names the backup and the command that undoes the repair (issue 48)."""
    import os
    import signal
    import time

    from episodekit.core import interrupt, staging

    src = copy("crash_rec7", tmp_path)
    before = snapshot(src)
    real_discard = staging.discard

    def signal_then_discard(work, out):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here
        real_discard(work, out)

    monkeypatch.setattr(staging, "discard", signal_then_discard)
    assert interrupt.run_command(lambda: repair(src, RepairOptions(in_place=True)) and 0) == 130
    backup = _backup(tmp_path)
    err = capsys.readouterr().err
    assert f"are in {backup} (undo: episodekit repair {src} --restore {backup})" in err
    monkeypatch.setattr(staging, "discard", real_discard)
    restore(backup)
    assert snapshot(src) == before


def test_restore_puts_back_only_what_a_killed_repair_replaced(tmp_path):
    """A backup whose repair was killed after its manifest was written but before any file
    changed: the hashes say nothing was replaced; restore changes nothing and removes it."""
    from episodekit.core import staging
    from episodekit.writers import repair as repair_mod

    src = copy("crash_rec7", tmp_path)
    before = snapshot(src)
    result = repair(copy("crash_rec7", tmp_path / "ref"), RepairOptions(in_place=True))
    manifest = json.loads((Path(result.backup) / "manifest.json").read_text())
    manifest.update(root=str(src.resolve()), complete=False)
    staging.new_backup(src, {repair_mod.MANIFEST: json.dumps(manifest)})
    backup = _backup(tmp_path)
    doc = json.loads((backup / staging.STAGING_MARKER).read_text())
    doc["pid"] = 2**22 + 12345  # its writer gone (killed)
    (backup / staging.STAGING_MARKER).write_text(json.dumps(doc))
    with pytest.raises(EnvironmentProblem, match="--restore"):  # a repair waits for it
        repair(src, RepairOptions(in_place=True))
    restore(backup, expect_root=src)
    assert snapshot(src) == before and _ours(tmp_path) == []


def test_no_footer_of_every_row_group_is_parsed(tmp_path, monkeypatch):
    """The footer-less data file's row groups (one per episode; file-001 of crash_rec7, after
    the intact file-000) and the staged file written under its new footer are read a window
    at a time: with windows of one row group, pyarrow never opens them under a footer listing
    more than one (a footer of a recording's every episode costs ~5 KB a row group, held per
    open file). The output is the same, row for row."""
    from episodekit.core import parquet_window as pw

    monkeypatch.setattr(pw, "WINDOW_CHUNKS", 1)  # one row group a window
    opened: list[tuple[str, int]] = []
    real = pq.ParquetFile.__init__

    def counting(self, source, *args, **kwargs):
        real(self, source, *args, **kwargs)
        opened.append((str(source), self.metadata.num_row_groups))

    monkeypatch.setattr(pq.ParquetFile, "__init__", counting)
    src = copy("crash_rec7", tmp_path)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    monkeypatch.undo()
    assert result.status == "repaired" and result.episodes == 7
    # file-001 opened by path under a window's footer, footers parsed from memory (pyarrow's
    # reading of an encoded footer, or of a salvaged file held in memory): one row group each
    footerless = [n for source, n in opened if "file-001" in source or "BufferReader" in source]
    assert len(footerless) > 3 and max(footerless) == 1  # file-001 has 3 row groups
    check_against_reference(out, "crash_rec7", 7, result.rebuilt)


@pytest.mark.parametrize("name", ["crash_rollover", "crash_vid5"])
def test_episodes_files_are_written_a_block_of_rows_at_a_time(name, tmp_path, monkeypatch):
    """The kept metadata rows are taken, fed to LeRobot's stats recurrence and written a block
    at a time (issue 49: the whole recovered table was held from the inspection to the write):
    with blocks of 3 rows, each episodes file is row groups of at most 3 rows, every row is
    the reference's, and stats.json and the rows are those of one block per file."""
    from episodekit.writers import repair_episodes

    src = copy(name, tmp_path)
    whole = tmp_path / "whole"
    repair(src, RepairOptions(out=str(whole)))
    monkeypatch.setattr(repair_episodes, "BLOCK", 3)
    out = tmp_path / "out"
    result = repair(src, RepairOptions(out=str(out)))
    check_against_reference(out, name, CRASHED[name][0], result.rebuilt)
    assert (out / "meta/stats.json").read_bytes() == (whole / "meta/stats.json").read_bytes()
    files = sorted(out.glob("meta/episodes/*/*.parquet"))
    assert [f.relative_to(out) for f in files] == [
        f.relative_to(whole) for f in sorted(whole.glob("meta/episodes/*/*.parquet"))
    ]
    longest = 0
    for f in files:
        rel = f.relative_to(out).as_posix()
        assert pq.read_table(f).equals(pq.read_table(whole / rel))
        if rel not in result.files:  # unchanged: the root's file as it was
            continue
        meta = pq.read_metadata(f)
        rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert max(rows) <= 3, (f, rows)
        assert pq.read_metadata(whole / rel).num_row_groups == 1  # one block: one group
        longest = max(longest, meta.num_rows)
    assert longest > 3  # a file written in several blocks
