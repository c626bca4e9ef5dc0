"""The ``meta/episodes`` files ``episodekit repair`` writes, and LeRobot's stats.json of the kept
episodes, from the kept rows taken :data:`BLOCK` at a time: memory is one block's rows
(~1.7 KB an episode of 7-dim state and action), whatever the episodes.

Each block is the kept episodes' rows in order: recovered rows read again from their files (a
window of row groups at a time: :mod:`episodekit.core.parquet_window`), rebuilt rows
(:mod:`episodekit.writers.repair_meta`), their ``meta/episodes/chunk_index``/``file_index``
set to where they now live. The block feeds LeRobot's stats recurrence
(:class:`~episodekit.writers.repair_schema.DatasetStats`) and is written to the episodes files
it belongs to (:class:`~episodekit.writers.sink_meta.EpisodesFiles`, policy ``REPAIR``), one
row group each (a file of at most :data:`BLOCK` rows is one row group, as
before; a longer one is several, as LeRobot's recorder writes it: a row group per flush). A file
whose rows are those on disk, unchanged, is not written but its rows still feed the stats.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.parquet_window import WINDOW_CHUNKS
from episodekit.writers import repair_meta, repair_schema
from episodekit.writers.repair_inspect import MetaFile
from episodekit.writers.repair_kept import column
from episodekit.writers.repair_plan import RepairPlan
from episodekit.writers.sink_meta import EPISODES_PATH, PLACE, REPAIR, EpisodesFiles, in_order

BLOCK = REPAIR.group_rows  # kept rows taken, fed to the stats and written at a time


class _Source:
    """The rows of one recovered episodes file, read by position."""

    def __init__(self, m: MetaFile, root: Path, stack: contextlib.ExitStack) -> None:
        self.m, self.root = m, root
        self.pf = stack.enter_context(m.open(root)) if m.intact else None
        rows = self.pf.row_group_rows() if self.pf is not None else m.group_rows(root)
        self.ends = np.cumsum(rows)
        self.windows = None if m.intact else m.windows(root)

    def schema(self) -> pa.Schema:
        if self.pf is not None:
            return self.pf.schema
        assert self.windows is not None
        return self.windows.read(range(0)).schema

    def take(self, rows: np.ndarray) -> pa.Table:
        """Rows ``rows`` of the file (positions, in that order), from the row groups between
        the first and the last of them (a window at a time)."""
        lo, hi = int(rows.min()), int(rows.max())
        a = int(np.searchsorted(self.ends, lo, side="right"))
        b = int(np.searchsorted(self.ends, hi, side="right"))
        if self.pf is not None:
            table = self.pf.read_row_groups(list(range(a, b + 1)))
        else:
            assert self.windows is not None
            most = max(1, WINDOW_CHUNKS // self.windows.num_columns)
            parts = [
                self.windows.read(range(g, min(g + most, b + 1))) for g in range(a, b + 1, most)
            ]
            table = pa.concat_tables(parts)
            del parts
        table = table.slice(lo - (int(self.ends[a - 1]) if a else 0), hi - lo + 1)
        if len(rows) == hi - lo + 1 and np.array_equal(rows, np.arange(lo, hi + 1)):
            return table.combine_chunks()
        return table.take(pa.array(rows - lo))


def _schema(plan: RepairPlan, sources: dict[int, _Source]) -> pa.Schema:
    """The rows' schema: the recovered files' (unified as concatenating them promotes),
    else the one LeRobot builds from info.json."""
    schemas = [s.schema() for _, s in sorted(sources.items())]
    if not schemas:
        return repair_schema.episodes_schema(plan.inventory.info)
    if all(s.equals(schemas[0], check_metadata=True) for s in schemas):
        return schemas[0]
    return pa.unify_schemas(schemas, promote_options="permissive")


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns, in its order and types (nulls for one it lacks)."""
    if table.schema.equals(schema, check_metadata=True):
        return table
    cols = [
        table.column(f.name) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(cols, names=schema.names).cast(schema)


def build_episodes(plan: RepairPlan, staging: Path, staged) -> dict:
    """Write the ``meta/episodes`` files that change (module docstring) into ``staging``;
    record them in ``staged``; return LeRobot's stats.json of the kept episodes."""
    inv = plan.inventory
    kept = plan.kept
    where = repair_meta.meta_files(plan)
    rec = plan.recovered
    meta_row = column(kept, "meta_row")
    index = column(kept, "index")
    file_of = rec.file_of if rec is not None else np.zeros(0, np.int32)
    row_in = rec.row_in_file if rec is not None else np.zeros(0, np.int64)
    on_disk = rec.episode_index() if rec is not None else np.zeros(0, np.int64)
    staged.rebuilt += index[meta_row < 0].tolist()
    stats = repair_schema.DatasetStats(inv.info)
    key = where[:, 0] * (1 << 32) + where[:, 1]
    outputs: dict[int, tuple[str, bool]] = {}  # key -> (rel, written)
    for k in in_order(key):
        chunk, file = k >> 32, k & 0xFFFFFFFF
        rel = EPISODES_PATH.format(chunk=chunk, file=file)
        pos = np.flatnonzero(key == k)
        src = next((i for i, m in enumerate(inv.episodes) if m.rel == rel), None)
        same = (
            src is not None
            and inv.episodes[src].intact
            and bool(np.all(meta_row[pos] >= 0))
            and np.array_equal(on_disk[file_of == src], index[pos])
        )
        outputs[k] = (rel, not same)
        if same:
            staged.unchanged.append(rel)
        else:
            rebuilt = int(np.sum(meta_row[pos] < 0))
            staged.written[rel] = f"{len(pos)} rows ({rebuilt} rebuilt)"
    written = {rel for rel, _ in outputs.values()}
    staged.removed += [m.rel for m in inv.episodes if m.rel not in written]
    del index, on_disk  # not read by the blocks: let go before the first
    with contextlib.ExitStack() as stack:
        used = sorted({int(f) for f in file_of[meta_row[meta_row >= 0]].tolist()})
        every = sorted({int(f) for f in np.unique(file_of).tolist()})
        sources = {f: _Source(inv.episodes[f], inv.root, stack) for f in every}
        schema = _schema(plan, sources)
        for f in every:
            if f not in used:
                del sources[f]
        files = stack.enter_context(EpisodesFiles(staging, REPAIR))
        changed = np.array([k for k, (_, w) in outputs.items() if w], np.int64)
        for lo in range(0, len(kept), BLOCK):
            hi = min(lo + BLOCK, len(kept))
            block = _block(plan, sources, schema, lo, hi, meta_row, file_of, row_in, where)
            stats.add(block)
            write = np.isin(key[lo:hi], changed)
            if write.all():
                files.write(block)
            elif write.any():  # rows of files kept as they are on disk: only fed to the stats
                files.write(block.filter(pa.array(write)))
            del block
            pa.default_memory_pool().release_unused()
    return stats.result()


def _block(plan, sources, schema, lo, hi, meta_row, file_of, row_in, where) -> pa.Table:
    """The kept rows ``lo`` .. ``hi - 1`` in order (module docstring)."""
    parts: list[pa.Table] = []
    order: list[np.ndarray] = []
    ks = np.arange(lo, hi)
    rec = ks[meta_row[lo:hi] >= 0]
    if len(rec):
        files = file_of[meta_row[rec]]
        for f in dict.fromkeys(files.tolist()):
            mine = rec[files == f]
            parts.append(sources[f].take(row_in[meta_row[mine]]))
            order.append(mine)
    new = ks[meta_row[lo:hi] < 0]
    if len(new):
        rows = [
            repair_meta.rebuilt_row(plan, plan.kept[k], (int(where[k, 0]), int(where[k, 1])))
            for k in new.tolist()
        ]
        parts.append(repair_schema.episodes_table(rows, schema))
        order.append(new)
    block = _conform(pa.concat_tables(parts, promote_options="permissive"), schema)
    del parts
    at = np.concatenate(order)
    if not np.array_equal(at, ks):
        block = block.take(pa.array(np.argsort(at, kind="stable")))
    for name, values in zip(PLACE, (where[lo:hi, 0], where[lo:hi, 1])):  # where it now lives
        block = block.set_column(block.schema.get_field_index(name), name, pa.array(values))
    return block.combine_chunks()
