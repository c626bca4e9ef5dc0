"""A corpus of dataset corruptions for the validator's tests.

Each ``corrupt_*`` function takes a private copy of a clean v3.0 sample (several data files, one
episodes file), breaks it in one specific way with plain pyarrow, and returns an
:class:`Expected`: the check that must fire, with the file (relative to the root) and episode it
must name. ``also`` lists checks that legitimately fire as a consequence (a shifted range in the
episodes table also disagrees with the data's index, for instance); any other error is a defect.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

INFO = "meta/info.json"
EPISODES = "meta/episodes/chunk-000/file-000.parquet"
TASKS = "meta/tasks.parquet"

# The clean sample the corpus is written for: 30 episodes over 3 data files, 3 tasks (two with
# enough distinct lengths for speed percentiles, so the speed file has non-null boundaries).
SAMPLE_SPEC = {"episodes": 30, "tasks": 3, "seed": 3, "data_files_size_in_mb": 0.5}
SPEED = "meta/speed_percentiles.jsonl"
COSTS = "meta/episode_costs.parquet"
PLAN = "meta/shard_plans/ws2_nw2.json"


@dataclass(frozen=True)
class Expected:
    check: str
    file: str | None
    episode: int | None = None
    also: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------
# Helpers: read-modify-write of the raw files.


def edit_info(root: Path, **changes) -> None:
    info = json.loads((root / INFO).read_text())
    info.update(changes)
    (root / INFO).write_text(json.dumps(info, indent=4))


def edit_episodes(root: Path, fn: Callable[[pa.Table], pa.Table]) -> None:
    path = root / EPISODES
    pq.write_table(fn(pq.read_table(path)), path)


def data_file_of(root: Path, episode: int) -> str:
    """Relative data file path of an episode (from the clean episodes table)."""
    t = pq.read_table(
        root / EPISODES, columns=["episode_index", "data/chunk_index", "data/file_index"]
    )
    i = t["episode_index"].to_pylist().index(episode)
    c, f = t["data/chunk_index"][i].as_py(), t["data/file_index"][i].as_py()
    return f"data/chunk-{c:03d}/file-{f:03d}.parquet"


def edit_data(root: Path, rel: str, fn: Callable[[pa.Table], pa.Table]) -> None:
    path = root / rel
    table = pq.read_table(path)
    out = fn(table)
    pq.write_table(out.replace_schema_metadata(table.schema.metadata), path)


def set_column(table: pa.Table, name: str, values) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, table.schema.field(i), pa.array(values, table.schema.field(i).type))


def rows_of(table: pa.Table, episode: int) -> np.ndarray:
    return np.flatnonzero(table["episode_index"].to_numpy() == episode)


def edit_episode_rows(root: Path, episode: int, column: str, change) -> str:
    """Apply ``change(values, rows)`` to a scalar column of one episode's rows; return the file."""
    rel = data_file_of(root, episode)

    def fn(t: pa.Table) -> pa.Table:
        values = t[column].to_numpy().copy()
        change(values, rows_of(t, episode))
        return set_column(t, column, values)

    edit_data(root, rel, fn)
    return rel


# ---------------------------------------------------------------------------------------------
# The corpus.


def corrupt_total_frames(root: Path) -> Expected:
    info = json.loads((root / INFO).read_text())
    edit_info(root, total_frames=info["total_frames"] + 7)
    return Expected("info.totals", INFO)


def corrupt_fps(root: Path) -> Expected:
    edit_info(root, fps=25)
    return Expected("info.fps", INFO)


def corrupt_codebase_version(root: Path) -> Expected:
    edit_info(root, codebase_version="v9.9")
    return Expected("info.version", INFO)


def corrupt_feature_missing(root: Path) -> Expected:
    rel = data_file_of(root, 6)
    edit_data(root, rel, lambda t: t.drop_columns(["observation.state"]))
    return Expected("info.features", rel)


