"""Reading a LeRobot dataset root (v3.0, and v2.1 for the metadata commands) into one episode table.

The root may be a local path or any fsspec URL (``file://``, ``memory://``,
``hf://datasets/owner/name``). Only the columns needed are read from the episodes parquet files
(their many ``stats/*`` columns are skipped). The result is a :class:`Dataset` whose ``episodes``
table holds one row per episode in episode order, plus the **episodes fingerprint** that every
artifact records so a stale artifact can be told from a fresh one.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core.errors import (
    DatasetError,
    InconsistentDatasetError,
    MissingFileError,
    UnsupportedVersionError,
    os_problem,
)
from episodekit.core.layout.info import Info
from episodekit.core.layout.rules import DEFAULT_CHUNKS_SIZE, V3
from episodekit.core.parquet_read import (  # re-exported: the names other layers import
    is_local,
    parquet_errors,
    read_schema,
    read_table,
    schema_from_bytes,
)
from episodekit.core.parquet_read import table_from_bytes as parquet_from_bytes  # noqa: F401
from episodekit.core.paths import (
    DATA_PATH_V2,
    DATA_PATH_V3,
    INFO_FILE,
    VIDEO_PATH_V2,
    UnsafePathError,
    check_relative,
    format_template,
    inside_root,
)
from episodekit.core.remote import remote_fs

V2 = ("v2.0", "v2.1")
SUPPORTED_VERSIONS = (V3, *V2)

# Columns of the episode table (video columns are added per camera when present).
EPISODE_COLUMNS = (
    "episode_index",
    "length",
    "dataset_from_index",
    "dataset_to_index",
    "data/chunk_index",
    "data/file_index",
    "tasks",
)
VIDEO_FIELDS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")


def resolve_root(root: str | Any) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return ``(filesystem, path)`` for a local path or fsspec URL (``hf://``, ``memory://``,
    ``http(s)://``: answering ``exists`` with a HEAD request, :func:`~.remote.remote_fs`)."""
    root = str(root)
    fs, path = fsspec.core.url_to_fs(root)
    return remote_fs(fs), path.rstrip("/") or "/"


def read_json(fs: fsspec.AbstractFileSystem, path: str, max_bytes: int = 64 << 20) -> Any:
    """A JSON file (refused above ``max_bytes``: metadata comes from hubs, untrusted)."""
    if not fs.exists(path):
        raise MissingFileError("file is missing", path)
    try:
        with fs.open(path, "rb") as fh:
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise os_problem(exc, path, "read") from exc
    if len(raw) > max_bytes:
        raise DatasetError(f"larger than {max_bytes} bytes: not a metadata file", path)
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise DatasetError(f"not valid JSON ({exc})", path) from exc


def read_parquet(fs, path: str, columns: list[str] | None = None) -> pa.Table:
    """A whole parquet file (:func:`episodekit.core.parquet_read.read_table`)."""
    return read_table(fs, path, columns)


def normalize_tasks_column(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Tasks as ``list<string>`` in one chunk, whatever string/list flavour the file used."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], pa.list_(pa.string()))
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        # A single task string per episode (some tools write that): wrap it.
        col = pa.ListArray.from_arrays(pa.array(np.arange(len(col) + 1, dtype=np.int32)), col)
    return col.cast(pa.list_(pa.string()))


def read_tasks_table(fs, path: str, version: str) -> pa.Table:
    """Tasks as a table (task_index int64, task string) sorted by task_index."""
    if version in V2:
        tpath = posixpath.join(path, "meta/tasks.jsonl")
        schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())])
        table = read_jsonl(_read_bytes(fs, tpath), schema, tpath).select(schema.names)
    else:
        tpath = posixpath.join(path, "meta/tasks.parquet")
        if not fs.exists(tpath):
            raise MissingFileError("file is missing", tpath)
        raw = read_parquet(fs, tpath)
        names = raw.column_names
        task_col = next((c for c in ("task", "__index_level_0__") if c in names), None)
        if task_col is None:
            pandas_meta = json.loads((raw.schema.metadata or {}).get(b"pandas", b"{}") or b"{}")
            idx = [c for c in pandas_meta.get("index_columns", []) if isinstance(c, str)]
            task_col = idx[0] if idx and idx[0] in names else None
        if task_col is None or "task_index" not in names:
            raise DatasetError(
                "expected a task string column ('task' or '__index_level_0__') and 'task_index'; "
                f"found {names}",
                tpath,
            )
        table = pa.table(
            {
                "task_index": raw.column("task_index").cast(pa.int64()),
                "task": raw.column(task_col).cast(pa.string()),
            }
        )
    return table.sort_by("task_index")


