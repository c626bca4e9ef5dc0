"""The episodes ``episodekit repair`` keeps: :class:`Episode` (one kept episode, as the plan
and the build read it) and :class:`Kept`, the plan's list of them held as columns (a few
arrays of numbers, tasks and camera places as codes): an :class:`Episode` is made when one is
read, none is held per episode. At 100,000 episodes the Python objects of one ``Episode``
each (ints, lists, dicts) took ~30 MB for the whole run; the columns took ~5.5 MB as int64
columns and take ~2 MB now (int32 while the values fit; ``index``, ``length`` and
``first_index`` read from the episode's run in its data file, not held a second time).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from episodekit.writers.repair_inspect import DataFile

INTS = ("index", "length", "first_index", "run", "meta_row", "source_row")


@dataclass(slots=True)
class Episode:
    """A kept episode: where its rows are, its metadata row (recovered: the row's position in
    the recovered rows; else rebuilt), each camera's place in the mp4s."""

    index: int
    length: int
    first_index: int
    data: DataFile
    run: int  # its run in ``data``
    meta_row: int | None  # its recovered row (None: rebuilt)
    source_row: int | None = None  # the recovered row found for it, even when rebuilt
    tasks: list[str] = field(default_factory=list)
    videos: dict[str, tuple[int, int, float, float]] = field(default_factory=dict)
    why_rebuilt: str = ""

    @property
    def rebuilt(self) -> bool:
        return self.meta_row is None


class _Column:
    """A growable numpy column: room for ``capacity`` values at once (one allocation when the
    caller knows how many will come), doubled when full. ``array.append`` grows its buffer by
    ~6% at a time: six columns growing side by side left the C heap ~2x their size in holes.
    An int32 column becomes int64 when a value does not fit."""

    def __init__(self, dtype: str, capacity: int = 0) -> None:
        self._values = np.zeros(max(capacity, 16), dtype)
        self._n = 0

    def append(self, v) -> None:
        values = self._values
        if values.dtype == np.int32 and not _I32_MIN <= v <= _I32_MAX:
            values = self._values = values.astype(np.int64)
        if self._n == len(values):
            grown = np.zeros(2 * len(values), values.dtype)
            grown[: self._n] = values
            values = self._values = grown
        values[self._n] = v
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int):
        return self._values[i].item()

    def values(self) -> np.ndarray:
        """The values appended (a view)."""
        return self._values[: self._n]


_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
RUN = ("index", "length", "first_index")  # what the episode's run in its data file says