def corrupt_names_length(root: Path) -> Expected:
    """A joint dropped from the action's names (13 names for 14 dimensions)."""
    info = json.loads((root / INFO).read_text())
    info["features"]["action"]["names"] = info["features"]["action"]["names"][:-1]
    (root / INFO).write_text(json.dumps(info, indent=4))
    return Expected("info.names", INFO)


def corrupt_tasks_table(root: Path) -> Expected:
    t = pq.read_table(root / TASKS)
    idx = t["task_index"].to_numpy().copy()
    idx[-1] = 7
    pq.write_table(set_column(t, "task_index", idx), root / TASKS)
    # Episodes of the last task still resolve by string; their task_index is now 7 in the table.
    return Expected("tasks.table", TASKS, also=("data.task_index",))


def corrupt_episodes_gap(root: Path) -> Expected:
    def fn(t: pa.Table) -> pa.Table:
        shift = np.where(t["episode_index"].to_numpy() >= 5, 10, 0)
        t = set_column(t, "dataset_from_index", t["dataset_from_index"].to_numpy() + shift)
        return set_column(t, "dataset_to_index", t["dataset_to_index"].to_numpy() + shift)

    edit_episodes(root, fn)
    return Expected("episodes.ranges", EPISODES, 5, also=("data.index",))


def corrupt_length(root: Path) -> Expected:
    def fn(t: pa.Table) -> pa.Table:
        length = t["length"].to_numpy().copy()
        length[3] += 1
        return set_column(t, "length", length)

    edit_episodes(root, fn)
    return Expected(
        "episodes.length", EPISODES, 3, also=("data.rows", "info.totals", "stats.count")
    )


def corrupt_episode_duplicated(root: Path) -> Expected:
    def fn(t: pa.Table) -> pa.Table:
        ep = t["episode_index"].to_numpy().copy()
        ep[4] = 3
        return set_column(t, "episode_index", ep)

    edit_episodes(root, fn)
    return Expected("episodes.index", EPISODES, 3, also=("data.file",))


def corrupt_episode_order(root: Path) -> Expected:
    def fn(t: pa.Table) -> pa.Table:
        order = np.arange(t.num_rows)
        order[[2, 3]] = [3, 2]
        return t.take(pa.array(order))

    edit_episodes(root, fn)
    return Expected("episodes.index", EPISODES, 3, also=("episodes.ranges",))


def corrupt_unknown_task(root: Path) -> Expected:
    def fn(t: pa.Table) -> pa.Table:
        tasks = t["tasks"].to_pylist()
        tasks[2] = ["dance the robot dance"]
        i = t.schema.get_field_index("tasks")
        return t.set_column(i, t.schema.field(i), pa.array(tasks, t.schema.field(i).type))

    edit_episodes(root, fn)
    return Expected("episodes.tasks", EPISODES, 2, also=("data.task_index",))


def corrupt_data_file_deleted(root: Path) -> Expected:
    rel = data_file_of(root, 11)
    (root / rel).unlink()
    t = pq.read_table(root / EPISODES)
    first = next(e for e in t["episode_index"].to_pylist() if data_file_of(root, e) == rel)
    return Expected("info.paths", rel, first)


def corrupt_unreferenced_file(root: Path) -> Expected:
    rel = "data/chunk-000/file-099.parquet"
    shutil.copy(root / data_file_of(root, 0), root / rel)
    return Expected("info.unreferenced", rel)


def corrupt_row_deleted(root: Path) -> Expected:
    rel = data_file_of(root, 7)

    def fn(t: pa.Table) -> pa.Table:
        keep = np.ones(t.num_rows, dtype=bool)
        keep[rows_of(t, 7)[10]] = False
        return t.filter(pa.array(keep))

    edit_data(root, rel, fn)
    return Expected("data.rows", rel, 7)


def corrupt_index_shifted(root: Path) -> Expected:
    rel = edit_episode_rows(root, 6, "index", lambda v, r: v.__setitem__(r, v[r] + 1))
    return Expected("data.index", rel, 6)


