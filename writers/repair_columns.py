"""The recovered ``meta/episodes`` columns ``episodekit repair``'s plan reads (episode_index,
length, where its rows and frames are, its tasks), gathered from the files' rows a window at a
time and held as numpy arrays and codes into their distinct values: no Arrow buffer of a window
is kept (the rest of a row, its stats, ~1.7 KB an episode, is read again, a block at a time,
when the episodes files are written: :mod:`episodekit.writers.repair_build`).

At 100,000 episodes the plan's columns take ~6 MB this way; the whole recovered table they
used to be read from took ~170 MB from the inspection to the write.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

PLAN_COLUMNS = ("episode_index", "length", "dataset_from_index", "data/chunk_index")
PLAN_COLUMNS += ("data/file_index", "tasks")


def plan_columns(names: list[str]) -> list[str]:
    """The columns of ``names`` the plan reads (:data:`PLAN_COLUMNS` and each camera's)."""
    return [c for c in names if c in PLAN_COLUMNS or c.startswith("videos/")]


def _narrow(values: np.ndarray) -> np.ndarray:
    """Integer ``values`` as int32 when they fit (any other values as they are)."""
    if values.dtype.kind not in "iu" or values.dtype.itemsize <= 4 or not len(values):
        return values
    fits = -(1 << 31) <= int(values.min()) and int(values.max()) < (1 << 31)
    return values.astype(np.int32) if fits else values


class RecoveredColumns:
    """The plan's columns of every recovered row (all files, in file order), added a table at
    a time (:meth:`add`), read a row at a time (:meth:`getter`) as the Python value
    ``to_pylist`` gives; each row's file (:attr:`file_of`) and its row in that file
    (:attr:`row_in_file`). A column some file lacks reads None on that file's rows."""

    def __init__(self) -> None:
        self._parts: dict[str, list[tuple[str, Any]]] = {}
        self._words: dict[str, dict[Any, int]] = {}  # column -> value -> code
        self._added: list[tuple[int, int, int]] = []  # each table's (file, first row, rows)
        self._done: dict[int, int] = {}  # file -> its rows added
        self.num_rows = 0
        self.names: list[str] = []
        self.let_go: set[str] = set()  # columns :meth:`keep_only` dropped

    def mark(self) -> tuple:
        """Where the rows added so far end (:meth:`rollback`)."""
        parts = {k: len(v) for k, v in self._parts.items()}
        return self.num_rows, len(self._added), dict(self._done), list(self.names), parts

    def rollback(self, mark: tuple) -> None:
        """Forget the rows added after ``mark`` (a file that failed part way)."""
        self.num_rows, files, self._done, self.names, parts = mark
        del self._added[files:]
        for name in list(self._parts):
            if name not in parts:
                del self._parts[name]
            else:
                del self._parts[name][parts[name] :]

    def add(self, table: pa.Table, file: int) -> None:
        """The next rows, of file ``file`` (its rows in order, from its first)."""
        n = table.num_rows
        for name in plan_columns(table.column_names):
            if name not in self.names:  # rows before it lack it
                self.names.append(name)
                if self.num_rows:
                    self._parts[name] = [("py", [None] * self.num_rows)]
        done = self._done.get(file, 0)
        self._done[file] = done + n
        self._added.append((file, done, n))
        self.num_rows += n
        for name in self.names:
            if name in table.column_names:
                part = self._part(name, table.column(name))
            else:
                part = ("py", [None] * n)
            self._parts.setdefault(name, []).append(part)

    def _code(self, name: str, values: list) -> np.ndarray:
        words = self._words.setdefault(name, {})
        return np.array([words.setdefault(v, len(words)) for v in values], np.int64)

    def _part(self, name: str, col: pa.ChunkedArray) -> tuple[str, Any]:
        """A column's rows as numbers (numpy), codes (strings, lists of strings) or, with nulls
        or another type, Python values."""
        t = col.type
        if col.null_count:
            return "py", col.to_pylist()
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return "np", np.array(col.to_numpy(), copy=True)
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            enc = col.combine_chunks().dictionary_encode()
            local = self._code(name, enc.dictionary.to_pylist())
            return "code", local[enc.indices.to_numpy()]
        is_list = pa.types.is_list(t) or pa.types.is_large_list(t)
        if is_list and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type)):
            lists = col.combine_chunks()
            flat = lists.flatten()
            if not flat.null_count:
                enc = flat.dictionary_encode()
                strings = enc.dictionary.to_pylist()
                codes = enc.indices.to_numpy()
                offsets = lists.offsets.to_numpy()
                offsets = offsets - offsets[0]
                rows = [
                    tuple(strings[k] for k in codes[offsets[i] : offsets[i + 1]].tolist())
                    for i in range(len(lists))
                ]
                return "code", self._code(name, rows)
        return "py", col.to_pylist()

    def getter(self, name: str) -> Callable[[int], Any]:
        """Row ``i``'s value of column ``name`` (what ``to_pylist`` gives)."""
        if name in self.let_go:
            raise RuntimeError(f"column {name} was let go after the plan (inspect the root again)")
        parts = self._parts.get(name, [])
        kinds = {k for k, _ in parts}
        if kinds == {"np"}:
            values = np.concatenate([v for _, v in parts])
            return lambda i: values[i].item()
        if kinds == {"code"}:
            codes = np.concatenate([v for _, v in parts])
            words = list(self._words[name])
            if words and isinstance(words[0], tuple):
                return lambda i: list(words[codes[i]])
            return lambda i: words[codes[i]]
        values_list: list = []
        for kind, v in parts:
            if kind == "py":
                values_list += v
            elif kind == "np":
                values_list += v.tolist()
            else:
                words = list(self._words[name])
                values_list += [
                    list(w) if isinstance(w, tuple) else w for w in (words[c] for c in v)
                ]
        return values_list.__getitem__

    def getters(self) -> dict[str, Callable[[int], Any]]:
        """:meth:`getter` of every column held."""
        return {name: self.getter(name) for name in self.names}

    def keep_only(self, names: tuple[str, ...]) -> None:
        """Let go of every column but ``names`` (those the plan alone reads, once it is made:
        ~40 bytes an episode)."""
        for name in [n for n in self.names if n not in names]:
            self.let_go.add(name)
            self._parts.pop(name, None)
            self._words.pop(name, None)
        self.names = [n for n in self.names if n in names]
        for name in self.names:  # held to the end of the build: int32 while the values fit
            self._parts[name] = [(k, _narrow(v) if k == "np" else v) for k, v in self._parts[name]]

    @property
    def file_of(self) -> np.ndarray:
        """Each row's file (int32; made when asked: a number per table is held)."""
        files = np.array([f for f, _, _ in self._added], np.int32)
        return np.repeat(files, [n for _, _, n in self._added])

    @property
    def row_in_file(self) -> np.ndarray:
        """Each row's row in its file (int64; made when asked)."""
        parts = [np.arange(a, a + n, dtype=np.int64) for _, a, n in self._added]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def place(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The file (int32) and the row in that file (int64) of each of ``rows`` (positions in
        the recovered rows): made from one (file, first row, rows) per table, for the rows
        asked (no column of every row's place held)."""
        files = np.array([f for f, _, _ in self._added], np.int32)
        firsts = np.array([a for _, a, _ in self._added], np.int64)
        starts = np.cumsum([0] + [n for _, _, n in self._added])[:-1].astype(np.int64)
        t = np.searchsorted(starts, rows, side="right") - 1
        return files[t], firsts[t] + (np.asarray(rows, np.int64) - starts[t])

    def files(self) -> list[int]:
        """The files with recovered rows, in order."""
        return sorted({f for f, _, n in self._added if n})

    def episode_index(self) -> np.ndarray:
        """Each row's ``episode_index`` (int64)."""
        get = self.getter("episode_index")
        parts = self._parts.get("episode_index", [])
        if parts and all(k == "np" for k, _ in parts):
            return np.concatenate([v for _, v in parts]).astype(np.int64)
        return np.array([get(i) for i in range(self.num_rows)], np.int64)
