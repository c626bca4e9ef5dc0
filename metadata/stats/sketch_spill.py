"""The stats pass's per-episode sketches written to disk as the data files' results arrive, so
the pass holds one file's points at a time, not every episode's (at 128 points a float32
dimension is 512 bytes an episode: 33 dimensions of 100,000 episodes would be 1.7 GB).

:class:`SketchSpill` appends each file's episodes as one row group of a parquet file in the
sidecar's own format (:mod:`.episode_sketch`), with the sidecar's metadata already in it, in a
temporary folder it owns; :meth:`SketchSpill.finish` puts the groups in episode order (the
executor's jobs finish in any order) and returns :class:`SpilledSketches`, which
:func:`~episodekit.metadata.stats.episode_sketch.write_sketches` publishes by a hard link or a
copy (or a row-group-at-a-time rewrite when the metadata differs). Its ``points`` reads them all
back, for the callers that want them in memory (surgery's few renumbered columns).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.parquet_read import open_data_file, read_table
from episodekit.core.parquet_write import RowGroupWriter
from episodekit.core.spill import spill_folder
from episodekit.metadata.stats.episode_sketch import (
    ENCODING,
    SKETCHES_KEY,
    EpisodeSketches,
    concat,
    point_dtypes,
    sketch_record,
    write_sketches_file,
)


class SpilledSketches:
    """Episodes' sketches in a parquet file of the sidecar's format (``path``, owned by
    ``owner``, a temporary folder removed when this object goes); ``episode_index`` and
    ``length`` are in memory (sorted by episode), the points on disk."""

    def __init__(self, path: str, record: dict, episode_index, length, owner) -> None:
        self.path = path
        self.record = record
        self.episode_index = np.asarray(episode_index, np.int64)
        self.length = np.asarray(length, np.int64)
        self.points_per_episode = int(record["points"])
        self._owner = owner

    def load(self) -> EpisodeSketches:
        """Every point, in memory."""
        t = read_table(None, self.path)
        return EpisodeSketches.from_table(t, self.record["features"], self.points_per_episode)

    @property
    def points(self) -> dict[str, np.ndarray]:
        """Every feature's ``(D, sum k)`` points, read back into memory."""
        return self.load().points

    def write(self, dest: str | os.PathLike, meta: dict[str, object]) -> None:
        """``dest`` (a new name) as the sidecar with ``meta`` (fingerprint, data state, ...):
        when the spilled file already records it, a hard link on the same file system (no
        byte copied; nothing writes either name in place) or a copy; else rewritten one row
        group at a time."""
        record = sketch_record(self.points_per_episode, self.record["features"], meta)
        if record == self.record:
            try:
                os.link(self.path, dest)
            except OSError:  # another file system (or no hard links there)
                shutil.copyfile(self.path, dest)
            return
        _copy_groups(self.path, dest, record, order=None)


def _copy_groups(src: str, dest: str | os.PathLike, record: dict, order) -> None:
    """``src``'s row groups (in ``order``, default as they are) written to ``dest`` with
    ``record`` as the sidecar's metadata, one group in memory at a time. The lists keep the
    child name the spill wrote (``item``; read back they are ``element``): the same sketches
    give the same bytes whichever way they were published (a run whose files finished in
    another order, on Ray or with more jobs, must write the same sidecar)."""
    with open_data_file(src) as df:
        plain = pa.schema([_item_lists(f) for f in df.schema])
        schema = plain.with_metadata({SKETCHES_KEY: json.dumps(record)})
        groups = range(df.parquet.metadata.num_row_groups) if order is None else order
        with RowGroupWriter(dest, schema, encoding=ENCODING) as w:
            for g in groups:  # one thread: each column read in parallel holds them all at once
                group = df.read_row_group(int(g), use_threads=False)
                w.write_group(group.replace_schema_metadata(None).cast(plain))
                del group
                pa.default_memory_pool().release_unused()  # a group's buffers, not the most seen
            w.finish()


def _item_lists(field: pa.Field) -> pa.Field:
    """``field`` with a list type's child named ``item`` (Arrow's default name)."""
    if pa.types.is_list(field.type):
        return field.with_type(pa.list_(field.type.value_field.with_name("item")))
    return field


class SketchSpill:
    """Collects the stats pass's sketches file by file on disk (see the module docstring).
    ``features``: ``{name: dims}``; ``info``: info.json (the points' dtypes); ``meta``: what
    the sidecar records besides the format (fingerprint, data state)."""

    def __init__(
        self,
        features: dict[str, int],
        info: dict,
        meta: dict[str, object],
        points: int,
        spill_dir: str | None = None,
    ) -> None:
        self.features = features
        self.dtypes = point_dtypes(info, features)
        self.record = sketch_record(points, features, meta)
        self.points = points
        self.tmp = spill_folder("episodekit-sketches-", spill_dir)
        self.path = os.path.join(self.tmp.name, "sketches.parquet")
        self.writer: RowGroupWriter | None = None
        self.episode_index: list[np.ndarray] = []
        self.length: list[np.ndarray] = []

    def add(self, part: EpisodeSketches) -> None:
        """One data file's episodes (in file order) as one row group."""
        if not len(part.episode_index):
            return
        table = part.table(self.dtypes)
        if self.writer is None:
            schema = table.schema.with_metadata({SKETCHES_KEY: json.dumps(self.record)})
            self.writer = RowGroupWriter(self.path, schema, encoding=ENCODING)
        self.writer.write_group(table)
        # Copies: a view would keep the whole scan result alive (with Ray, its object in the
        # store, mapped by the driver) until the end of the pass.
        self.episode_index.append(np.array(part.episode_index, np.int64))
        self.length.append(np.array(part.length, np.int64))

    def finish(self) -> SpilledSketches | None:
        """The spilled sketches sorted by episode (None when no episode was added)."""
        if self.writer is None:
            self.tmp.cleanup()
            return None
        self.writer.finish()
        firsts = np.array([e[0] for e in self.episode_index])
        order = np.argsort(firsts, kind="stable")
        ep = np.concatenate([self.episode_index[i] for i in order])
        length = np.concatenate([self.length[i] for i in order])
        path = self.path
        if np.any(ep[1:] <= ep[:-1]):  # episodes interleave between files: sort them all
            sk = concat([self._group(i) for i in range(len(firsts))])
            path = os.path.join(self.tmp.name, "sorted.parquet")
            write_sketches_file(path, sk, self.dtypes, self.record)
            ep, length = sk.episode_index, sk.length
        elif np.any(order != np.arange(len(order))):  # files finished out of order
            path = os.path.join(self.tmp.name, "sorted.parquet")
            _copy_groups(self.path, path, self.record, order)
        if path != self.path:
            Path(self.path).unlink()
        return SpilledSketches(path, self.record, ep, length, self.tmp)

    def _group(self, i: int) -> EpisodeSketches:
        with open_data_file(self.path) as df:
            t = df.read_row_group(i)
        return EpisodeSketches.from_table(t, self.features, self.points)

    def __enter__(self) -> SketchSpill:
        return self

    def __exit__(self, exc_type, *rest: object) -> None:
        """On an error, the spilled file is closed and dropped with its folder."""
        if exc_type is None:
            return
        if self.writer is not None:
            self.writer.__exit__(exc_type, *rest)
        self.tmp.cleanup()