def corrupt_frame_index(root: Path) -> Expected:
    rel = edit_episode_rows(root, 5, "frame_index", lambda v, r: v.__setitem__(r[4], 0))
    return Expected("data.frame_index", rel, 5)


def corrupt_timestamp(root: Path) -> Expected:
    rel = edit_episode_rows(root, 8, "timestamp", lambda v, r: v.__setitem__(r[3], v[r[3]] + 0.5))
    return Expected("data.timestamp", rel, 8)


def corrupt_task_index(root: Path) -> Expected:
    def change(values, rows):
        values[rows] = (values[rows[0]] + 1) % 3

    rel = edit_episode_rows(root, 9, "task_index", change)
    return Expected("data.task_index", rel, 9)


def _edit_list_column(root: Path, episode: int, column: str, nan: bool) -> str:
    rel = data_file_of(root, episode)

    def fn(t: pa.Table) -> pa.Table:
        col = t[column].combine_chunks()
        d = col.type.list_size
        row = int(rows_of(t, episode)[2])
        values = col.values.to_numpy().copy()
        if nan:
            values[row * d + 1] = np.nan
            arr = pa.FixedSizeListArray.from_arrays(pa.array(values), d)
        else:
            mask = np.zeros(len(col), dtype=bool)
            mask[row] = True
            arr = pa.FixedSizeListArray.from_arrays(pa.array(values), d, mask=pa.array(mask))
        i = t.schema.get_field_index(column)
        return t.set_column(i, t.schema.field(i), arr)

    edit_data(root, rel, fn)
    return rel


def corrupt_nan_in_action(root: Path) -> Expected:
    return Expected("data.nan", _edit_list_column(root, 10, "action", nan=True), 10)


def corrupt_null_in_state(root: Path) -> Expected:
    return Expected("data.nulls", _edit_list_column(root, 11, "observation.state", nan=False), 11)


def corrupt_null_timestamp(root: Path) -> Expected:
    rel = data_file_of(root, 1)

    def fn(t: pa.Table) -> pa.Table:
        ts = t["timestamp"].to_pylist()
        ts[int(rows_of(t, 1)[5])] = None
        return set_column(t, "timestamp", ts)

    edit_data(root, rel, fn)
    return Expected("data.nulls", rel, 1)


def corrupt_rows_in_wrong_file(root: Path) -> Expected:
    """Episode 0's rows also copied into the next data file (duplicated data)."""
    src = data_file_of(root, 0)
    dst = next(data_file_of(root, e) for e in range(12) if data_file_of(root, e) != src)
    extra = pq.read_table(root / src)
    extra = extra.filter(pc.equal(extra["episode_index"], 0))
    edit_data(root, dst, lambda t: pa.concat_tables([t, extra.cast(t.schema)]))
    return Expected("data.file", dst, 0)


def corrupt_episodes_swapped_in_file(root: Path) -> Expected:
    """Episode 3's rows placed before episode 2's in their file, every value (index too) kept:
    per-episode aggregates are all right, only the order in the file is wrong (the loader would
    return episode 3's frames for episode 2)."""
    rel = data_file_of(root, 2)
    assert data_file_of(root, 3) == rel

    def fn(t: pa.Table) -> pa.Table:
        r2, r3 = rows_of(t, 2), rows_of(t, 3)
        order = np.arange(t.num_rows)
        lo, hi = r2[0], r3[-1] + 1
        order[lo:hi] = np.concatenate([r3, r2])
        return t.take(pa.array(order))

    edit_data(root, rel, fn)
    return Expected("data.order", rel, 2)


def corrupt_action_wrong_length(root: Path) -> Expected:
    """One action row of the wrong list length (a variable-length list column)."""
    rel = data_file_of(root, 4)

    def fn(t: pa.Table) -> pa.Table:
        col = t["action"].combine_chunks()
        rows = col.to_pylist()
        rows[int(rows_of(t, 4)[3])] = rows[int(rows_of(t, 4)[3])][:-1]
        i = t.schema.get_field_index("action")
        field = pa.field("action", pa.list_(col.type.value_type))
        return t.set_column(i, field, pa.array(rows, field.type))

    edit_data(root, rel, fn)
    return Expected("data.shape", rel, 4, also=("info.features",))


