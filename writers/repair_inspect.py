"""What a damaged LeRobot v3.0 root holds, file by file, read without writing anything: the
first half of ``episodekit repair`` (:mod:`episodekit.writers.repair_plan` decides from it).

- data and ``meta/episodes`` parquet files: read through their footer, or, without one (a
  writer never closed), salvaged in place (:func:`episodekit.core.parquet_salvage.scan` under
  the footer of a readable sibling file, else under the schema LeRobot builds from info.json:
  :mod:`episodekit.writers.repair_schema`); of the data, the ``episode_index`` and ``index``
  columns only (the episodes they hold, where in the file);
- videos: each mp4's frames from its sample tables, counting only frames whose bytes are in
  the file (a copy cut short keeps its index but not its tail);
- what the recorder staged: PNGs under ``images/`` and episode mp4s in ``tmp*/`` folders;
- info.json checked key by key, each damaged key rebuilt from the data or refused
  (:mod:`episodekit.writers.repair_info`; fps from the timestamps, read with the data);
- tasks.parquet and stats.json as they are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core import interrupt, parquet_read
from episodekit.core import parquet_salvage as ps
from episodekit.core import parquet_window as pw
from episodekit.core import thrift_compact as tc
from episodekit.core.dataset import read_tasks_table, resolve_root
from episodekit.core.errors import DatasetError, EnvironmentProblem
from episodekit.core.executor import imap_files
from episodekit.writers import repair_info, repair_schema
from episodekit.writers.repair_columns import RecoveredColumns

CHUNK_FILE = re.compile(r"chunk-(\d+)/file-(\d+)\.(?:parquet|mp4)$")
STAGED_PNG = re.compile(r"images/(.+)/episode-(\d+)/[^/]+\.png$")
TEMP_VIDEO = re.compile(r"tmp[^/]*/(.+)_(\d+)\.mp4$")


@dataclass
class ParquetState:
    """One parquet file: readable (``intact``), salvaged (``salvage`` under ``template``), or
    neither (``problem``)."""

    rel: str
    chunk: int
    file: int
    size: int
    intact: bool
    salvage: ps.Salvage | None = None
    template: tc.Struct | None = None
    problem: str = ""

    @property
    def num_rows(self) -> int:
        if self.intact:
            return int(self.total_rows)
        return self.salvage.num_rows if self.salvage else 0

    total_rows: int = 0

    def windows(self, root: Path) -> pw.RowGroupWindows:
        """A salvaged file's row groups, a window at a time under footers of their own (never
        one footer of them all: :mod:`episodekit.core.parquet_window`)."""
        return ps.windows(root / self.rel, self.salvage, self.template)

    @contextlib.contextmanager
    def open(self, root: Path) -> Iterator[parquet_read.DataFile]:
        """An intact file, under its own footer (:func:`~episodekit.core.parquet_read.
        read_footer`'s, parsed once)."""
        if not self.intact:
            raise ValueError(f"{self.rel} has no footer: read it by windows")
        with parquet_read.open_data_file(str(root / self.rel)) as pf:
            yield pf

    def footers(self, root: Path) -> Iterator[parquet_read.FileMetaData]:
        """The footer of the file's row groups, in consecutive parts (a salvaged file's a
        window at a time; an intact file's whole)."""
        if self.intact:
            with self.open(root) as pf:
                yield pf.metadata
            return
        w = self.windows(root)
        for window in w.windows():
            yield w.metadata(window)

    def group_rows(self, root: Path) -> np.ndarray:
        """Rows of each row group (int64)."""
        if self.intact:
            with self.open(root) as pf:
                return pf.row_group_rows()
        return ps.group_rows(self.salvage)

    def tables(
        self, root: Path, columns: list[str] | None = None, rows: int | None = None
    ) -> Iterator[pa.Table]:
        """Every row in order, a bounded part (about ``rows``) at a time (``columns`` only)."""
        rows = rows or RUN_BATCH
        if self.intact:
            with self.open(root) as pf:
                for batch in pf.batches(rows, columns):
                    yield pa.Table.from_batches([batch])
            return
        yield from self.windows(root).tables(columns, rows)

    def read(self, root: Path, columns: list[str] | None = None) -> pa.Table:
        """The whole file (``columns`` only) as one table."""
        if self.intact:
            with self.open(root) as pf:
                return pf.read(columns)
        return self.windows(root).read_all(columns)

    def read_rows(
        self,
        root: Path,
        first: int,
        n: int,
        columns: list[str] | None = None,
        ends: np.ndarray | None = None,
    ) -> pa.Table:
        """Rows ``first`` .. ``first + n - 1`` (``columns`` only), from the row groups holding
        them (``ends``: the cumulated :meth:`group_rows`, when the caller has them)."""
        ends = np.cumsum(self.group_rows(root)) if ends is None else ends
        a = int(np.searchsorted(ends, first, side="right"))
        b = int(np.searchsorted(ends, first + n - 1, side="right"))
        if self.intact:
            with self.open(root) as pf:
                table = pf.read_row_groups(list(range(a, b + 1)), columns=columns)
        else:
            table = self.windows(root).read(range(a, b + 1), columns)
        return table.slice(first - (int(ends[a - 1]) if a else 0), n)

    def schema(self, root: Path) -> pa.Schema:
        """The file's Arrow schema (with its key-value metadata)."""
        if self.intact:
            with self.open(root) as pf:
                return pf.schema
        return self.windows(root).schema

    def damage(self) -> str | None:
        """What is wrong with the file, in words (None when intact)."""
        if self.intact:
            return None
        if self.salvage is None:
            return f"unreadable ({self.problem})"
        s = self.salvage
        cut = f"; {s.dropped_bytes:,} bytes after them dropped ({s.stop})"
        cut = cut if s.dropped_bytes else ""
        return (
            f"no parquet footer (its writer was never closed): {len(s.row_groups)} whole row "
            f"groups, {s.num_rows:,} rows recovered{cut}"
        )


@dataclass
class DataFile(ParquetState):
    """A data file and the episodes in it: one entry per run of one ``episode_index`` (int32
    columns while their values fit, else int64: read them with ``int()`` or sums)."""

    episode: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    first_row: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    group_end: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # run ends a group
    index_gaps: int = 0  # places where ``index`` does not go up by one inside a run


@dataclass
class MetaFile(ParquetState):
    """A ``meta/episodes`` file; its rows recovered (``recovered``: the plan's columns of them
    are in :attr:`Inventory.recovered`; the whole rows are read again when written)."""

    recovered: int = 0


@dataclass
class VideoState:
    """One mp4 of one camera: the pts (ticks, ascending) of every frame its index lists, the
    time base, and how many of the last of them have bytes cut off the file."""

    rel: str
    chunk: int
    file: int
    pts: np.ndarray
    time_base: float
    frame_ticks: int
    missing: int = 0  # frames the index lists whose bytes were cut off
    problem: str = ""

    @property
    def frames(self) -> int:
        return len(self.pts)

    @property
    def whole(self) -> int:
        """Frames (in pts order from the first) whose bytes are all in the file."""
        return len(self.pts) - self.missing


@dataclass
class Inventory:
    """Everything :func:`inspect_root` found."""

    root: Path
    info: dict
    tasks: pa.Table | None  # task_index, task (sorted)
    tasks_raw: pa.Table | None  # the file's table as written (schema and metadata)
    tasks_problem: str
    stats: dict | None
    stats_problem: str
    data: list[DataFile]
    episodes: list[MetaFile]
    videos: dict[str, list[VideoState]]
    staged_png: dict[int, dict[str, int]]  # episode -> camera -> PNG files
    temp_videos: dict[int, dict[str, str]]  # episode -> camera -> relative path
    other: list[str]  # files repair leaves as they are (README, ...)
    info_on_disk: dict | None = None  # info.json as read (None: not a JSON object)
    info_damages: list[tuple[str, str]] = field(default_factory=list)  # info.json's keys rebuilt
    recovered: RecoveredColumns = field(default_factory=RecoveredColumns)  # the plan's columns


def _chunk_file(rel: str) -> tuple[int, int]:
    m = CHUNK_FILE.search(rel)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


def _files(root: Path, pattern: str) -> list[str]:
    found = [p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file()]
    return sorted(found, key=lambda r: (_chunk_file(r), r))


def _parquet_state(root: Path, rel: str, cls: type) -> ParquetState:
    path = root / rel
    chunk, file = _chunk_file(rel)
    size = path.stat().st_size
    try:
        meta = parquet_read.read_footer(str(path))
        return cls(rel, chunk, file, size, True, total_rows=meta.num_rows)
    except (DatasetError, EnvironmentProblem) as exc:
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno is not None:
            raise EnvironmentProblem(f"cannot read: {cause.strerror}", str(path)) from cause
        return cls(rel, chunk, file, size, False, problem=_first_line(exc))


def _scan_job(job: tuple[str, tc.Struct, int | None]) -> ps.Salvage | str:
    """One footer-less file walked (an executor job): its salvage, or why there is none."""
    path, template, codec = job
    try:
        return ps.scan(path, template, codec)
    except ps.SalvageError as exc:
        return str(exc)


def _salvage_all(root: Path, jobs: list[tuple[ParquetState, tc.Struct, int | None]], executor):
    """Walk every footer-less file, one job per file: in this process with the local
    executor (a recording has one or two such files, and a spawned worker costs more than it
    saves: measured), as Ray tasks with ``ray``."""
    items = [(str(root / s.rel), t, c) for s, t, c in jobs]
    workers = 1 if executor == "local" else None
    for i, got in imap_files(_scan_job, items, executor, workers):
        state, template = jobs[i][0], jobs[i][1]
        if isinstance(got, str):
            state.problem = got
        else:
            state.salvage, state.template = got, template


def _template(root: Path, states: list[ParquetState], schema) -> tuple[tc.Struct, int | None]:
    """The footer of the first readable file (and its codec), else one for ``schema()``."""
    for s in states:
        if s.intact:
            try:
                t = ps.read_template(root / s.rel)
                return t, ps.template_codec(t)
            except ps.SalvageError:
                continue
    return ps.schema_template(schema()), None


RUN_BATCH = 1 << 16  # rows of episode_index/index read at a time (memory: O(episodes))


def _first_line(exc: BaseException) -> str:
    """What pyarrow said (the first line), under our error naming the file."""
    cause = exc.__cause__ if isinstance(exc, (DatasetError, EnvironmentProblem)) else None
    return str(cause or exc).splitlines()[0]


def _group_statistics(meta: parquet_read.FileMetaData) -> np.ndarray | None:
    """(episode, first index, last index, rows) of each row group of ``meta`` (4 x groups),
    when every group's statistics tell one episode; None when they do not. (The column names
    come from a row group, not ``meta.schema``: pyarrow never frees a footer whose schema was
    asked for, 5 KB a row group.)"""
    n = meta.num_row_groups
    out = np.zeros((4, n), np.int64)
    if not n:
        return out
    first = meta.row_group(0)
    names = [first.column(j).path_in_schema for j in range(meta.num_columns)]
    if "episode_index" not in names or "index" not in names:
        return None
    e, x = names.index("episode_index"), names.index("index")
    for g in range(n):
        rg = meta.row_group(g)
        se, si = rg.column(e).statistics, rg.column(x).statistics
        if se is None or si is None or not (se.has_min_max and si.has_min_max):
            return None
        if se.null_count or si.null_count or se.min != se.max:
            return None
        out[:, g] = se.min, si.min, si.max, rg.num_rows
    return out


def _runs_from_statistics(df: DataFile, footers: Iterator[parquet_read.FileMetaData]) -> bool:
    """:func:`_runs` from the footer alone (``footers``: its consecutive parts) when every row
    group holds one episode whose ``index`` goes up by one (the recorder writes one group per
    episode; its statistics tell min and max): no data page is read. False when the
    statistics do not tell."""
    parts = []
    for meta in footers:
        part = _group_statistics(meta)
        if part is None:
            return False
        parts.append(part)
    ep, lo, hi, rows = np.concatenate(parts, axis=1) if parts else np.zeros((4, 0), np.int64)
    n = len(ep)
    if np.any(hi - lo + 1 != rows):
        return False  # index skips or repeats inside a group: read the values
    new = np.r_[True, ep[1:] != ep[:-1]] if n else np.zeros(0, bool)
    starts = np.flatnonzero(new)
    offsets = np.r_[0, np.cumsum(rows)]
    first_row = offsets[starts]
    _set_runs(df, ep[starts], lo[starts], np.diff(np.r_[first_row, offsets[-1]]), first_row)
    df.group_end = np.ones(len(starts), bool)
    df.index_gaps = int(np.sum(~new[1:] & (lo[1:] != hi[:-1] + 1)))
    return True


def _set_runs(df: DataFile, *columns: np.ndarray) -> None:
    """``df``'s episode, first_index, rows and first_row: each int32 while its values are below
    2**30 in size (a sum of two still fits), else int64 (~33 bytes an episode as int64)."""
    fit = [not len(c) or int(np.abs(c).max()) < (1 << 30) for c in columns]
    narrow = [c.astype(np.int32 if f else np.int64) for c, f in zip(columns, fit)]
    df.episode, df.first_index, df.rows, df.first_row = narrow


def _runs(df: DataFile, root: Path) -> None:
    """The episodes of a data file (``episode_index`` runs), where they lie, and where
    ``index`` skips a value inside one; from the row groups' statistics when they tell
    (:func:`_runs_from_statistics`), else streamed a part at a time."""
    if _runs_from_statistics(df, df.footers(root)):
        return
    ep_parts, first_parts, start_parts = [], [], []
    gaps = at = 0
    last_ep = last_idx = None
    for batch in df.tables(root, ["episode_index", "index"]):
        if not batch.num_rows:
            continue
        ep = batch.column(0).to_numpy()
        idx = batch.column(1).to_numpy()
        new = np.r_[last_ep is None or ep[0] != last_ep, ep[1:] != ep[:-1]]
        step = np.r_[last_idx is None or idx[0] != last_idx + 1, np.diff(idx) != 1]
        gaps += int((step & ~new).sum())  # a new episode may start anywhere
        starts = np.flatnonzero(new)
        ep_parts.append(ep[starts])
        first_parts.append(idx[starts])
        start_parts.append(starts + at)
        at += len(ep)
        last_ep, last_idx = ep[-1], idx[-1]
    cat = (lambda parts: np.concatenate(parts).astype(np.int64)) if ep_parts else None
    starts = cat(start_parts) if cat else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], at].astype(np.int64)
    episode = cat(ep_parts) if cat else starts
    _set_runs(df, episode, cat(first_parts) if cat else starts, ends - starts, starts)
    df.group_end = np.isin(ends, np.cumsum(df.group_rows(root)))
    df.index_gaps = gaps


