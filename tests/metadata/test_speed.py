"""Speed percentiles: bucketing contract, the file, the runtime path (stale, append, subset, RO)."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from episodekit.cli import main
from episodekit.core import atomic, logs
from episodekit.core.dataset import open_dataset
from episodekit.core.errors import EnvironmentProblem
from episodekit.metadata import speed
from episodekit.metadata.speed import (
    SPEED_FILE,
    SpeedFileError,
    bucket,
    compute_speed_rows,
    ensure_speed_file,
    episode_buckets,
    load_or_compute,
    read_speed_file,
    write_speed_file,
)

POINTS = [5, 15, 25, 35, 45, 55, 65, 75, 85, 95]


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    """Each test sees the once-per-root warnings afresh, as a new process would."""
    monkeypatch.setattr(logs, "_logged", set())
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


@pytest.fixture
def root(make_sample) -> Path:
    """200 episodes, 6 tasks: four common tasks (dense) and two rare ones (3 and 7 episodes)."""
    return make_sample(episodes=200, tasks=6, seed=3)


def retask(root: Path, tasks: list[list[str]]) -> None:
    """Rewrite the ``tasks`` column of the episodes parquet files (episode i gets tasks[i])."""
    for f in sorted((root / "meta/episodes").glob("*/*.parquet")):
        t = pq.read_table(f)
        ep = t["episode_index"].to_pylist()
        col = pa.array([tasks[e] for e in ep], pa.list_(pa.string()))
        pq.write_table(t.set_column(t.schema.get_field_index("tasks"), "tasks", col), f)


def task_lengths(ds) -> dict[int, np.ndarray]:
    ti, length = ds.column("task_index"), ds.column("length")
    return {int(t): length[ti == t] for t in np.unique(ti) if t >= 0}


def file_text(root: Path) -> str:
    return (root / SPEED_FILE).read_text()


def temporaries(root: Path) -> list[Path]:
    return [p for p in (root / "meta").iterdir() if atomic.is_temp_name(p.name)]


# --- the bucketing contract -------------------------------------------------------------------


def test_bucket_boundary_walk():
    b = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0]
    assert bucket(3, b) == 0  # below p5
    assert bucket(10, b) == 10  # exactly p5: the tie goes up
    assert bucket(15, b) == 10  # between p5 and p15
    assert bucket(50, b) == 50
    assert bucket(99, b) == 90  # just below p95
    assert bucket(100, b) == 100  # exactly p95
    assert bucket(10_000, b) == 100  # above
    assert type(bucket(15, np.array(b))) is int
    # Repeated boundaries: a length equal to them passes all of them.
    assert bucket(20, [10, 20, 20, 20, 30, 40, 50, 60, 70, 80]) == 40
    assert bucket(50, None) == 50


def test_episode_buckets_equal_scalar_contract_with_ties(root):
    ds = open_dataset(root)
    length = ds.column("length")
    rng = np.random.default_rng(0)
    rows = compute_speed_rows(ds)
    # Handwritten boundaries made of the episodes' own lengths (ties everywhere), half-integers,
    # negative and huge values: the vectorized lookup must agree with the scalar contract.
    for r in rows[:3]:
        r["percentiles"] = sorted(rng.choice(length, 10).astype(float).tolist())
    rows[3]["percentiles"] = sorted([-5.0, 0.5, 99.5, 100.0, 150.5, 200.0, 1e9, 1e9, 1e12, 1e300])
    vec = episode_buckets(ds, rows)
    by_task = {r["task_index"]: r["percentiles"] for r in rows}
    ref = [bucket(n, by_task.get(t)) for t, n in zip(ds.column("task_index"), length)]
    assert vec.dtype == np.int64
    assert vec.tolist() == ref
    assert set(vec[np.isin(ds.column("task_index"), [0, 1, 2])].tolist()) > {0, 50, 100}


def test_compute_matches_numpy_per_task(root):
    ds = open_dataset(root)
    rows = compute_speed_rows(ds)
    assert [r["task_index"] for r in rows] == list(range(6))
    assert [r["task"] for r in rows] == ds.task_strings()
    by_task = task_lengths(ds)
    for r in rows:
        lengths = by_task[r["task_index"]]
        assert list(r) == [
            "task_index",
            "task",
            "n_episodes",
            "percentiles",
            "version",
            "fingerprint",
        ]
        assert r["n_episodes"] == len(lengths)
        assert r["version"] == 1 and r["fingerprint"] == ds.fingerprint
        if len(np.unique(lengths)) >= 10:
            assert r["percentiles"] == np.percentile(lengths, POINTS).tolist()
            assert r["percentiles"] == sorted(r["percentiles"])
            assert all(type(x) is float for x in r["percentiles"])
        else:
            assert r["percentiles"] is None
    # The two rare tasks are sparse by count; the four common ones are not.
    assert [r["percentiles"] is None for r in rows] == [False] * 4 + [True] * 2
    assert sorted(r["n_episodes"] for r in rows)[:2] == [3, 7]
    buckets = episode_buckets(ds, rows)
    assert set(buckets[np.isin(ds.column("task_index"), [4, 5])].tolist()) == {50}
    assert set(buckets.tolist()) == set(range(0, 101, 10))


def test_sparse_by_equal_lengths(make_sample):
    # Short episodes clip at 5 frames: tasks with 20+ episodes but few distinct lengths.
    ds = open_dataset(make_sample(episodes=60, tasks=3, seed=0, mean_length=6))
    distinct = {t: len(np.unique(v)) for t, v in task_lengths(ds).items()}
    counts = {t: len(v) for t, v in task_lengths(ds).items()}
    assert sorted(distinct.values())[0] == 1 and min(counts.values()) >= 10  # the precondition
    rows = compute_speed_rows(ds)
    for r in rows:
        assert (r["percentiles"] is None) == (distinct[r["task_index"]] < 10)
    buckets = episode_buckets(ds, rows)
    sparse = [t for t, d in distinct.items() if d < 10]
    assert set(buckets[np.isin(ds.column("task_index"), sparse)].tolist()) == {50}


def test_exactly_ten_distinct_lengths_is_dense(root):
    ds = open_dataset(root)
    names = ds.task_strings()
    length, ep = ds.column("length"), ds.column("episode_index")
    # Task A gets 10 episodes of 10 distinct lengths, task B 12 episodes of 9 distinct lengths.
    _, first = np.unique(length, return_index=True)
    a = ep[first[:10]]
    b = np.concatenate([ep[first[10:19]], ep[np.isin(length, length[first[10:13]])]])
    b = np.setdiff1d(np.unique(b), a)
    tasks = [[names[0]] for _ in range(ds.num_episodes)]
    for e in a:
        tasks[e] = [names[1]]
    for e in b:
        tasks[e] = [names[2]]
    retask(root, tasks)
    ds = open_dataset(root)
    by_task = task_lengths(ds)
    assert len(np.unique(by_task[1])) == 10 and len(by_task[1]) == 10
    assert len(np.unique(by_task[2])) == 9 and len(by_task[2]) >= 10
    rows = compute_speed_rows(ds)
    assert rows[1]["percentiles"] == np.percentile(by_task[1], POINTS).tolist()
    assert rows[2]["percentiles"] is None
    assert rows[3]["n_episodes"] == 0 and rows[3]["percentiles"] is None


def test_tasks_are_independent(root):
    ds = open_dataset(root)
    rows = compute_speed_rows(ds)
    by_task = task_lengths(ds)
    short, long_ = sorted(range(4), key=lambda t: np.median(by_task[t]))[::3]
    n = int(by_task[short].max())  # the longest episode of the short task...
    assert bucket(n, rows[short]["percentiles"]) == 100
    assert bucket(n, rows[long_]["percentiles"]) == 0  # ...is a fast one of the long task
    # Moving episodes between two tasks leaves every other task's row unchanged.
    names = ds.task_strings()
    tasks = ds.episodes["tasks"].to_pylist()
    moved = [e for e, t in enumerate(ds.column("task_index")) if t == short][:5]
    for e in moved:
        tasks[e] = [names[long_]]
    retask(root, tasks)
    after = compute_speed_rows(open_dataset(root))
    for t in range(6):
        same = ("task_index", "task", "n_episodes", "percentiles")
        if t in (short, long_):
            assert after[t]["percentiles"] != rows[t]["percentiles"]
        else:
            assert {k: after[t][k] for k in same} == {k: rows[t][k] for k in same}


def test_multi_task_episode_uses_first_and_unresolved_is_skipped(root, caplog):
    ds = open_dataset(root)
    names = ds.task_strings()
    tasks = ds.episodes["tasks"].to_pylist()
    ti = ds.column("task_index")
    multi = int(np.flatnonzero(ti == 0)[0])
    tasks[multi] = [names[1], names[0]]  # counted under task 1
    unknown = [int(e) for e in np.flatnonzero(ti == 2)[:2]]
    tasks[unknown[0]] = ["a task that is not in tasks.parquet"]
    tasks[unknown[1]] = []
    retask(root, tasks)
    ds = open_dataset(root, check_totals=False)
    with caplog.at_level(logging.WARNING, logger="episodekit.metadata.speed"):
        rows = compute_speed_rows(ds)
    warnings = [r for r in caplog.records if "no resolvable task" in r.getMessage()]
    assert len(warnings) == 1 and "2 episodes have no" in warnings[0].getMessage()
    lengths = ds.column("length")
    assert (
        rows[1]["percentiles"]
        == np.percentile(lengths[ds.column("task_index") == 1], POINTS).tolist()
    )
    assert rows[1]["n_episodes"] == int((ti == 1).sum()) + 1
    assert rows[0]["n_episodes"] == int((ti == 0).sum()) - 1
    assert rows[2]["n_episodes"] == int((ti == 2).sum()) - 2
    buckets = episode_buckets(ds, rows)
    assert buckets[multi] == bucket(lengths[multi], rows[1]["percentiles"])
    assert buckets[unknown].tolist() == [50, 50]


def test_missing_task_gets_50(root):
    ds = open_dataset(root)
    rows = [r for r in compute_speed_rows(ds) if r["task_index"] != 1]
    buckets = episode_buckets(ds, rows)
    assert set(buckets[ds.column("task_index") == 1].tolist()) == {50}
    assert set(buckets[ds.column("task_index") == 0].tolist()) > {50}
    assert episode_buckets(ds, None).tolist() == [50] * ds.num_episodes
    assert episode_buckets(ds, []).tolist() == [50] * ds.num_episodes


# --- the file ---------------------------------------------------------------------------------


def test_round_trip_file_memory(root):
    ds = open_dataset(root)
    assert read_speed_file(root) is None
    rows = compute_speed_rows(ds)
    assert write_speed_file(ds, rows) is True
    assert read_speed_file(root) == rows
    assert read_speed_file(str(root)) == read_speed_file(ds)
    lines = file_text(root).splitlines()
    assert len(lines) == 6 and all(": " not in line and ", " not in line for line in lines)
    parsed = [json.loads(line) for line in lines]
    assert parsed == rows and [p["task_index"] for p in parsed] == list(range(6))
    assert episode_buckets(ds, read_speed_file(root)).tolist() == episode_buckets(ds, rows).tolist()
    assert temporaries(root) == []


def test_handwritten_file_is_read_verbatim(root):
    ds = open_dataset(root)
    # Only the four historical keys, integer boundaries, an extra key, no trailing newline.
    rows = [
        {
            "task_index": t,
            "task": name,
            "n_episodes": 1000,
            "percentiles": list(range(100, 200, 10)) if t < 3 else None,
        }
        for t, name in enumerate(ds.task_strings())
    ]
    rows[0]["note"] = "tuned by hand"
    text = "\n".join(json.dumps(r) for r in rows)
    (root / SPEED_FILE).write_text(text)
    assert read_speed_file(root) == rows
    assert load_or_compute(ds) == rows
    assert file_text(root) == text  # nothing was missing: the file is left alone
    buckets = episode_buckets(ds, rows)
    by_task = {r["task_index"]: r["percentiles"] for r in rows}
    ref = [bucket(n, by_task[t]) for t, n in zip(ds.column("task_index"), ds.column("length"))]
    assert buckets.tolist() == ref


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"task_index": 0, "task": "x", "n_episodes": 3\n', "not valid JSON"),
        ("[1, 2]\n", "expected a JSON object"),
        ('{"task_index": 0, "task": "x", "n_episodes": 3}\n', "missing keys ['percentiles']"),
        (
            '{"task_index": 0, "task": "x", "n_episodes": 3, "percentiles": [3, 2, 1, 4, 5, 6, 7, '
            "8, 9, 10]}\n",
            "ascending",
        ),
        ('{"task_index": 0, "task": "x", "n_episodes": 3, "percentiles": [1, 2]}\n', "finite"),
        (
            '{"task_index": 0, "task": "x", "n_episodes": 3, "percentiles": null, "version": 2}\n',
            "unsupported version 2",
        ),
        (
            '{"task_index": 0, "task": "x", "n_episodes": 3, "percentiles": null}\n'
            '{"task_index": 0, "task": "y", "n_episodes": 3, "percentiles": null}\n',
            "line 2: task_index 0 repeated",
        ),
    ],
)
def test_corrupt_file_is_a_clear_error(root, bad, message):
    (root / SPEED_FILE).write_text(bad)
    with pytest.raises(SpeedFileError, match="speed_percentiles.jsonl") as err:
        read_speed_file(root)
    assert message in str(err.value)
    with pytest.raises(SpeedFileError):
        ensure_speed_file(root)
    r = CliRunner().invoke(main, ["metadata", "speed", str(root)])
    assert r.exit_code == 1 and message in r.output and SPEED_FILE in r.output


def test_corrupt_file_runtime_computes_in_memory(root, caplog):
    (root / SPEED_FILE).write_text("not json\n")
    ds = open_dataset(root)
    with caplog.at_level(logging.WARNING, logger="episodekit.metadata.speed"):
        assert load_or_compute(ds) == compute_speed_rows(ds)
        assert load_or_compute(ds) == compute_speed_rows(ds)
    assert len([r for r in caplog.records if "not valid JSON" in r.getMessage()]) == 1
    assert file_text(root) == "not json\n"  # left for a human to look at
    rows, changed = ensure_speed_file(root, force=True)  # an explicit recompute repairs it
    assert changed and read_speed_file(root) == rows == compute_speed_rows(ds)


# --- staleness: batch path --------------------------------------------------------------------


def test_ensure_skips_fresh_and_recomputes_stale(root):
    rows, changed = ensure_speed_file(root)
    assert changed and read_speed_file(root) == rows
    before = os.stat(root / SPEED_FILE).st_ino
    assert ensure_speed_file(root) == (rows, False)
    assert os.stat(root / SPEED_FILE).st_ino == before  # not rewritten
    assert ensure_speed_file(root, force=True) == (rows, True)
    assert os.stat(root / SPEED_FILE).st_ino != before
    # Change the episodes (move one to another task): the fingerprint differs, the CLI recomputes.
    ds = open_dataset(root)
    tasks = ds.episodes["tasks"].to_pylist()
    tasks[0] = [ds.task_strings()[(int(ds.column("task_index")[0]) + 1) % 4]]
    retask(root, tasks)
    fresh = compute_speed_rows(open_dataset(root))
    assert fresh[0]["fingerprint"] != rows[0]["fingerprint"]
    assert ensure_speed_file(root) == (fresh, True)
    assert read_speed_file(root) == fresh
    # A file lacking a task row is not fresh either.
    (root / SPEED_FILE).write_text("\n".join(json.dumps(r) for r in fresh[:-1]) + "\n")
    assert ensure_speed_file(root) == (fresh, True)
    assert temporaries(root) == []


# --- the runtime path -------------------------------------------------------------------------


def subset(ds, keep: np.ndarray):
    """The same dataset restricted to some episodes (what a loader does for a subset)."""
    return dataclasses.replace(ds, episodes=ds.episodes.filter(pa.array(keep)))


def test_runtime_writes_when_absent_then_reads(root):
    ds = open_dataset(root)
    rows = load_or_compute(ds)
    assert rows == compute_speed_rows(ds) == read_speed_file(root)
    (root / SPEED_FILE).write_text(file_text(root).replace('"n_episodes":', '"n_episodes": '))
    assert load_or_compute(ds) == rows  # read, not recomputed or rewritten
    assert '"n_episodes": ' in file_text(root)


def test_runtime_subset_is_silent_and_added_warns_once_on_main(root, caplog, monkeypatch):
    full = open_dataset(root)
    part = subset(full, np.arange(full.num_episodes) < 150)
    full_rows = compute_speed_rows(full)
    write_speed_file(full, full_rows)
    with caplog.at_level(logging.WARNING, logger="episodekit.metadata.speed"):
        assert load_or_compute(part) == full_rows  # the file as it is, silently
        assert caplog.records == []
        # The file was computed from fewer episodes than there are now.
        part_rows = compute_speed_rows(part)
        write_speed_file(part, part_rows)
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert load_or_compute(full) == part_rows
        assert caplog.records == []  # not the main rank: silent
        monkeypatch.setenv("RANK", "0")
        assert load_or_compute(full) == part_rows
        assert load_or_compute(full) == part_rows
    stale = [r for r in caplog.records if "episodes were added" in r.getMessage()]
    assert len(stale) == 1 and str(root) in stale[0].getMessage()
    assert read_speed_file(root) == part_rows


def test_runtime_appends_missing_tasks_keeping_rows_verbatim(root):
    ds = open_dataset(root)
    rows = compute_speed_rows(ds)
    kept = [dict(r) for r in rows if r["task_index"] not in (1, 5)]
    kept[0]["percentiles"] = [float(x) for x in range(10)]  # hand-tuned: must survive
    kept[0]["fingerprint"] = "older"
    (root / SPEED_FILE).write_text("".join(json.dumps(r) + "\n" for r in kept))
    out = load_or_compute(ds)
    assert [r["task_index"] for r in out] == list(range(6))
    assert [r for r in out if r["task_index"] not in (1, 5)] == kept
    assert out[1] == rows[1] and out[5] == rows[5]
    assert read_speed_file(root) == out
    assert temporaries(root) == []


def test_runtime_subset_appends_only_tasks_it_has(root):
    full = open_dataset(root)
    rows = compute_speed_rows(full)
    part = subset(full, full.column("task_index") != 2)
    kept = [r for r in rows if r["task_index"] not in (0, 2)]
    (root / SPEED_FILE).write_text("".join(json.dumps(r) + "\n" for r in kept))
    out = load_or_compute(part)  # task 0 is appended; task 2 has no episodes here: left out
    assert [r["task_index"] for r in out] == [0, 1, 3, 4, 5]
    assert out[0]["percentiles"] == rows[0]["percentiles"]
    assert out[0]["fingerprint"] == part.fingerprint != full.fingerprint
    assert out[1:] == kept and read_speed_file(root) == out


def test_rank_gating_by_environment(root, monkeypatch):
    ds = open_dataset(root)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert load_or_compute(ds) == compute_speed_rows(ds)
    assert write_speed_file(ds, compute_speed_rows(ds)) is False
    assert not (root / SPEED_FILE).exists()
    monkeypatch.setenv("RANK", "0")
    assert load_or_compute(ds) == read_speed_file(root) == compute_speed_rows(ds)


def _readonly_by_chmod(root: Path, monkeypatch) -> None:
    if os.geteuid() == 0:
        pytest.skip("running as root: chmod does not prevent writes (see the 'patched' case)")
    (root / "meta").chmod(0o555)


def _readonly_by_patch(root: Path, monkeypatch) -> None:
    def refuse(src, dst):
        raise OSError(errno.EROFS, "Read-only file system", str(dst))

    monkeypatch.setattr(atomic.os, "replace", refuse)


@pytest.mark.parametrize("make_readonly", [_readonly_by_chmod, _readonly_by_patch])
def test_read_only_root_keeps_result_in_memory(root, monkeypatch, caplog, make_readonly):
    ds = open_dataset(root)
    make_readonly(root, monkeypatch)
    try:
        with caplog.at_level(logging.WARNING, logger="episodekit.metadata.speed"):
            assert load_or_compute(ds) == compute_speed_rows(ds)
            assert load_or_compute(ds) == compute_speed_rows(ds)
            assert ensure_speed_file(root) == (compute_speed_rows(ds), False)
    finally:
        (root / "meta").chmod(0o755)
    assert not (root / SPEED_FILE).exists()
    assert temporaries(root) == []
    warned = [r for r in caplog.records if "read-only root" in r.getMessage()]
    assert len(warned) == 1 and str(root) in warned[0].getMessage()


def test_other_write_errors_propagate(root, monkeypatch):
    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr(atomic.os, "replace", full_disk)
    # One clear error naming the file and the operation; exit 2 (environment) in the CLI.
    with pytest.raises(
        EnvironmentProblem, match="speed_percentiles.jsonl: cannot replace: No space"
    ):
        ensure_speed_file(root)
    assert temporaries(root) == [] and not (root / SPEED_FILE).exists()


def test_remote_root_is_read_only(root, caplog):
    import fsspec

    mem = fsspec.filesystem("memory")
    url = f"memory://speed-{os.getpid()}-{root.name}"
    mem.put(str(root), url, recursive=True)
    try:
        ds = open_dataset(url)
        with caplog.at_level(logging.WARNING, logger="episodekit.metadata.speed"):
            rows = load_or_compute(ds)
        assert rows == compute_speed_rows(ds)
        assert [r["percentiles"] for r in rows] == [
            r["percentiles"] for r in compute_speed_rows(open_dataset(root))
        ]
        assert not mem.exists(f"{url}/{SPEED_FILE}")
        assert any("remote root" in r.getMessage() for r in caplog.records)
        # A file already on the remote is read from there.
        row = b'{"task_index":0,"task":"x","n_episodes":1,"percentiles":null}'
        mem.pipe(f"{url}/{SPEED_FILE}", row)
        assert read_speed_file(url)[0]["task"] == "x"
    finally:
        mem.rm(url, recursive=True)


# --- the CLI ----------------------------------------------------------------------------------


def test_cli_table_json_and_recompute(root):
    runner = CliRunner()
    r = runner.invoke(main, ["metadata", "speed", str(root)])
    assert r.exit_code == 0, r.output
    assert "written" in r.output and "sparse" in r.output
    assert "open the top drawer" in r.output
    r = runner.invoke(main, ["metadata", "speed", str(root), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    ds = open_dataset(root)
    rows = compute_speed_rows(ds)
    assert d["status"] == "fresh" and d["fingerprint"] == ds.fingerprint
    assert [t["episodes"] for t in d["tasks"]] == [r["n_episodes"] for r in rows]
    assert [t["sparse"] for t in d["tasks"]] == [False] * 4 + [True] * 2
    t0 = d["tasks"][0]
    lengths = task_lengths(ds)[0]
    assert t0["p5"] == rows[0]["percentiles"][0] and t0["p95"] == rows[0]["percentiles"][-1]
    assert t0["p50"] == float(np.median(lengths))
    assert t0["distinct_lengths"] == len(np.unique(lengths))
    r = runner.invoke(main, ["metadata", "speed", str(root), "--json", "--force"])
    assert json.loads(r.output)["status"] == "written"
    # The old spelling still works for one release, with a deprecation message on stderr.
    r = runner.invoke(main, ["metadata", "speed", str(root), "--recompute"])
    assert r.exit_code == 0 and "written" in r.output
    assert "--recompute is deprecated, use --force" in r.stderr
    r = runner.invoke(main, ["metadata", "speed", "--help"])
    assert r.exit_code == 0 and "--force" in r.output and "fingerprint" in r.output
    assert "--recompute" not in r.output
    r = runner.invoke(main, ["metadata", "speed", str(root / "nope")])
    assert r.exit_code == 2 and "no such folder" in r.output


def test_buckets_for_large_and_unknown_task_indices():
    # Task indices far beyond the episode count take the searchsorted path, small ones the table.
    rows = [
        {"task_index": 10**9, "percentiles": [float(x) for x in range(10, 110, 10)]},
        {"task_index": 7, "percentiles": [float(x) for x in range(1, 11)]},
        {"task_index": 3, "percentiles": None},
    ]
    for ti in ([10**9, 7, 3, -1, 8, 10**9], [7, 7, 3, -1, 8, 2]):
        lengths = [55, 55, 55, 55, 55, 10]
        by_task = {r["task_index"]: r["percentiles"] for r in rows}
        ref = [bucket(n, by_task.get(t)) for t, n in zip(ti, lengths)]
        assert speed.buckets_for(np.array(ti), np.array(lengths), rows).tolist() == ref
    assert ref == [100, 100, 50, 50, 50, 50]


def test_tasks_with_equal_counts_share_one_percentile_call(root):
    ds = open_dataset(root)
    names = ds.task_strings()
    retask(root, [[names[e % 5]] for e in range(ds.num_episodes)])  # five tasks of 40 episodes
    ds = open_dataset(root, check_totals=False)
    rows = compute_speed_rows(ds)
    by_task = task_lengths(ds)
    assert [len(by_task[t]) for t in range(5)] == [40] * 5
    for t in range(5):
        assert rows[t]["percentiles"] == np.percentile(by_task[t], POINTS).tolist()
    assert rows[5]["n_episodes"] == 0 and rows[5]["percentiles"] is None


def test_sort_by_task_then_length_paths_agree():
    rng = np.random.default_rng(1)
    ti, length = rng.integers(0, 50, 1000), rng.integers(0, 3000, 1000)
    t, v = speed._sort_by_task_then_length(ti, length)  # one key sort
    big_t, big_v = speed._sort_by_task_then_length(ti + 2**40, length)  # lexsort fallback
    order = np.lexsort((length, ti))
    assert t.tolist() == ti[order].tolist() and v.tolist() == length[order].tolist()
    assert (big_t - 2**40).tolist() == t.tolist() and big_v.tolist() == v.tolist()