# ---------------------------------------------------------------------------------------------
# Artifacts: written by their own modules on the clean copy, then broken.


def write_artifacts(root: Path) -> None:
    """Speed percentiles, the cost table and one shard plan (world size 2 x 2 workers)."""
    from episodekit.metadata.plans.build import ensure_plans
    from episodekit.metadata.speed import ensure_speed_rows

    ensure_speed_rows(str(root))
    ensure_plans(str(root), [2], 2)


def _speed_rows(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / SPEED).read_text().splitlines() if line]


def _write_speed_rows(root: Path, rows: list[dict]) -> None:
    (root / SPEED).write_text("".join(json.dumps(r) + "\n" for r in rows))


def corrupt_speed_descending(root: Path) -> Expected:
    write_artifacts(root)
    rows = _speed_rows(root)
    dense = next(r for r in rows if r["percentiles"] is not None)
    dense["percentiles"] = dense["percentiles"][::-1]
    _write_speed_rows(root, rows)
    return Expected("speed.content", SPEED)


def corrupt_speed_stale(root: Path) -> Expected:
    write_artifacts(root)
    rows = _speed_rows(root)
    for r in rows:
        r["fingerprint"] = "0" * 32
    _write_speed_rows(root, rows)
    return Expected("speed.fresh", SPEED)


def corrupt_speed_null_for_dense_task(root: Path) -> Expected:
    write_artifacts(root)
    rows = _speed_rows(root)
    next(r for r in rows if r["percentiles"] is not None)["percentiles"] = None
    _write_speed_rows(root, rows)
    return Expected("speed.content", SPEED)


def corrupt_speed_unparseable(root: Path) -> Expected:
    write_artifacts(root)
    (root / SPEED).write_text('{"task_index": 0,\n')
    return Expected("speed.format", SPEED)


def corrupt_costs_missing_episode(root: Path) -> Expected:
    write_artifacts(root)
    t = pq.read_table(root / COSTS)
    t = t.filter(pc.not_equal(t["episode_index"], 4))
    pq.write_table(t, root / COSTS)
    # The plan was built from the full table: its balance figures no longer match either.
    return Expected("costs.content", COSTS, 4, also=("plans.content",))


def corrupt_costs_value(root: Path) -> Expected:
    write_artifacts(root)
    t = pq.read_table(root / COSTS)
    cost = t["cost"].to_numpy().copy()
    cost[9] *= 3
    pq.write_table(set_column(t, "cost", cost), root / COSTS)
    return Expected("costs.content", COSTS, 9, also=("plans.content",))


def _edit_plan(root: Path, fn: Callable[[dict], None], redigest: bool = True) -> None:
    """Edit the plan's JSON; ``redigest``: record the edited items' digest too (a careful editor;
    the content checks must still catch it)."""
    from episodekit.metadata.plans.plan_file import ITEM_COLUMNS, items_digest

    doc = json.loads((root / PLAN).read_text())
    fn(doc)
    if redigest:
        cols = [np.asarray(doc["items"][c], dtype=np.int64) for c in ITEM_COLUMNS]
        doc["items"]["digest"] = items_digest(cols)
    (root / PLAN).write_text(json.dumps(doc))


def corrupt_plan_items_edited(root: Path) -> Expected:
    """Items moved between bins behind an unchanged fingerprint and digest: refused on load."""
    write_artifacts(root)

    def fn(doc: dict) -> None:
        items = doc["items"]
        items["episode_index"][0], items["episode_index"][-1] = (
            items["episode_index"][-1],
            items["episode_index"][0],
        )

    _edit_plan(root, fn, redigest=False)
    return Expected("plans.format", PLAN)