def _damaged(root: Path, states: list, schema) -> list[tuple[ParquetState, tc.Struct, int | None]]:
    """(state, template, codec) of each footer-less file of one kind."""
    damaged = [s for s in states if not s.intact]
    if not damaged:
        return []
    template, codec = _template(root, states, schema)
    return [(s, template, codec) for s in damaged]


def inspect_data(root: Path, data: list[DataFile]) -> None:
    """The episodes in every readable or salvaged data file (:func:`_runs`)."""
    for s in data:
        if s.intact or s.salvage is not None:
            try:
                _runs(s, root)
            except (DatasetError, pa.ArrowException, OSError, KeyError) as exc:
                interrupt.check()  # Ctrl-C that a library turned into an error
                s.intact, s.salvage = False, None
                s.problem = f"its rows cannot be read ({_first_line(exc)})"


META_ROWS = 4096  # rows of a meta/episodes file decoded at a time (~1.7 KB each)


def inspect_episodes(root: Path, episodes: list[MetaFile]) -> RecoveredColumns:
    """The rows of every readable or salvaged ``meta/episodes`` file, decoded whole a part at
    a time (a page that does not decode makes the file unreadable here, not when it is
    written); of them, the columns the plan reads are kept
    (:class:`~episodekit.writers.repair_columns.RecoveredColumns`)."""
    out = RecoveredColumns()
    for i, s in enumerate(episodes):
        if s.intact or s.salvage is not None:
            mark = out.mark()
            try:
                for part in s.tables(root, rows=META_ROWS):
                    out.add(part, i)
                    s.recovered += part.num_rows
                    del part
            except (DatasetError, pa.ArrowException, OSError) as exc:
                interrupt.check()  # Ctrl-C that a library turned into an error
                out.rollback(mark)
                s.intact, s.salvage, s.recovered = False, None, 0
                s.problem = f"its rows cannot be read ({_first_line(exc)})"
            finally:
                pa.default_memory_pool().release_unused()
    return out


