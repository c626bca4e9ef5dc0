"""What every validation check shares: the :class:`Finding` it reports and the raw root it reads.

The validator must report *all* problems of a broken root, so it does not go through
``open_dataset`` (which stops at the first inconsistency): :func:`read_raw` loads info.json, the
tasks table and the episodes table piece by piece, turning each unreadable piece into a finding
and carrying on with what could be read.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa

from episodekit.core.dataset import (
    SUPPORTED_VERSIONS,
    V2,
    V3,
    DatasetError,
    compute_fingerprint,
    data_file_names,
    episode_task_index,
    episode_task_range,
    episodes_files,
    is_local,
    list_files,
    parquet_from_bytes,
    read_episodes_file,
    read_episodes_v2,
    read_parquet,
    read_schema,
    read_tasks_table,
    resolve_root,
)
from episodekit.core.jsonout import nonfinite_text, to_jsonable
from episodekit.core.layout.info import Info, LayoutFinding
from episodekit.core.parquet_read import (
    DataFile,
    arrow_buffer,
    open_data_file,
    parquet_errors,
    schema_from_bytes,
)
from episodekit.core.paths import EPISODES_PATH_V3, INFO_FILE, UnsafePathError
from episodekit.core.remote import is_http

ERROR = "error"
WARNING = "warning"


NO_FOOTER = "magic bytes not found"  # pyarrow's words for a parquet file without its footer


def repair_hint(root: str) -> str:
    """What to run on signs of a recording killed before it finished."""
    return (
        "a recording killed before it finished leaves this; see what "
        f"`episodekit repair {root} --dry-run` recovers"
    )


def unreadable_parquet(exc: BaseException, root: str) -> str:
    """The reason a parquet file is unreadable, with :func:`repair_hint` when it has no
    footer (its writer was never closed)."""
    text = str(exc)
    return f"{text}; {repair_hint(root)}" if NO_FOOTER in text.lower() else text


def has_footer(raw: RawRoot, rel: str) -> bool:
    """Whether a parquet file ends with the magic bytes of its footer."""
    try:
        with raw.fs.open(raw.join(rel), "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - 4))
            return fh.read(4) == b"PAR1"
    except OSError:
        return True  # unreadable for another reason: not this hint's business


def no_episodes_files(raw: RawRoot) -> str:
    """Why a v3.0 root has no episodes file: a data file without footer means the recorder
    was killed before its first metadata flush (every episode's row was still buffered)."""
    data = [raw.rel(p) for p in list_files(raw.fs, raw.join("data"), 2, ".parquet")]
    open_ = [rel for rel in data if not has_footer(raw, rel)]
    if not open_:
        return "no episodes parquet files"
    return (
        f"no episodes parquet files, and {open_[0]} has no parquet footer: a recording killed "
        "before its first metadata flush leaves this; `episodekit repair "
        f"{raw.root} --out DIR` rebuilds the metadata of its saved episodes"
    )


class CannotValidate(DatasetError):
    """The root cannot be validated at all (unreadable root, missing or unparseable info.json)."""


@dataclass(frozen=True)
class Finding:
    """One problem: which check found it, how bad, what, and where (file relative to the root).

    Data-quality findings also name the ``feature`` and ``dimension`` and carry the measured
    ``value`` plus ``details`` (frame, a short signal, score); these keys appear in
    :meth:`to_dict` only when set, so the JSON of the other checks is unchanged.
    """

    check: str
    severity: str
    message: str
    file: str | None = None
    episode: int | None = None
    feature: str | None = None
    dimension: int | None = None
    value: float | None = None
    details: dict[str, Any] | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.check,
            "severity": self.severity,
            "message": self.message,
            "file": self.file,
            "episode": self.episode,
        }
        for key in ("feature", "dimension", "value", "details"):
            v = getattr(self, key)
            if v is not None:
                out[key] = to_jsonable(v)
        text = nonfinite_text(self.value) if self.value is not None else None
        if text and text not in self.message:  # null in JSON: the value stays in the text
            out["message"] = f"{self.message} (value {text})"
        return out