def corrupt_plan_missing_episode(root: Path) -> Expected:
    write_artifacts(root)

    def fn(doc: dict) -> None:
        items = doc["items"]
        i = items["episode_index"].index(4)
        for c in ("episode_index", "start", "end"):
            del items[c][i]
        items["count"] -= 1
        doc["bin_offsets"] = [o - (o > i) for o in doc["bin_offsets"]]

    _edit_plan(root, fn)
    return Expected("plans.content", PLAN, 4)


def corrupt_plan_balance(root: Path) -> Expected:
    write_artifacts(root)

    def fn(doc: dict) -> None:
        doc["balance"]["plan"]["max_over_lower_bound"] = 1.0 + 0.5

    _edit_plan(root, fn)
    return Expected("plans.content", PLAN)


def corrupt_plan_stale(root: Path) -> Expected:
    write_artifacts(root)
    _edit_plan(root, lambda doc: doc.__setitem__("fingerprint", "f" * 32))
    return Expected("plans.fresh", PLAN)


CORRUPTIONS: dict[str, Callable[[Path], Expected]] = {
    name[len("corrupt_") :]: fn
    for name, fn in sorted(globals().items())
    if name.startswith("corrupt_") and callable(fn)
}


# =============================================================================================
# Data-quality corruptions (``quality.*``, warnings): kept out of CORRUPTIONS above, whose test
# expects exit code 1. Each ``quality_*`` function breaks a private copy of QUALITY_SPEC's sample
# in one behavioural way and returns a QualityExpected naming the check, file, episode and
# feature that must be reported. ``also`` lists checks that legitimately fire too.

# 80 episodes (so the shift and rare-task checks have enough), 3 tasks (~27 episodes each, so
# per-task length outliers are judged), several data files, short episodes to stay fast.
QUALITY_SPEC = {
    "episodes": 80,
    "tasks": 3,
    "seed": 5,
    "mean_length": 120,
    "data_files_size_in_mb": 1.0,
}


@dataclass(frozen=True)
class QualityExpected:
    check: str
    file: str | None
    episode: int | None
    feature: str | None = None
    also: tuple[str, ...] = ()


def _matrix_of(t: pa.Table, column: str) -> np.ndarray:
    col = t[column].combine_chunks()
    return col.values.to_numpy().reshape(len(col), col.type.list_size).copy()


def _with_matrix(t: pa.Table, column: str, x: np.ndarray) -> pa.Table:
    i = t.schema.get_field_index(column)
    d = x.shape[1]
    arr = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1).astype(np.float32)), d)
    return t.set_column(i, t.schema.field(i), arr)


def edit_signal(root: Path, episode: int, column: str, change, rel: str | None = None) -> str:
    """Apply ``change(x)`` in place to the (frames, d) values of one episode's list column
    (``rel``: its data file, when the root has several episodes files)."""
    rel = rel or data_file_of(root, episode)

    def fn(t: pa.Table) -> pa.Table:
        x = _matrix_of(t, column)
        rows = rows_of(t, episode)
        part = x[rows]
        change(part)
        x[rows] = part
        return _with_matrix(t, column, x)

    edit_data(root, rel, fn)
    return rel


def episode_lengths(root: Path) -> np.ndarray:
    return pq.read_table(root / EPISODES, columns=["length"])["length"].to_numpy()