def _video_state(root: Path, rel: str) -> VideoState:
    from episodekit.core.video import VideoError, mp4_sample_table, probe

    chunk, file = _chunk_file(rel)
    path = root / rel
    empty = np.zeros(0, np.int64)
    try:
        index = probe(path)
    except (VideoError, OSError) as exc:
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        return VideoState(rel, chunk, file, empty, 0.0, 0, problem=str(exc).split("\n")[0])
    pts = index.pts
    missing = 0
    with contextlib.suppress(Exception), open(path, "rb") as fh:  # frames cut off the end
        table = mp4_sample_table(fh, str(path))
        if table is not None and len(table.pts) == len(pts):
            inside = table.offset + table.size <= path.stat().st_size
            keep = int(np.argmin(inside)) if not inside.all() else len(inside)
            missing = len(pts) - keep  # decode order is pts order in the recorder's files
    ticks = int(np.median(np.diff(index.pts))) if len(index.pts) > 1 else 0
    if not ticks and index.fps:
        ticks = round(1 / (index.fps * float(index.time_base)))
    return VideoState(rel, chunk, file, pts, float(index.time_base), ticks, missing)


def inspect_videos(root: Path, info: dict) -> dict[str, list[VideoState]]:
    out = {}
    for key in repair_schema.video_keys(info):
        rels = _files(root, f"videos/{key}/*/*.mp4")
        out[key] = [_video_state(root, rel) for rel in rels]
    return out


