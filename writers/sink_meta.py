"""The episode sink's metadata files, written the same way by every dataset writer: the surgery
writer (:mod:`episodekit.writers.writer`: edit, split, merge, convert), repair
(:mod:`episodekit.writers.repair_build`, :mod:`episodekit.writers.repair_episodes`), the sample
writer (:mod:`episodekit.sample.writer`) and the import's
:class:`~episodekit.writers.sink.EpisodeSink` (:mod:`episodekit.writers.import_parts`). The
data side is :mod:`episodekit.writers.sink_data`.

- ``meta/episodes/chunk-XXX/file-YYY.parquet``: :class:`EpisodesFiles` takes the rows a block
  at a time and writes each row to the file its ``meta/episodes/chunk_index``/``file_index``
  name (:func:`places`: LeRobot's roll-over rule on the rows' bytes; repair keeps the places
  the recorder used), in pyarrow's default encoding (LeRobot's);
- ``meta/tasks.parquet`` (:func:`write_tasks`: LeRobot's table, or a table kept as read),
  ``meta/info.json`` (:func:`write_info`: LeRobot's indent, never a number that is not
  finite), ``meta/stats.json`` (:func:`write_stats`, :func:`finish_stats`).

A :class:`MetaPolicy` is what differs between the writers:

- ``stats``: where stats.json's quantiles come from. Every writer's min, max, mean, std and
  count are LeRobot's aggregation of the episodes' stats (the editor's one-shot
  :func:`~episodekit.writers.meta.dataset_stats`; repair's, the recorder's recurrence
  :class:`~episodekit.writers.repair_schema.DatasetStats`). ``lerobot``: the quantiles too,
  a count-weighted mean of the episodes' (the sample, as LeRobot writes them); ``exact``:
  selected over the written data files (:func:`~episodekit.writers.stats_exact.
  exact_quantiles`: the import and repair); ``sketch``: put in by the surgery writer from the
  episodes' sketches, streamed range counts or closed forms
  (:mod:`episodekit.writers.stats_quantiles`) before :func:`finish_stats` writes them;
- ``group_rows``: the episodes files' rows per row group, at most (None: one group per
  :meth:`EpisodesFiles.write` per file, up to pyarrow's default). The import writes a part
  (:data:`IMPORT_ROWS` episodes, fewer at a checkpoint) at a time, repair a block of
  :data:`REPAIR_ROWS` kept rows, the surgery and sample writers the whole table at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core.atomic import atomic_write_text
from episodekit.core.layout.files import chunk_file, roll_over
from episodekit.core.layout.info import Info
from episodekit.core.parquet_write import plain_writer, write_table
from episodekit.core.paths import INFO_FILE, STATS_FILE

STATS_MODES = ("lerobot", "exact", "sketch")
TASKS_FILE = "meta/tasks.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk:03d}/file-{file:03d}.parquet"
PLACE = ("meta/episodes/chunk_index", "meta/episodes/file_index")
IMPORT_ROWS = 256  # the import's episodes buffered before they become a part (a row group)
REPAIR_ROWS = 4096  # repair's kept rows taken, fed to the stats and written at a time


@dataclass(frozen=True)
class MetaPolicy:
    """How a writer's metadata differs (see the module docstring): ``stats`` (``lerobot``,
    ``exact`` or ``sketch``) and ``group_rows`` (episodes rows per row group, at most)."""

    stats: str = "exact"
    group_rows: int | None = None

    def __post_init__(self) -> None:
        if self.stats not in STATS_MODES:
            raise ValueError(f"stats must be one of {STATS_MODES}, got {self.stats!r}")
        if self.group_rows is not None and self.group_rows < 1:
            raise ValueError(f"group_rows must be >= 1, got {self.group_rows}")


SAMPLE = MetaPolicy("lerobot")
SURGERY = MetaPolicy("sketch")
IMPORT = MetaPolicy("exact", IMPORT_ROWS)
REPAIR = MetaPolicy("exact", REPAIR_ROWS)


def places(n: int, row_bytes: float, limit_bytes: float, chunks_size: int) -> tuple:
    """``(chunk_index, file_index)`` arrays of ``n`` episodes rows of ``row_bytes`` each (an
    average, or an estimate): LeRobot's roll-over rule at ``limit_bytes`` per file."""
    seq = roll_over(np.full(n, row_bytes, dtype=np.float64), limit_bytes)
    return chunk_file(seq, chunks_size)


def in_order(values: np.ndarray) -> list[int]:
    """The distinct values of ``values`` in the order they first appear (no Python object per
    value: ``dict.fromkeys(values.tolist())`` makes one per episode)."""
    distinct, first = np.unique(values, return_index=True)
    return distinct[np.argsort(first)].tolist()