def resize_last_episode(root: Path, rows_fn: Callable[[pa.Table], pa.Table]) -> tuple[str, int]:
    """Replace the last episode's rows by ``rows_fn(its rows)`` (any count), renumbering
    frame_index / index / timestamp and fixing the episodes table and info totals, so that only
    the behaviour changes, never the structure. Returns (file, episode)."""
    lengths = episode_lengths(root)
    last = len(lengths) - 1
    rel = data_file_of(root, last)
    fps = json.loads((root / INFO).read_text())["fps"]

    def fn(t: pa.Table) -> pa.Table:
        rows = rows_of(t, last)
        assert rows[-1] == t.num_rows - 1, "the last episode ends its file"
        new = rows_fn(t.slice(int(rows[0]), len(rows)))
        n = new.num_rows
        start = t["index"][int(rows[0])].as_py()
        new = set_column(new, "frame_index", np.arange(n, dtype=np.int64))
        new = set_column(new, "index", np.arange(start, start + n, dtype=np.int64))
        new = set_column(new, "timestamp", (np.arange(n) / fps).astype(np.float32))
        return pa.concat_tables([t.slice(0, int(rows[0])), new.cast(t.schema)])

    edit_data(root, rel, fn)
    new_len = pq.read_table(root / rel, columns=["episode_index"])["episode_index"].to_numpy()
    n = int((new_len == last).sum())

    def ep_fn(t: pa.Table) -> pa.Table:
        length = t["length"].to_numpy().copy()
        to = t["dataset_to_index"].to_numpy().copy()
        to[last] += n - length[last]
        length[last] = n
        return set_column(set_column(t, "length", length), "dataset_to_index", to)

    edit_episodes(root, ep_fn)
    info = json.loads((root / INFO).read_text())
    edit_info(root, total_frames=info["total_frames"] + n - int(lengths[last]))
    return rel, last


def quality_frozen_action(root: Path) -> QualityExpected:
    rel = edit_signal(root, 5, "action", lambda x: x.__setitem__(slice(None), x[0]))
    return QualityExpected("quality.frozen", rel, 5, "action")


def quality_frozen_run(root: Path) -> QualityExpected:
    ep = int(np.argmax(episode_lengths(root)))  # long enough for a 4 s run mid-episode

    def change(x):  # a 4 s pause at frame 20, then the motion resumes where it stopped
        x[:] = np.concatenate([x[:20], np.repeat(x[20:21], 120, axis=0), x[20:-120]])

    rel = edit_signal(root, ep, "observation.state", change)
    return QualityExpected("quality.frozen_run", rel, ep, "observation.state")


def quality_spike(root: Path) -> QualityExpected:
    rel = edit_signal(root, 9, "action", lambda x: x.__setitem__((10, 3), 1000.0))
    return QualityExpected(
        "quality.jump", rel, 9, "action", also=("quality.out_of_range", "quality.action_range")
    )


def quality_offset(root: Path) -> QualityExpected:
    def change(x):  # a smooth 40-frame excursion to +10 (the rest of the episode untouched)
        x[10:50, 2] += 10.0 * np.sin(np.linspace(0, np.pi, 40)) ** 2

    ep = int(np.argmax(episode_lengths(root)))
    rel = edit_signal(root, ep, "observation.state", change)
    return QualityExpected(
        "quality.out_of_range", rel, ep, "observation.state", also=("quality.jump",)
    )


def quality_clipping(root: Path) -> QualityExpected:
    def change(x):  # an oscillating joint saturating at +-0.3 around its mean
        t = np.arange(len(x)) / len(x)
        mid = x[:, 1].mean()
        x[:, 1] = mid + np.clip(0.5 * np.sin(2 * np.pi * 3 * t), -0.3, 0.3)

    rel = edit_signal(root, 13, "action", change)
    return QualityExpected("quality.clipping", rel, 13, "action")


def quality_dead_dimension(root: Path) -> QualityExpected:
    for p in sorted(root.glob("data/*/*.parquet")):
        rel = str(p.relative_to(root))

        def fn(t: pa.Table) -> pa.Table:
            x = _matrix_of(t, "observation.state")
            x[:, 5] = 0.0
            return _with_matrix(t, "observation.state", x)

        edit_data(root, rel, fn)
    return QualityExpected("quality.dead_dimension", None, None, "observation.state")


def quality_action_outside_state(root: Path) -> QualityExpected:
    def change(x):
        x[:, 4] += 5.0

    rel = edit_signal(root, 37, "action", change)
    return QualityExpected(
        "quality.action_range", rel, 37, "action", also=("quality.out_of_range",)
    )