def _staged(root: Path) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, str]]]:
    png: dict[int, dict[str, int]] = {}
    temp: dict[int, dict[str, str]] = {}
    images = root / "images"
    if images.is_dir():
        for p in images.rglob("*.png"):
            m = STAGED_PNG.search(p.relative_to(root).as_posix())
            if m:
                cams = png.setdefault(int(m.group(2)), {})
                cams[m.group(1)] = cams.get(m.group(1), 0) + 1
    for p in root.glob("tmp*/*.mp4"):
        m = TEMP_VIDEO.search(p.relative_to(root).as_posix())
        if m:
            temp.setdefault(int(m.group(2)), {})[m.group(1)] = p.relative_to(root).as_posix()
    return png, temp


def _json(root: Path, rel: str) -> tuple[dict | None, str]:
    try:
        value = json.loads((root / rel).read_text())
    except FileNotFoundError:
        return None, "missing"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"not valid JSON ({exc})"
    return (value, "") if isinstance(value, dict) else (None, "not a JSON object")


def inspect_root(root: str | os.PathLike, executor: str = "local") -> Inventory:
    """Read everything repair needs from a local v3.0 root (see the module docstring);
    ``executor``: where the footer-less files are walked (:mod:`episodekit.core.executor`)."""
    fs, _ = resolve_root(str(root))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol not in ("file", "local"):
        raise EnvironmentProblem("repair works on a local root; download it first", str(root))
    base = Path(root)
    if not base.is_dir():
        raise EnvironmentProblem("root does not exist or is not a folder", str(root))
    on_disk, problem = _json(base, repair_info.INFO)
    if problem == "missing":
        raise DatasetError(f"meta/info.json is {problem}: repair needs its features", str(root))
    data = [_parquet_state(base, rel, DataFile) for rel in _files(base, "data/*/*.parquet")]
    rels = _files(base, "meta/episodes/*/*.parquet")
    episodes = [_parquet_state(base, rel, MetaFile) for rel in rels]
    mp4s = _files(base, "videos/*/*/*.mp4")
    checked = repair_info.check_info(
        base,
        on_disk,
        problem,
        [s.rel for s in data],
        _first_schema(base, data),
        [s.rel for s in data] + rels + mp4s,
        (_first_schema(base, episodes) or (None,))[0],
    )
    info = checked.info
    tasks = tasks_raw = None
    tasks_problem = ""
    try:
        tasks_raw = parquet_read.read_table(None, str(base / "meta/tasks.parquet"))
        tasks = read_tasks_table(fs, str(base), "v3.0")
    except (DatasetError, EnvironmentProblem, pa.ArrowException, OSError) as exc:
        interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
        tasks_problem = _first_line(exc) if tasks_raw is None else str(exc).split("\n")[0]
    stats, stats_problem = _json(base, "meta/stats.json")
    png, temp = _staged(base)
    jobs = _damaged(base, data, lambda: repair_schema.data_schema(info))
    jobs += _damaged(base, episodes, lambda: repair_schema.episodes_schema(info))
    _salvage_all(base, jobs, executor)
    inspect_data(base, data)
    if checked.fps_problem:
        _derive_fps(base, data, checked)
    recovered = inspect_episodes(base, episodes)
    videos = inspect_videos(base, info)
    handled = {"meta/info.json", "meta/stats.json", "meta/tasks.parquet"}
    handled |= {s.rel for s in data} | {m.rel for m in episodes}
    handled |= {v.rel for files in videos.values() for v in files}
    other = [
        rel
        for p in sorted(base.rglob("*"))
        if p.is_file()
        and (rel := p.relative_to(base).as_posix()) not in handled
        and p.relative_to(base).parts[0] != "images"
        and not TEMP_VIDEO.search(rel)
        and not p.name.startswith(".episodekit")
    ]
    return Inventory(
        root=base,
        info=info,
        tasks=tasks,
        tasks_raw=tasks_raw,
        tasks_problem=tasks_problem,
        stats=stats,
        stats_problem=stats_problem,
        data=data,
        episodes=episodes,
        videos=videos,
        staged_png=png,
        temp_videos=temp,
        other=other,
        info_on_disk=checked.on_disk,
        info_damages=checked.damages,
        recovered=recovered,
    )