class Kept(Sequence[Episode]):
    """Kept episodes in order, appended one at a time (:meth:`append`), held as columns; read
    back as :class:`Episode` values (made when read: changing one changes nothing held), or a
    column at a time (:meth:`column`). An episode's ``index``, ``length`` and ``first_index``
    are those of its run in its data file (held once, there: an episode whose values are not
    is held apart); the other numbers are int32 columns while their values fit."""

    def __init__(self, data: Sequence[DataFile], cameras: Sequence[str], capacity: int = 0) -> None:
        """``capacity``: how many episodes may be appended (more still can: room is made)."""
        self._data = list(data)
        self._data_id = {id(df): i for i, df in enumerate(self._data)}
        self._cameras = list(cameras)
        self._ints = {k: _Column("int32", capacity) for k in INTS if k not in RUN}
        self._apart: dict[int, tuple[int, int, int]] = {}  # i -> RUN, not its run's
        self._file = _Column("int32", capacity)
        self._tasks = _Column("int32", capacity)
        self._task_code: dict[tuple[str, ...], int] = {}
        self._task_lists: list[tuple[str, ...]] = []
        kinds = ("int64", "int64", "float64", "float64")
        self._places = {c: tuple(_Column(k, capacity) for k in kinds) for c in cameras}
        self._odd: dict[int, dict] = {}  # episodes whose cameras are not exactly ``cameras``
        self._why: dict[int, str] = {}

    def append(self, e: Episode) -> None:
        """Hold ``e`` (its values as they are now)."""
        i = len(self)
        for k, col in self._ints.items():
            v = getattr(e, k)
            col.append(-1 if v is None else int(v))
        run = (int(e.index), int(e.length), int(e.first_index))
        if run != self._of_run(e.data, e.run):
            self._apart[i] = run
        self._file.append(self._data_id[id(e.data)])
        tasks = tuple(e.tasks)
        self._tasks.append(self._task_code.setdefault(tasks, len(self._task_code)))
        if len(self._task_lists) < len(self._task_code):
            self._task_lists.append(tasks)
        if set(e.videos) == set(self._cameras):
            for c in self._cameras:
                for col, v in zip(self._places[c], e.videos[c]):
                    col.append(v)
        else:
            self._odd[i] = dict(e.videos)
            for c in self._cameras:
                for col in self._places[c]:
                    col.append(0)
        if e.why_rebuilt:
            self._why[i] = e.why_rebuilt

    @staticmethod
    def _of_run(df: DataFile, r: int) -> tuple[int, int, int] | None:
        """``RUN`` as run ``r`` of ``df`` says (None: ``df`` has no run ``r``)."""
        if not 0 <= r < len(df.episode):
            return None
        return int(df.episode[r]), int(df.rows[r]), int(df.first_index[r])

    def __len__(self) -> int:
        return len(self._file)

    def _one(self, i: int) -> Episode:
        ints = {k: col[i] for k, col in self._ints.items()}
        df = self._data[self._file[i]]
        run = self._apart.get(i) or self._of_run(df, ints["run"])
        assert run is not None
        videos = self._odd.get(i)
        if videos is None:
            videos = {
                c: (int(a[i]), int(b[i]), float(s[i]), float(t[i]))
                for c, (a, b, s, t) in self._places.items()
            }
        return Episode(
            run[0],
            run[1],
            run[2],
            df,
            ints["run"],
            None if ints["meta_row"] < 0 else ints["meta_row"],
            None if ints["source_row"] < 0 else ints["source_row"],
            list(self._task_lists[self._tasks[i]]),
            dict(videos),
            self._why.get(i, ""),
        )

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self._one(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("kept episode index out of range")
        return self._one(i)

    def __iter__(self) -> Iterator[Episode]:
        for i in range(len(self)):
            yield self._one(i)

    def files(self) -> np.ndarray:
        """Each kept episode's data file (its position in the inventory's, int64)."""
        return self._file.values().astype(np.int64)

    def held(self, name: str) -> np.ndarray:
        """One of :data:`INTS` but :data:`RUN` as held (int32 while its values fit; -1 for a
        None): a view, not a copy, not to be changed."""
        return self._ints[name].values()

    def column(self, name: str) -> np.ndarray:
        """One of :data:`INTS` for every kept episode (int64; -1 for a None)."""
        if name not in RUN:
            return self._ints[name].values().astype(np.int64)
        attr = {"index": "episode", "length": "rows", "first_index": "first_index"}[name]
        out = np.zeros(len(self), np.int64)
        files, runs = self._file.values(), self._ints["run"].values()
        for f in np.unique(files).tolist():
            mine = np.flatnonzero(files == f)
            values = getattr(self._data[f], attr)
            ok = (runs[mine] >= 0) & (runs[mine] < len(values))  # else held apart
            out[mine[ok]] = values[runs[mine[ok]]]
        k = RUN.index(name)
        for i, run in self._apart.items():
            out[i] = run[k]
        return out


def column(kept: Sequence[Episode], name: str) -> np.ndarray:
    """``name`` (one of :data:`INTS`) of every episode of ``kept`` (int64; -1 for a None)."""
    if isinstance(kept, Kept):
        return kept.column(name)
    values = [getattr(e, name) for e in kept]
    return np.array([-1 if v is None else v for v in values], np.int64)


def files_of(kept: Sequence[Episode], data: Sequence[DataFile]) -> np.ndarray:
    """Each episode's data file in ``kept``, as its position in ``data`` (int64)."""
    if isinstance(kept, Kept) and kept._data == list(data):
        return kept.files()
    at = {id(df): i for i, df in enumerate(data)}
    return np.array([at[id(e.data)] for e in kept], np.int64)


def task_lists(kept: Sequence[Episode]) -> list[tuple[str, ...]]:
    """The distinct task lists the episodes of ``kept`` have (each once, as a tuple)."""
    if isinstance(kept, Kept):
        return list(kept._task_lists)
    return list(dict.fromkeys(tuple(e.tasks) for e in kept))