def list_files(fs, folder: str, depth: int, suffix: str = "", prefix: str = "") -> list[str]:
    """Files exactly ``depth`` folder levels below ``folder`` (1: its own files) whose name
    starts with ``prefix`` and ends with ``suffix``, sorted; hidden names (temporaries) left
    out. ``folder`` is a path, never a pattern: a root under ``data[1]/`` is listed as it is
    (``fs.glob`` would read its brackets as a character class)."""
    base = folder.rstrip("/")
    try:
        found = fs.find(base, maxdepth=depth, withdirs=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for f in found:
        f = str(f)
        rel = posixpath.relpath(f, base) if f.startswith(base) else f
        name = posixpath.basename(rel)
        if rel.count("/") != depth - 1 or name.startswith("."):
            continue
        if name.startswith(prefix) and name.endswith(suffix):
            out.append(f)
    return sorted(out)


def episodes_files(fs, path: str) -> list[str]:
    """The v3.0 episodes parquet files of a root (``meta/episodes/*/*.parquet``), sorted."""
    return list_files(fs, posixpath.join(path, "meta/episodes"), 2, ".parquet")


def read_episodes_file(fs, f: str, data: bytes | None = None) -> pa.Table:
    """One v3.0 episodes file: the columns of :data:`EPISODE_COLUMNS` plus video columns, typed.
    ``data``: the file's bytes, already read (a remote root's metadata, read once)."""
    if data is None:
        names = read_schema(fs, f).names
    else:
        with parquet_errors(f):
            names = schema_from_bytes(data).names
    missing = [c for c in EPISODE_COLUMNS if c not in names]
    if missing:
        raise DatasetError(f"episodes file lacks columns {missing}", f)
    video = [c for c in names if c.startswith("videos/") and c.rsplit("/", 1)[-1] in VIDEO_FIELDS]
    columns = list(EPISODE_COLUMNS) + video
    if data is None:
        t = read_parquet(fs, f, columns=columns)
    else:
        with parquet_errors(f):
            t = parquet_from_bytes(data, columns=columns)
    t = t.set_column(t.schema.get_field_index("tasks"), "tasks", normalize_tasks_column(t["tasks"]))
    for c in EPISODE_COLUMNS[:-1]:
        try:
            t = t.set_column(t.schema.get_field_index(c), c, t[c].cast(pa.int64()))
        except pa.ArrowException as exc:
            raise DatasetError(f"column {c} is not an integer column ({exc})", f) from exc
    return t


def _episodes_v3(fs, path: str) -> pa.Table:
    files = episodes_files(fs, path)
    if not files:
        folder = posixpath.join(path, "meta/episodes")
        raise MissingFileError("no episodes parquet files (meta/episodes/*/*.parquet)", folder)
    tables = [read_episodes_file(fs, f) for f in files]
    table = pa.concat_tables(tables, promote_options="default").sort_by("episode_index")
    del tables
    # The files' decoded pages are freed but stay in Arrow's pool (~8x the table at 100,000
    # episodes): handed back, the table is what a process holds for its episodes.
    pa.default_memory_pool().release_unused()
    return table


def _read_bytes(fs, path: str) -> bytes:
    """A metadata file's bytes (:class:`MissingFileError` when it is not there)."""
    if not fs.exists(path):
        raise MissingFileError("file is missing", path)
    with fs.open(path, "rb") as fh:
        return fh.read()


def read_jsonl(raw: bytes, schema: pa.Schema, path: str) -> pa.Table:
    """JSON lines (v2.x metadata) as an Arrow table, ``schema``'s keys typed as it says and the
    others inferred, parsed by Arrow's JSON reader (no Python object per value; polars, which
    did this before, cost ~50 MB of resident memory on first use); bad JSON or a value of the
    wrong type: one :class:`DatasetError` naming ``path``."""
    import pyarrow.json as pj

    if not raw.strip():
        return schema.empty_table()
    opts = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    try:
        table = pj.read_json(pa.BufferReader(raw), parse_options=opts)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DatasetError(f"not valid JSON lines ({exc})", path) from exc
    for name in schema.names:
        if table[name].null_count:
            raise DatasetError(f"not valid JSON lines (a line has no {name!r})", path)
    return table


def read_episodes_v2(fs, path: str, info: dict) -> pa.Table:
    """The v2.1 episodes table (``meta/episodes.jsonl``) in the v3.0 column layout."""
    epath = posixpath.join(path, "meta/episodes.jsonl")
    schema = pa.schema([("episode_index", pa.int64()), ("length", pa.int64())])
    table = read_jsonl(_read_bytes(fs, epath), schema, epath)
    if "tasks" not in table.column_names:
        raise DatasetError("not valid JSON lines (no 'tasks' key)", epath)
    table = table.sort_by("episode_index")
    length = table["length"].to_numpy(zero_copy_only=False).astype(np.int64)
    episode = table["episode_index"].to_numpy(zero_copy_only=False).astype(np.int64)
    to = np.cumsum(length)
    chunks_size = int(info.get("chunks_size") or DEFAULT_CHUNKS_SIZE)
    columns = {
        "episode_index": episode,
        "length": length,
        "dataset_from_index": to - length,
        "dataset_to_index": to,
        "data/chunk_index": episode // chunks_size,
        "data/file_index": episode,
    }
    table = pa.table(
        {c: columns[c] if c != "tasks" else normalize_tasks_column(table["tasks"])
         for c in EPISODE_COLUMNS}
    )  # fmt: skip
    for key in video_keys_of(info):
        n = table.num_rows
        table = table.append_column(f"videos/{key}/chunk_index", table["data/chunk_index"])
        table = table.append_column(f"videos/{key}/file_index", table["data/file_index"])
        table = table.append_column(f"videos/{key}/from_timestamp", pa.array(np.zeros(n)))
        to_ts = table["length"].to_numpy() / float(info.get("fps") or 1)
        table = table.append_column(f"videos/{key}/to_timestamp", pa.array(to_ts))
    for c in EPISODE_COLUMNS[:-1]:
        table = table.set_column(table.schema.get_field_index(c), c, table[c].cast(pa.int64()))
    return table


def video_keys_of(info: dict) -> list[str]:
    return [k for k, f in (info.get("features") or {}).items() if f.get("dtype") == "video"]


def compute_fingerprint(episode_index: np.ndarray, length: np.ndarray, tasks: pa.Array) -> str:
    """Hash of (episode_index, length, tasks) over all episodes, in episode order.

    Independent of how the episodes were split into files or which string flavour was used.
    """
    h = hashlib.sha256(b"episodekit-episodes-fingerprint-v1\0")
    h.update(np.ascontiguousarray(episode_index, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(length, dtype="<i8").tobytes())
    tasks = normalize_tasks_column(tasks)
    h.update(np.ascontiguousarray(pc.list_value_length(tasks).fill_null(-1), dtype="<i8").tobytes())
    flat = pc.list_flatten(tasks)
    if len(flat):
        h.update(np.ascontiguousarray(pc.binary_length(flat).fill_null(-1), dtype="<i8").tobytes())
        bufs = flat.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int32)[flat.offset : flat.offset + len(flat) + 1]
        h.update(memoryview(bufs[2])[int(offsets[0]) : int(offsets[-1])])
    return h.hexdigest()[:32]


@dataclass
class Dataset:
    """A LeRobot dataset root: info, tasks, one episode table, and the data files it points at.

    ``info`` is info.json as read; ``layout`` the same parsed strictly (:class:`Info`; None for
    a dataset made in memory rather than opened).

    ``episodes`` columns: episode_index, length, dataset_from_index, dataset_to_index,
    data/chunk_index, data/file_index, tasks (list<string>), task_index (of ``tasks[0]``; -1 when
    unknown), file_id (index into ``data_files``), and ``videos/<key>/*`` when videos exist.
    """

    root: str
    fs: fsspec.AbstractFileSystem
    path: str
    info: dict
    tasks: pa.Table
    episodes: pa.Table
    data_files: list[str] = field(default_factory=list)
    layout: Info | None = None

    @property
    def version(self) -> str:
        return str(self.info.get("codebase_version"))

    @property
    def fps(self) -> float:
        return float(self.info["fps"])

    @property
    def features(self) -> dict:
        return dict(self.info.get("features") or {})

    @property
    def video_keys(self) -> list[str]:
        return video_keys_of(self.info)

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f.get("dtype") == "image"]

    @property
    def num_episodes(self) -> int:
        return self.episodes.num_rows

    @property
    def num_frames(self) -> int:
        return int(self.column("length").sum()) if self.num_episodes else 0

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    def column(self, name: str) -> np.ndarray:
        """One episode-table column as numpy (zero-copy where arrow allows)."""
        return self.episodes.column(name).to_numpy()

    def join(self, relpath: str) -> str:
        """Full path (in ``fs``) of a path relative to the root."""
        return posixpath.join(self.path, relpath)

    def data_path(self, file_id: int) -> str:
        """Full path of data file ``file_id``."""
        return self.join(self.data_files[file_id])

    def safe_join(self, relpath: str) -> str:
        """Like :meth:`join` for a path built from metadata: on a local root it must also resolve
        (symlinks followed) inside the root, else :class:`UnsafePathError`."""
        if self.is_local:
            inside_root(self.path, relpath)
        return self.join(check_relative(relpath))

    def task_strings(self) -> list[str]:
        """Task strings indexed by task_index position (sorted by task_index)."""
        return self.tasks.column("task").to_pylist()

    def video_path(self, key: str, chunk_index: int, file_index: int) -> str:
        """Relative path of a video file (v2.1: ``file_index`` is the episode index)."""
        if self.version in V2:
            return format_template(
                self.info.get("video_path") or VIDEO_PATH_V2,
                video_key=key,
                episode_chunk=chunk_index,
                episode_index=file_index,
            )
        return format_template(
            self.info.get("video_path"),
            video_key=key,
            chunk_index=chunk_index,
            file_index=file_index,
        )

    def episode_rows(self, episodes: np.ndarray | None = None) -> np.ndarray:
        """Row positions in ``episodes`` for the given episode indices (all when None)."""
        ep = self.column("episode_index")
        if episodes is None:
            return np.arange(len(ep))
        episodes = np.asarray(episodes, dtype=np.int64)
        pos = np.searchsorted(ep, episodes)
        ok = (
            (pos < len(ep)) & (ep[np.minimum(pos, len(ep) - 1)] == episodes) if len(ep) else pos < 0
        )
        if not np.all(ok):
            raise KeyError(f"episodes not in dataset: {episodes[~ok][:10].tolist()}")
        return pos

    @cached_property
    def fingerprint(self) -> str:
        """The episodes fingerprint (see :func:`compute_fingerprint`)."""
        return compute_fingerprint(
            self.column("episode_index"), self.column("length"), self.episodes.column("tasks")
        )