@dataclass
class RawRoot:
    """The pieces of a root as far as they could be read; ``None`` where a piece is unreadable.

    ``info`` is info.json as read (the checks report each problem of it their own way);
    ``layout`` the same parsed tolerantly, once (:meth:`Info.parse_tolerant`: a bad key read as
    absent), with ``layout_findings`` what that parse found.

    ``episodes`` keeps the on-disk order (episodes files sorted by path, rows as stored) and adds
    ``__file`` (the episodes file it came from), ``task_index`` (of ``tasks[0]``, -1 when unknown)
    and ``data_file`` (relative path of the data file the episode points at).
    """

    root: str
    fs: fsspec.AbstractFileSystem
    path: str
    info: dict
    tasks: pa.Table | None = None
    episodes: pa.Table | None = None
    findings: list[Finding] = field(default_factory=list)
    listable: bool = True  # False: an HTTP root without folder pages (info.unreferenced waits)
    info_text: str | None = field(default=None, repr=False)  # info.json as read (line numbers)
    _bytes: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)
    layout: Info | None = field(default=None, init=False, repr=False)
    layout_findings: list[LayoutFinding] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.layout, self.layout_findings = Info.parse_tolerant(self.info)

    @property
    def version(self) -> str:
        v = self.layout.codebase_version if self.layout else None
        return v if v in SUPPORTED_VERSIONS else V3

    @property
    def fps(self) -> float | None:
        """fps when it is a positive finite number (else None: ``info.fps`` reports it)."""
        fps = self.layout.fps if self.layout else None
        return float(fps) if fps is not None else None

    @property
    def features(self) -> dict:
        feats = self.info.get("features")
        return feats if isinstance(feats, dict) else {}

    def join(self, rel: str) -> str:
        return posixpath.join(self.path, rel)

    def remote_bytes(self, full: str) -> bytes | None:
        """The bytes of the metadata file ``full`` of a remote root, fetched once (one request)
        and kept for the run; None on the local disk (read it by path). Every reader of a
        remote ``meta/episodes`` file shares them: its per-episode stats are most of it."""
        if is_local(self.fs):
            return None
        data = self._bytes.get(full)
        if data is None:
            data = self._bytes[full] = bytes(self.fs.cat_file(full))
        return data

    def read_bytes(self, full: str) -> bytes:
        """The whole metadata file ``full`` (a remote one read once: :meth:`remote_bytes`)."""
        data = self.remote_bytes(full)
        if data is None:
            with self.fs.open(full, "rb") as fh:
                data = fh.read()
        return data

    def meta_schema(self, full: str) -> pa.Schema:
        """The schema of the metadata parquet file ``full`` (see :meth:`remote_bytes`)."""
        data = self.remote_bytes(full)
        if data is None:
            return read_schema(self.fs, full)
        with parquet_errors(full):
            return schema_from_bytes(data)

    def meta_table(self, full: str, columns: list[str] | None = None) -> pa.Table:
        """``columns`` of the metadata parquet file ``full`` (see :meth:`remote_bytes`)."""
        data = self.remote_bytes(full)
        if data is None:
            return read_parquet(self.fs, full, columns=columns)
        with parquet_errors(full):
            return parquet_from_bytes(data, columns=columns)

    @contextlib.contextmanager
    def meta_parquet(self, full: str) -> Iterator[Any]:
        """The metadata parquet file ``full`` as a ``pyarrow.parquet.ParquetFile``, closed when
        the ``with`` block ends (see :meth:`remote_bytes`)."""
        data = self.remote_bytes(full)
        if data is None:
            df = open_data_file(full, self.fs)
        else:
            df = DataFile.of(full, pa.BufferReader(arrow_buffer(data)))
        with df:
            yield df.parquet

    def rel(self, full: str) -> str:
        full = str(full)
        prefix = self.path.rstrip("/") + "/"
        return full[len(prefix) :] if full.startswith(prefix) else full

    def data_files(self) -> list[str]:
        """Distinct referenced data files (relative), in order of first episode."""
        if self.episodes is None:
            return []
        return list(dict.fromkeys(self.episodes.column("data_file").to_pylist()))

    def fingerprint(self) -> str | None:
        """The episodes fingerprint (as :attr:`Dataset.fingerprint`; what a report judged);
        None when the episodes table could not be read."""
        if self.episodes is None:
            return None
        t = self.episodes.sort_by("episode_index")
        try:
            ep, length = t["episode_index"].to_numpy(), t["length"].to_numpy()
            return compute_fingerprint(ep, length, t["tasks"])
        except (pa.ArrowException, KeyError, TypeError, ValueError):
            return None


def _add(raw: RawRoot, check: str, message: str, file: str | None = None, episode=None) -> None:
    raw.findings.append(Finding(check, ERROR, message, file, episode))


