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

from episodekit.core.memory import release_memory
from episodekit.core.parquet_window import WINDOW_CHUNKS
from episodekit.writers import repair_meta, repair_schema
from episodekit.writers.repair_inspect import MetaFile
from episodekit.writers.repair_kept import Kept, column
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
    record them in ``staged``; return LeRobot's stats.json of the kept episodes. Held per
    kept episode through the blocks: its row's output file as an int32 code and the plan's
    ``meta_row`` (int32 while it fits); a recovered row's file and row in it are found a
    block at a time (:meth:`~episodekit.writers.repair_columns.RecoveredColumns.place`)."""
    inv = plan.inventory
    kept = plan.kept
    rec = plan.recovered
    meta_row = kept.held("meta_row") if isinstance(kept, Kept) else column(kept, "meta_row")
    where = repair_meta.meta_files(plan)
    distinct, code = np.unique(where[:, 0] * (1 << 32) + where[:, 1], return_inverse=True)
    del where
    code = code.astype(np.int32)  # each kept row's output file: a code into ``places``
    places = np.c_[distinct >> 32, distinct & 0xFFFFFFFF]
    index = column(kept, "index")
    file_of = rec.file_of if rec is not None else np.zeros(0, np.int32)
    on_disk = rec.episode_index() if rec is not None else np.zeros(0, np.int64)
    staged.rebuilt += index[meta_row < 0].tolist()
    stats = repair_schema.DatasetStats(inv.info)
    outputs: dict[int, tuple[str, bool]] = {}  # code -> (rel, written)
    for c in in_order(code):
        chunk, file = (int(v) for v in places[c])
        rel = EPISODES_PATH.format(chunk=chunk, file=file)
        pos = np.flatnonzero(code == c)
        src = next((i for i, m in enumerate(inv.episodes) if m.rel == rel), None)
        same = (
            src is not None
            and inv.episodes[src].intact
            and bool(np.all(meta_row[pos] >= 0))
            and np.array_equal(on_disk[file_of == src], index[pos])
        )
        outputs[c] = (rel, not same)
        if same:
            staged.unchanged.append(rel)
        else:
            rebuilt = int(np.sum(meta_row[pos] < 0))
            staged.written[rel] = f"{len(pos)} rows ({rebuilt} rebuilt)"
        del pos
    written = {rel for rel, _ in outputs.values()}
    staged.removed += [m.rel for m in inv.episodes if m.rel not in written]
    del index, on_disk, file_of  # not read by the blocks: let go before the first
    with contextlib.ExitStack() as stack:
        used: list[int] = []
        if rec is not None:
            used = np.unique(rec.place(meta_row[meta_row >= 0])[0]).tolist()
        every = rec.files() if rec is not None else []
        sources = {f: _Source(inv.episodes[f], inv.root, stack) for f in every}
        schema = _schema(plan, sources)
        for f in every:
            if f not in used:
                del sources[f]
        release_memory()  # what the plan and the lines above left in the heap
        files = stack.enter_context(EpisodesFiles(staging, REPAIR))
        changed = np.array([c for c, (_, w) in outputs.items() if w], np.int32)
        for lo in range(0, len(kept), BLOCK):
            hi = min(lo + BLOCK, len(kept))
            where = places[code[lo:hi]]
            block = _block(plan, sources, schema, lo, hi, meta_row, where)
            stats.add(block)
            write = np.isin(code[lo:hi], changed)
            if write.all():
                files.write(block)
            elif write.any():  # rows of files kept as they are on disk: only fed to the stats
                files.write(block.filter(pa.array(write)))
            del block
            pa.default_memory_pool().release_unused()
    return stats.result()


def _block(plan, sources, schema, lo, hi, meta_row, where) -> pa.Table:
    """The kept rows ``lo`` .. ``hi - 1`` in order (module docstring); ``where``: their
    output files' (chunk, file)."""
    parts: list[pa.Table] = []
    order: list[np.ndarray] = []
    ks = np.arange(lo, hi)
    rec = ks[meta_row[lo:hi] >= 0]
    if len(rec):
        files, rows = plan.recovered.place(meta_row[rec])
        for f in dict.fromkeys(files.tolist()):
            parts.append(sources[f].take(rows[files == f]))
            order.append(rec[files == f])
    new = ks[meta_row[lo:hi] < 0]
    if len(new):
        rebuilt = [
            repair_meta.rebuilt_row(plan, plan.kept[k], (int(w[0]), int(w[1])))
            for k, w in zip(new.tolist(), where[new - lo])
        ]
        parts.append(repair_schema.episodes_table(rebuilt, schema))
        order.append(new)
    block = _conform(pa.concat_tables(parts, promote_options="permissive"), schema)
    del parts
    at = np.concatenate(order)
    if not np.array_equal(at, ks):
        block = block.take(pa.array(np.argsort(at, kind="stable")))
    for name, values in zip(PLACE, (where[:, 0], where[:, 1])):  # where it now lives
        block = block.set_column(block.schema.get_field_index(name), name, pa.array(values))
    return block.combine_chunks()