def as_dataset(root_or_ds: str | Any) -> Dataset:
    """The dataset itself, or :func:`open_dataset` of a root path/URL (lets APIs take either)."""
    return root_or_ds if isinstance(root_or_ds, Dataset) else open_dataset(str(root_or_ds))


def read_info(root: str) -> dict:
    """Just ``meta/info.json`` of a root."""
    fs, path = resolve_root(root)
    return read_json(fs, posixpath.join(path, INFO_FILE))


def open_dataset(root: str, check_files: bool = True, check_totals: bool = True) -> Dataset:
    """Read a LeRobot root (local path or fsspec URL) into a :class:`Dataset`.

    Raises a :class:`DatasetError` subclass naming the file and the problem for a root that is
    missing files, of an unknown version, whose info.json is not what LeRobot writes
    (:meth:`Info.parse`, strict), or whose metadata contradicts itself. ``check_files``
    verifies every referenced data file exists; ``check_totals`` compares with info.json.
    """
    fs, path = resolve_root(root)
    info_path = posixpath.join(path, INFO_FILE)
    info = read_json(fs, info_path)
    if not isinstance(info, dict):
        raise DatasetError("expected a JSON object", info_path)
    version = info.get("codebase_version")
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(
            f"unknown codebase_version {version!r} (supported: {', '.join(SUPPORTED_VERSIONS)})",
            info_path,
        )
    layout = Info.parse(info, info_path)  # InfoError: one line naming the key
    tasks = read_tasks_table(fs, path, version)
    if version == V3:
        episodes = _episodes_v3(fs, path)
        episodes_file = posixpath.join(path, "meta/episodes")
    else:
        episodes = read_episodes_v2(fs, path, info)
        episodes_file = posixpath.join(path, "meta/episodes.jsonl")

    _check_ranges(episodes, episodes_file)

    episodes = episodes.append_column("task_index", episode_task_index(episodes["tasks"], tasks))

    try:
        data_files, file_id = data_file_names(episodes, info, version)
    except UnsafePathError as exc:
        raise UnsafePathError(str(exc), info_path) from exc
    episodes = episodes.append_column("file_id", pa.array(file_id, pa.int32()))
    ds = Dataset(
        root=str(root),
        fs=fs,
        path=path,
        info=info,
        tasks=tasks,
        episodes=episodes,
        data_files=data_files,
        layout=layout,
    )
    if check_totals:
        _check_totals(ds, info_path)
    if check_files:
        for rel in data_files:
            full = ds.join(rel)
            if ds.is_local:
                try:
                    inside_root(path, rel)
                except UnsafePathError as exc:
                    raise UnsafePathError(str(exc), info_path) from exc
            if not fs.exists(full):
                eps = ds.column("episode_index")[file_id == data_files.index(rel)]
                raise MissingFileError(
                    f"data file referenced by episodes {eps[:5].tolist()} does not exist", full
                )
    return ds