class EpisodesFiles:
    """``meta/episodes`` files under ``folder``: rows in (:meth:`write`, any number of times, in
    order), each to the file its place columns name, opened on first use with ``schema`` (None:
    the first rows'); use as a context manager (or :meth:`close`)."""

    def __init__(
        self, folder: str | Path, policy: MetaPolicy, schema: pa.Schema | None = None
    ) -> None:
        self.folder = Path(folder)
        self.policy = policy
        self.schema = schema
        self.files: list[str] = []  # relative paths, in the order they were opened
        self._writers: dict[int, Any] = {}

    def write(self, rows: pa.Table) -> None:
        """``rows`` (with their place columns set), each file's share as row groups of at
        most ``policy.group_rows`` rows."""
        if not rows.num_rows:
            return
        chunk = rows[PLACE[0]].to_numpy().astype(np.int64)
        file = rows[PLACE[1]].to_numpy().astype(np.int64)
        key = chunk * (1 << 32) + file
        one = len(key) == 1 or bool((key[1:] == key[0]).all())
        for k in [int(key[0])] if one else in_order(key):
            if one:
                part = rows
            else:
                sel = np.flatnonzero(key == k)
                contiguous = int(sel[-1]) - int(sel[0]) + 1 == len(sel)
                part = rows.slice(int(sel[0]), len(sel)) if contiguous else rows.take(sel)
            self._writer(k, rows.schema).write_table(part, row_group_size=self.policy.group_rows)

    def _writer(self, k: int, schema: pa.Schema) -> Any:
        if k not in self._writers:
            rel = EPISODES_PATH.format(chunk=k >> 32, file=k & 0xFFFFFFFF)
            path = self.folder / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            self._writers[k] = plain_writer(path, self.schema or schema)
            self.files.append(rel)
        return self._writers[k]

    def close(self) -> None:
        """Every file's footer written."""
        writers, self._writers = self._writers, {}
        for w in writers.values():
            w.close()

    def __enter__(self) -> EpisodesFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_episodes(folder: str | Path, episodes: pa.Table, policy: MetaPolicy) -> list[str]:
    """A whole episodes table (place columns set) as its ``meta/episodes`` files; their paths."""
    with EpisodesFiles(folder, policy, episodes.schema) as files:
        files.write(episodes)
    return files.files


def tasks_table(tasks: list[str], index_name: str | None = None) -> pa.Table:
    """meta/tasks.parquet as LeRobot writes it: the task string is the pandas index, unnamed
    (column ``__index_level_0__``, older LeRobot) or ``index_name`` (newer: ``task``)."""
    col = index_name or "__index_level_0__"
    pandas_meta = {
        "index_columns": [col],
        "column_indexes": [
            {"name": None, "field_name": None, "pandas_type": "unicode", "numpy_type": "object",
             "metadata": {"encoding": "UTF-8"}}
        ],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": index_name, "field_name": col, "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.3",
    }  # fmt: skip
    table = pa.table(
        {"task_index": pa.array(np.arange(len(tasks), dtype=np.int64)), col: pa.array(tasks)}
    )
    return table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})


def write_tasks(
    folder: str | Path, tasks: list[str] | pa.Table, index_name: str | None = None
) -> None:
    """``meta/tasks.parquet``: LeRobot's table of ``tasks`` (the strings, task_index their
    order: :func:`tasks_table`, ``index_name`` its index's name), or a table as it is (repair
    keeps the one it read, less the tasks no kept episode uses)."""
    path = Path(folder) / TASKS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    table = tasks if isinstance(tasks, pa.Table) else tasks_table(list(tasks), index_name)
    write_table(table, path)


def info_text(info: Info | dict) -> str:
    """info.json's text (LeRobot's indent): an :class:`~episodekit.core.layout.Info`'s, or a
    dict's as it is (repair's, damaged keys rebuilt); ``ValueError`` on a number that is not
    finite (never written as ``Infinity``)."""
    if isinstance(info, Info):
        return info.to_json()
    return json.dumps(info, indent=4, allow_nan=False)


def write_info(folder: str | Path, info: Info | dict) -> None:
    """``meta/info.json`` (:func:`info_text`), written atomically."""
    text = info_text(info)  # before the file is touched: a refused info.json writes nothing
    path = Path(folder) / INFO_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)


def write_stats(folder: str | Path, stats: dict, indent: int | None = 4) -> None:
    """``meta/stats.json`` as it is (``indent``: LeRobot's 4; None for the v2.1 sample's
    one-line file), written atomically."""
    path = Path(folder) / STATS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(stats, indent=indent))


def finish_stats(
    folder: str | Path,
    stats: dict[str, dict[str, list]],
    policy: MetaPolicy,
    rels: list[str] | None = None,
    feats: dict[str, int] | None = None,
    counts: dict | None = None,
    windows: dict | None = None,
    batch_rows: int | None = None,
) -> None:
    """``meta/stats.json`` from ``stats`` (feature -> key -> list: LeRobot's aggregation of
    the episodes' stats) with its quantiles by ``policy.stats``: ``exact`` puts in those of
    the numeric features ``feats`` (name -> dims) selected over the written data files
    ``rels`` (:func:`~episodekit.writers.stats_exact.exact_quantiles`: ``counts`` taken over
    them already, else counted here; ``windows``: files read a window of row groups at a
    time, ``batch_rows`` rows a read); ``lerobot`` and ``sketch`` write them as they are."""
    if policy.stats == "exact":
        from episodekit.writers.stats_exact import BATCH_ROWS, exact_quantiles

        exact_quantiles(
            Path(folder), list(rels or []), stats, feats or {}, counts, windows,
            batch_rows or BATCH_ROWS,
        )  # fmt: skip
    write_stats(folder, stats)