def read_raw(root: str) -> RawRoot:
    """Read info.json (or raise :class:`CannotValidate`), then tasks and episodes, best effort."""
    try:
        fs, path = resolve_root(root)
        exists = fs.exists(path) and fs.isdir(path)
        if not exists and is_http(fs):  # a server without folder pages: the root is its files
            exists = fs.exists(posixpath.join(path, INFO_FILE))
    except Exception as exc:  # any fsspec/backend failure means we cannot even start
        raise CannotValidate(f"cannot open root ({exc})", str(root)) from exc
    if not exists:
        raise CannotValidate("root does not exist or is not a folder", str(root))
    info_path = posixpath.join(path, INFO_FILE)
    try:
        with fs.open(info_path, "rb") as fh:
            data = fh.read()
        info = json.loads(data)
    except FileNotFoundError as exc:
        raise CannotValidate("missing", info_path) from exc
    except OSError as exc:
        raise CannotValidate(f"cannot read: {exc.strerror or exc}", info_path) from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise CannotValidate(f"not valid JSON ({exc})", info_path) from exc
    if not isinstance(info, dict):
        raise CannotValidate("not a JSON object", info_path)
    text = data.decode("utf-8", "replace")
    raw = RawRoot(root=str(root), fs=fs, path=path, info=info, info_text=text)
    try:
        raw.tasks = read_tasks_table(fs, path, raw.version)
    except (DatasetError, OSError, ValueError, pa.ArrowException) as exc:
        rel = "meta/tasks.jsonl" if raw.version in V2 else "meta/tasks.parquet"
        _add(raw, "tasks.table", f"cannot read the tasks table: {exc}", rel)
    raw.episodes = _read_episodes(raw)
    return raw


def _read_episodes(raw: RawRoot) -> pa.Table | None:
    if raw.version in V2:
        try:
            table = read_episodes_v2(raw.fs, raw.path, raw.info)
        except (DatasetError, OSError, ValueError, pa.ArrowException) as exc:
            _add(raw, "episodes.read", f"cannot read episodes: {exc}", "meta/episodes.jsonl")
            return None
        table = table.append_column(
            "__file", pa.array(["meta/episodes.jsonl"] * table.num_rows, pa.string())
        )
    else:
        table = _episodes_v3_raw(raw)
        if table is None:
            return None
    return _add_derived(raw, table)


def _episodes_v3_raw(raw: RawRoot) -> pa.Table | None:
    files = episodes_files(raw.fs, raw.path)
    if not files and is_http(raw.fs):  # no folder pages: the files in LeRobot's numbering
        files = _numbered_episodes_files(raw)
        raw.listable = False
    if not files:
        _add(raw, "episodes.read", no_episodes_files(raw), "meta/episodes")
        return None
    tables = []
    for f in files:
        rel = raw.rel(f)
        try:
            t = read_episodes_file(raw.fs, f, raw.remote_bytes(f))
        except (DatasetError, pa.ArrowException, OSError) as exc:
            msg = f"unreadable episodes file: {unreadable_parquet(exc, raw.root)}"
            _add(raw, "episodes.read", msg, rel)
            continue
        tables.append(t.append_column("__file", pa.array([rel] * t.num_rows, pa.string())))
    if not tables:
        return None
    table = pa.concat_tables(tables, promote_options="default").combine_chunks()
    del tables
    pa.default_memory_pool().release_unused()  # the files' decoded pages (see core.dataset)
    return table


def _numbered_episodes_files(raw: RawRoot) -> list[str]:
    """The episodes files of a root that cannot be listed (an HTTP server without folder pages),
    found by their names: ``chunk-000/file-000.parquet`` on, the next file in the same chunk,
    else the first of the next chunk, until neither exists (one HEAD request each). A gap in the
    numbering ends the walk: files past it are not seen."""
    out: list[str] = []
    chunk, file = 0, 0
    while True:
        name = raw.join(EPISODES_PATH_V3.format(chunk_index=chunk, file_index=file))
        if not raw.fs.exists(name):
            if file == 0:
                return out
            chunk, file = chunk + 1, 0
            continue
        out.append(name)
        file += 1


def _add_derived(raw: RawRoot, table: pa.Table) -> pa.Table:
    """Append ``task_index`` (of tasks[0]), ``task_lo`` / ``task_hi`` (the range of all its
    tasks' indices) and ``data_file`` (relative path) columns; an unsafe
    or unresolvable ``data_path`` gives an ``info.paths`` finding and marker paths."""
    table = table.append_column("task_index", episode_task_index(table["tasks"], raw.tasks))
    lo, hi = episode_task_range(table["tasks"], raw.tasks)
    table = table.append_column("task_lo", pa.array(lo)).append_column("task_hi", pa.array(hi))
    try:
        paths, file_id = data_file_names(table, raw.info, raw.version)
        names = np.asarray(paths, dtype=object)[file_id].tolist() if table.num_rows else []
    except (UnsafePathError, TypeError, ValueError, OverflowError) as exc:
        _add(raw, "info.paths", f"data_path cannot be used: {exc}", INFO_FILE)
        names = [f"<unresolvable data_path {raw.info.get('data_path')!r}>"] * table.num_rows
    return table.append_column("data_file", pa.array(names, pa.string()))