def _check_ranges(episodes: pa.Table, where: str) -> None:
    n = episodes.num_rows
    if n == 0:
        return
    ep = episodes["episode_index"].to_numpy()
    frm = episodes["dataset_from_index"].to_numpy()
    to = episodes["dataset_to_index"].to_numpy()
    length = episodes["length"].to_numpy()
    dup = np.flatnonzero(np.diff(ep) == 0)
    if len(dup):
        raise InconsistentDatasetError(f"episode {ep[dup[0]]} appears more than once", where)
    bad = np.flatnonzero(length != to - frm)
    if len(bad):
        i = bad[0]
        raise InconsistentDatasetError(
            f"episode {ep[i]}: length {length[i]} != dataset_to_index - dataset_from_index "
            f"({to[i]} - {frm[i]})",
            where,
        )
    gap = np.flatnonzero(frm[1:] != to[:-1])
    if len(gap):
        i = gap[0]
        raise InconsistentDatasetError(
            f"episodes not contiguous: episode {ep[i + 1]} starts at dataset_from_index "
            f"{frm[i + 1]} but episode {ep[i]} ends at dataset_to_index {to[i]}",
            where,
        )


def _check_totals(ds: Dataset, info_path: str) -> None:
    info = ds.info
    checks = (
        ("total_episodes", ds.num_episodes),
        ("total_frames", ds.num_frames),
        ("total_tasks", ds.tasks.num_rows),
    )
    for key, actual in checks:
        if key in info and int(info[key]) != actual:
            raise InconsistentDatasetError(
                f"{key} is {info[key]} but the episodes/tasks tables give {actual}", info_path
            )