def _first_schema(root: Path, files: list) -> tuple[pa.Schema, str] | None:
    """The Arrow schema (with its key-value metadata: ``huggingface`` for data files) of the
    first of ``files`` with a footer, and that file; None when none has one."""
    for s in files:
        if s.intact:
            meta = parquet_read.read_footer(str(root / s.rel))
            return meta.schema.to_arrow_schema(), s.rel
    return None


def _derive_fps(root: Path, data: list[DataFile], checked: repair_info.CheckedInfo) -> None:
    """info.json's fps from the timestamps of the first readable data file
    (:func:`~episodekit.writers.repair_info.derive_fps`)."""
    why = checked.fps_problem
    for s in data:
        if not (s.intact or s.salvage is not None):
            continue
        ts, fi = [], []
        for batch in s.tables(root, ["timestamp", "frame_index"]):
            ts.append(batch.column(0).to_numpy())
            fi.append(batch.column(1).to_numpy())
        if ts:
            fps = repair_info.derive_fps(np.concatenate(ts), np.concatenate(fi), why, root)
            checked.info["fps"] = fps
            if checked.on_disk is not None:
                said = f"{why}: rebuilt as {fps} from the timestamps (frame_index / fps)"
                checked.damages.append((repair_info.INFO, said))
            return
    path = str(root / repair_info.INFO)
    raise repair_info.InfoRefused(f"{why}, and no data file can be read to tell it", path)