def quality_dropped_frames(root: Path) -> QualityExpected:
    rel = edit_episode_rows(
        root, 19, "timestamp", lambda v, r: v.__setitem__(r[10:], v[r[10:]] + 3 / 30)
    )
    return QualityExpected("quality.dropped_frames", rel, 19, "timestamp", also=("data.timestamp",))


def quality_slow_clock(root: Path) -> QualityExpected:
    rel = edit_episode_rows(root, 21, "timestamp", lambda v, r: v.__setitem__(r, v[r] * 1.2))
    return QualityExpected("quality.frame_interval", rel, 21, "timestamp", also=("data.timestamp",))


def quality_empty_episode(root: Path) -> QualityExpected:
    rel = data_file_of(root, 23)

    def fn(t: pa.Table) -> pa.Table:
        keep = np.ones(t.num_rows, dtype=bool)
        keep[rows_of(t, 23)] = False
        return t.filter(pa.array(keep))

    edit_data(root, rel, fn)
    return QualityExpected("quality.empty_episode", rel, 23, None, also=("data.rows",))


def quality_single_frame(root: Path) -> QualityExpected:
    rel, ep = resize_last_episode(root, lambda t: t.slice(0, 1))
    return QualityExpected("quality.single_frame", rel, ep, None, also=("quality.length_outlier",))


def quality_long_episode(root: Path) -> QualityExpected:
    # Twelve times longer, played forth and back so the signal stays continuous.
    rel, ep = resize_last_episode(
        root,
        lambda t: pa.concat_tables(
            [t if k % 2 == 0 else t.take(pa.array(np.arange(t.num_rows)[::-1])) for k in range(12)]
        ),
    )
    return QualityExpected("quality.length_outlier", rel, ep, None)


def quality_duplicate(root: Path) -> QualityExpected:
    tasks = pq.read_table(root / EPISODES, columns=["tasks"])["tasks"].to_pylist()
    src = tasks.index(tasks[-1])  # the first episode of the last one's task: a plausible length
    src_rel = data_file_of(root, src)
    t = pq.read_table(root / src_rel)
    rows = rows_of(t, src)
    copy = t.slice(int(rows[0]), len(rows))

    def fn(last: pa.Table) -> pa.Table:
        out = copy
        for c in ("episode_index", "task_index"):
            out = set_column(out, c, np.full(copy.num_rows, last[c][0].as_py()))
        return out

    rel, ep = resize_last_episode(root, fn)
    return QualityExpected("quality.duplicate", rel, ep, "action")


def quality_placeholder_task(root: Path) -> QualityExpected:
    t = pq.read_table(root / TASKS)
    col = [c for c in t.column_names if c != "task_index"][0]
    old = t[col][1].as_py()
    names = t[col].to_pylist()
    names[1] = "TODO"
    i = t.schema.get_field_index(col)
    t = t.set_column(i, t.schema.field(i), pa.array(names))
    pq.write_table(t, root / TASKS)

    def fn(e: pa.Table) -> pa.Table:
        tasks = [["TODO" if s == old else s for s in ts] for ts in e["tasks"].to_pylist()]
        i = e.schema.get_field_index("tasks")
        return e.set_column(i, e.schema.field(i), pa.array(tasks, e.schema.field(i).type))

    edit_episodes(root, fn)
    return QualityExpected("quality.task_placeholder", TASKS, None, None)


def quality_rare_task(root: Path) -> QualityExpected:
    ep = 30
    t = pq.read_table(root / TASKS)
    col = [c for c in t.column_names if c != "task_index"][0]
    n = t.num_rows
    extra = pa.table({"task_index": pa.array([n], pa.int64()), col: pa.array(["wave goodbye"])})
    pq.write_table(
        pa.concat_tables([t, extra.select(t.column_names)]).replace_schema_metadata(
            t.schema.metadata
        ),
        root / TASKS,
    )

    def fn(e: pa.Table) -> pa.Table:
        tasks = e["tasks"].to_pylist()
        tasks[ep] = ["wave goodbye"]
        i = e.schema.get_field_index("tasks")
        return e.set_column(i, e.schema.field(i), pa.array(tasks, e.schema.field(i).type))

    edit_episodes(root, fn)
    edit_episode_rows(root, ep, "task_index", lambda v, r: v.__setitem__(r, n))
    edit_info(root, total_tasks=n + 1)
    return QualityExpected("quality.task_rare", None, None, None)


