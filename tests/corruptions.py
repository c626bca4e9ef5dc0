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


# ---------------------------------------------------------------------------------------------
# Artifacts: written by their own modules on the clean copy, then broken.


def write_artifacts(root: Path) -> None:
    """Speed percentiles, the cost table and one shard plan (world size 2 x 2 workers)."""
    from episodekit.metadata.plans import ensure_plans
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


def _edit_plan(root: Path, fn: Callable[[dict], None]) -> None:
    doc = json.loads((root / PLAN).read_text())
    fn(doc)
    (root / PLAN).write_text(json.dumps(doc))


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
