"""The import sink's episode metadata on disk as it comes: memory flat in the number of episodes.

Each episode's ``meta/episodes`` row (its stats, its kept source values) and its sketch points
(the sidecar's: :mod:`episodekit.metadata.stats.episode_sketch`) are buffered for at most
``ROWS_BATCH`` episodes, then written as one part (``rows-NNNNNN.parquet`` and
``sketch-NNNNNN.parquet``, atomically) in the staging folder's :data:`PARTS_DIR`; a checkpoint
(:meth:`EpisodeParts.flush`) writes a shorter part, so the parts a resumed run keeps end where
its data files do. :meth:`EpisodeParts.write_meta` streams them into ``meta/episodes`` (a row
group a part, through :class:`~episodekit.writers.sink_meta.EpisodesFiles`) and the sidecar,
one part in memory at a time; :meth:`EpisodeParts.stats_table` reads one feature's ``stats/*``
columns of every episode (the dataset stats).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.atomic import atomic_path
from episodekit.core.parquet_read import local_batches, read_schema, read_table
from episodekit.core.parquet_write import RowGroupWriter, write_table
from episodekit.metadata.stats.blocks import episode_points, feature_values
from episodekit.metadata.stats.episode_sketch import (
    ENCODING,
    POINTS,
    SKETCHES_FILE,
    SKETCHES_KEY,
    EpisodeSketches,
    point_dtypes,
    sketch_record,
)
from episodekit.writers import repair_schema
from episodekit.writers.sink_meta import IMPORT, PLACE, EpisodesFiles, places

PARTS_DIR = ".episodekit-import"  # inside the staging folder; removed before the publish
ROWS_BATCH = IMPORT.group_rows  # episodes buffered in memory before they become a part
# Rows of episodes whose sketch points are computed at once (their numeric values held, copied
# out of the rows: a few MiB; one sort per episode length, not a block's stats per episode).
POINTS_ROWS = 16384
SKETCH_BATCH = 64  # episodes a sketch part is read back in (see EpisodeParts._sketch_part)


class EpisodeParts:
    """Episode rows and sketch points of the import, spilled in parts (see the module
    docstring). ``feats``: numeric feature -> dims (the sidecar's)."""

    def __init__(self, folder: Path, info: dict, feats: dict[str, int], parts: int = 0) -> None:
        self.dir = Path(folder) / PARTS_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.info, self.feats = info, feats
        self.dtypes = point_dtypes(info, feats)
        self.parts = parts
        self.rows: list[dict[str, Any]] = []
        self.extra: list[dict[str, Any]] = []
        self.points: list[dict[str, np.ndarray]] = []  # per batch of episodes: (D, points)
        self.values: list[dict[str, np.ndarray]] = []  # per episode: its values, points to come
        self.waiting = 0  # their rows
        self.index: list[int] = []
        self.length: list[int] = []

    def add(self, row: dict[str, Any], extra: dict[str, Any], table: pa.Table) -> None:
        """One episode: its row, its source values, its written rows (the sketch points,
        computed for :data:`POINTS_ROWS` rows of episodes at once)."""
        n = table.num_rows
        self.values.append(
            {
                name: feature_values(table.column(name), dims, name).copy()
                for name, dims in self.feats.items()
            }
        )
        self.waiting += n
        self.rows.append(row)
        self.extra.append(dict(extra))
        self.index.append(int(row["episode_index"]))
        self.length.append(n)
        if self.waiting >= POINTS_ROWS:
            self._points()
        if len(self.rows) >= ROWS_BATCH:
            self.flush()

    def _points(self) -> None:
        """The sketch points of the episodes whose values wait (:func:`episode_points`: the
        bits of each episode's own block stats)."""
        if self.values:
            self.points.append(
                {name: episode_points([v[name] for v in self.values]) for name in self.feats}
            )
        self.values, self.waiting = [], 0

    def flush(self) -> None:
        """The buffered episodes as one part (nothing when none)."""
        if not self.rows:
            return
        self._points()
        table = repair_schema.episodes_table(self.rows)
        keys: dict[str, None] = {}
        for e in self.extra:
            keys.update(dict.fromkeys(e))
        for k in keys:
            table = table.append_column(k, pa.array([e.get(k) for e in self.extra]))
        sk = EpisodeSketches(
            np.array(self.index, np.int64),
            np.array(self.length, np.int64),
            {n: np.concatenate([p[n] for p in self.points], axis=1) for n in self.feats},
            POINTS,
        )
        name = f"{self.parts:06d}.parquet"
        with atomic_path(self.dir / f"sketch-{name}") as tmp:
            write_table(sk.table(self.dtypes), tmp, compression="zstd")
        with atomic_path(self.dir / f"rows-{name}") as tmp:
            write_table(table, tmp)
        self.parts += 1
        self.rows, self.extra, self.points, self.index, self.length = [], [], [], [], []

    def _read(self, kind: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
        for i in range(self.parts):
            yield read_table(None, str(self.dir / f"{kind}-{i:06d}.parquet"), columns=columns)

    def schema(self) -> pa.Schema:
        """The episodes table's schema: LeRobot's columns, then the source values' in the
        order they first came (types unified over the parts)."""
        names = [str(self.dir / f"rows-{i:06d}.parquet") for i in range(self.parts)]
        schemas = [read_schema(None, name) for name in names]
        if not all(s.equals(schemas[0]) for s in schemas):
            schemas = [pa.unify_schemas(schemas, promote_options="permissive")]
        return pa.schema([f.with_type(_items(f.type)) for f in schemas[0]])

    def stats_table(self, name: str) -> pa.Table:
        """Every episode's ``stats/{name}/*`` columns (one feature: a few values an episode)."""
        cols = [c for c in self.schema().names if c.startswith(f"stats/{name}/")]
        return pa.concat_tables(self._read("rows", cols)) if cols else pa.table({})

    def write_meta(self, folder: Path, n: int, data_limit: float, chunks_size: int) -> pa.Array:
        """``meta/episodes`` (LeRobot's roll-over on the rows' bytes; a row group a part) and
        the episodes' lengths (for info.json and the checks)."""
        schema = self.schema()
        nbytes = 0.0
        for t in self._read("rows"):
            nbytes += _conform(t, schema).nbytes
        chunk, file = places(n, nbytes / n, data_limit, chunks_size)
        lengths = []
        at = 0
        with EpisodesFiles(folder, IMPORT, schema) as files:
            for t in self._read("rows"):
                t = _conform(t, schema)
                m = t.num_rows
                for col, values in zip(PLACE, (chunk[at : at + m], file[at : at + m])):
                    i = t.schema.get_field_index(col)
                    t = t.set_column(i, col, pa.array(values, t.schema.field(i).type))
                files.write(t)
                lengths.append(t["length"].combine_chunks())
                at += m
        return pa.concat_arrays(lengths)

    def write_sketches(self, folder: Path, meta: dict[str, object]) -> None:
        """The sidecar (``meta/episodekit_sketches.parquet``): a row group a part."""
        record = sketch_record(POINTS, self.feats, meta)
        with atomic_path(folder / SKETCHES_FILE) as tmp:
            writer = None
            for i in range(self.parts):
                plain, part = self._sketch_part(i)
                if writer is None:
                    schema = plain.with_metadata({SKETCHES_KEY: json.dumps(record)})
                    writer = RowGroupWriter(tmp, schema, encoding=ENCODING)
                writer.write_group(part)
                part = None
                pa.default_memory_pool().release_unused()  # the part's read and write buffers
            if writer is not None:
                writer.finish()

    def _sketch_part(self, i: int) -> tuple[pa.Schema, pa.Table]:
        """Sketch part ``i`` with Arrow's list child names, read in small batches: a whole
        part per ``read_table`` left the process ~3 MiB bigger per part (the sidecar's
        write grew with the episodes); in batches it stays flat. One table (one row group)."""
        schema, parts = local_batches(self.dir / f"sketch-{i:06d}.parquet", SKETCH_BATCH)
        plain = pa.schema([f.with_type(_items(f.type)) for f in schema])
        batches = [b.cast(plain) for b in parts]
        return plain, pa.Table.from_batches(batches, plain).combine_chunks()

    def keep(self, parts: int) -> None:
        """Resume: the first ``parts`` parts stay, later ones (a killed run's) go."""
        self.parts = parts
        for p in self.dir.iterdir():
            stem = p.name.split("-", 1)[-1].split(".", 1)[0]
            if p.name.startswith(("rows-", "sketch-")) and stem.isdigit() and int(stem) < parts:
                continue
            if p.name.startswith(("rows-", "sketch-")) or p.name.startswith("."):
                p.unlink(missing_ok=True)

    def remove(self) -> None:
        """The parts folder goes (before the publish)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """A part as the unified schema: missing source-value columns null, types promoted."""
    cols = []
    for f in schema:
        if f.name in t.column_names:
            c = t[f.name]
            cols.append(c if c.type == f.type else c.cast(f.type))
        else:
            cols.append(pa.nulls(t.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _items(t: pa.DataType) -> pa.DataType:
    """``t`` with every list's child named ``item`` (Arrow's default; parquet reads them back
    as ``element``): a part read back is written as the table it was made from."""
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_name("item").with_type(_items(t.value_type)))
    return t