def quality_shift(root: Path) -> QualityExpected:
    lengths = episode_lengths(root)
    last_quarter = range(len(lengths) - len(lengths) // 4, len(lengths))
    for ep in last_quarter:

        def change(x):
            x[:, 0] += 2.0

        edit_signal(root, ep, "observation.state", change)
    return QualityExpected(
        "quality.shift", None, None, "observation.state", also=("quality.drift",)
    )


def _from_episode(root: Path, first: int, column: str, change) -> str:
    """Apply ``change(x)`` to every episode from ``first`` on; the file of ``first``."""
    for ep in range(first, len(episode_lengths(root))):
        edit_signal(root, ep, column, change)
    return data_file_of(root, first)


def quality_channels_swapped(root: Path) -> QualityExpected:
    """A robot whose last channel is its gripper (0-100 %, action and state): from episode 50 on
    the state's gripper and first joint channels are swapped (a re-mapped driver)."""
    for p in sorted(root.glob("data/*/*.parquet")):

        def gripper(t: pa.Table) -> pa.Table:
            for column in ("action", "observation.state"):
                x = _matrix_of(t, column)
                x[:, 13] = 50.0 + 50.0 * (x[:, 13] - 1.0)  # home 1.0 -> 50 %
                t = _with_matrix(t, column, x)
            return t

        edit_data(root, str(p.relative_to(root)), gripper)
    rel = _from_episode(root, 50, "observation.state", lambda x: x.__setitem__(
        (slice(None), [0, 13]), x[:, [13, 0]]))  # fmt: skip
    also = ("quality.shift", "quality.out_of_range", "quality.action_range", "quality.jump")
    return QualityExpected("quality.drift", rel, 50, "observation.state", also=also)


def quality_recalibrated(root: Path) -> QualityExpected:
    """A joint's encoder re-zeroed a full turn (2 pi) off from episode 30 on."""

    def change(x):
        x[:, 4] += 2 * np.pi

    rel = _from_episode(root, 30, "observation.state", change)
    also = ("quality.shift", "quality.out_of_range", "quality.action_range")
    return QualityExpected("quality.drift", rel, 30, "observation.state", also=also)


QUALITY_CORRUPTIONS: dict[str, Callable[[Path], QualityExpected]] = {
    name[len("quality_") :]: fn
    for name, fn in sorted(globals().items())
    if name.startswith("quality_") and callable(fn)
}


# ---------------------------------------------------------------------------------------------
# One root with a finding of every kind the CI output formats carry (tests/validate/
# test_ci_formats.py, tests/repo/test_action.py): an info.json error (a line), a data error on
# an episode, data-quality warnings on an episode, a feature and frames.

CI_FINDINGS = (
    ("info.totals", INFO, None),
    ("data.nan", "data/chunk-000/file-000.parquet", 10),
    ("quality.frozen", "data/chunk-000/file-000.parquet", 5),
    ("quality.jump", "data/chunk-000/file-000.parquet", 9),
)


def corrupt_for_ci(root: Path) -> tuple[tuple[str, str, int | None], ...]:
    """Damage a copy of a LeRobot-written recording (rec40) as :data:`CI_FINDINGS` says;
    returns it: (check, file, episode) of each finding that must be reported."""
    info = json.loads((root / INFO).read_text())
    edit_info(root, total_frames=info["total_frames"] + 5)
    corrupt_nan_in_action(root)
    quality_frozen_action(root)
    quality_spike(root)
    return CI_FINDINGS