def episode_task_index(
    ep_tasks: pa.ChunkedArray | pa.Array, tasks: pa.Table | None
) -> pa.ChunkedArray:
    """task_index of each episode's ``tasks[0]`` through the tasks table (-1: unknown or empty)."""
    n = len(ep_tasks)
    if tasks is None or not len(tasks) or n == 0:
        return pa.chunked_array([pa.array(np.full(n, -1, dtype=np.int64))])
    nonempty = pc.if_else(
        pc.greater(pc.list_value_length(ep_tasks), 0), ep_tasks, pa.scalar(None, ep_tasks.type)
    )
    pos = pc.index_in(pc.list_element(nonempty, 0), value_set=tasks.column("task"))
    idx = pc.take(tasks.column("task_index"), pos).fill_null(-1)
    return pa.chunked_array([idx]).cast(pa.int64())


def episode_task_range(
    ep_tasks: pa.ChunkedArray | pa.Array, tasks: pa.Table | None
) -> tuple[np.ndarray, np.ndarray]:
    """Smallest and largest task_index of each episode's tasks (LeRobot lets an episode hold
    several: a language instruction that changes within it); -1 where none is known."""
    n = len(ep_tasks)
    lo, hi = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    if tasks is None or not len(tasks) or n == 0:
        return lo, hi
    col = ep_tasks.combine_chunks() if isinstance(ep_tasks, pa.ChunkedArray) else ep_tasks
    flat = pc.list_flatten(col)
    owner = pc.list_parent_indices(col).to_numpy()
    pos = pc.index_in(flat, value_set=tasks.column("task"))
    idx = pc.take(tasks.column("task_index"), pos).fill_null(-1).to_numpy().astype(np.int64)
    known = idx >= 0
    big = np.iinfo(np.int64).max
    low = np.full(n, big, np.int64)
    np.minimum.at(low, owner[known], idx[known])
    np.maximum.at(hi, owner[known], idx[known])
    lo = np.where(low == big, -1, low)
    return lo, hi


def data_file_names(episodes: pa.Table, info: dict, version: str) -> tuple[list[str], np.ndarray]:
    """Distinct data files (relative, checked by :func:`format_template`) in order of first
    episode, and each episode's index into that list. Raises :class:`UnsafePathError`."""
    chunk = episodes["data/chunk_index"].to_numpy()
    fidx = episodes["data/file_index"].to_numpy()
    if version in V2:
        template = info.get("data_path") or DATA_PATH_V2
        ep = episodes["episode_index"].to_numpy()
        files = [
            format_template(template, episode_chunk=int(c), episode_index=int(e))
            for c, e in zip(chunk, ep)
        ]
        return files, np.arange(len(files), dtype=np.int32)
    template = info.get("data_path") or DATA_PATH_V3
    if len(chunk) == 0:
        return [], np.zeros(0, dtype=np.int32)
    key = chunk.astype(np.int64) * (1 << 32) + fidx.astype(np.int64)
    uniq, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # files in order of first episode
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    files = [
        format_template(template, chunk_index=int(chunk[first[i]]), file_index=int(fidx[first[i]]))
        for i in order
    ]
    return files, rank[inverse].astype(np.int32)
