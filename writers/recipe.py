"""The rerun key of a written dataset: what it was written from, so that a rerun says "nothing to
do" only when every input the output depends on is unchanged.

The key hashes the format, the tool version, the options that define the output, the selection
(source and row of every output episode, in order) and, per source, the identity of every file
the output is built from: ``meta/info.json``, ``meta/stats.json``, the tasks table, the episodes
files (v3.0) or ``episodes*.jsonl`` (v2.x), every data file and every video file the episodes
point at. A local file's identity is its size, mtime, ctime (in ns) and inode, as git's index
keeps them: any write to the file changes its ctime, even one that keeps size and mtime (which
a user can set). A remote file's identity is what its filesystem reports: the hub's content
hashes (``blob_id``, ``lfs.sha256``), else its etag, size and modification time. Cheap: one
``stat`` per file, no data read.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from episodekit.core.dataset import V2, Dataset, episodes_files
from episodekit.core.version import __version__

FORMAT_VERSION = 2
META_V3 = ("meta/info.json", "meta/stats.json", "meta/tasks.parquet")
META_V2 = (
    "meta/info.json",
    "meta/stats.json",
    "meta/tasks.jsonl",
    "meta/episodes.jsonl",
    "meta/episodes_stats.jsonl",
)
REMOTE_KEYS = ("blob_id", "sha256", "etag", "ETag", "md5", "last_modified", "mtime", "LastModified")


def input_files(ds: Dataset) -> list[str]:
    """Every file (relative to the root) the written output depends on, sorted."""
    files = set(META_V2 if ds.version in V2 else META_V3)
    if ds.version not in V2:
        prefix = ds.path.rstrip("/") + "/"
        files |= {f[len(prefix) :] for f in episodes_files(ds.fs, ds.path) if f.startswith(prefix)}
    files |= set(ds.data_files)
    files |= set(video_files(ds))
    return sorted(files)


def video_files(ds: Dataset) -> list[str]:
    """The video files the episodes point at (relative paths)."""
    out: set[str] = set()
    names = set(ds.episodes.column_names)
    for key in ds.video_keys:
        if ds.version in V2:
            chunk, file = ds.column("data/chunk_index"), ds.column("episode_index")
        elif {f"videos/{key}/chunk_index", f"videos/{key}/file_index"} <= names:
            chunk = ds.column(f"videos/{key}/chunk_index")
            file = ds.column(f"videos/{key}/file_index")
        else:
            continue
        pairs = np.unique(np.stack([chunk, file], axis=1).astype(np.int64), axis=0)
        out |= {ds.video_path(key, int(c), int(f)) for c, f in pairs.tolist()}
    return sorted(out)


def local_identity(rel: str, full: str | os.PathLike) -> list[Any]:
    """``[rel, size, mtime, ctime, inode]`` of a local file (ns; ``[rel, None]``: missing): any
    write to it changes its ctime, even one that keeps its size and mtime."""
    try:
        st = os.stat(full)
    except OSError:
        return [rel, None]
    return [rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def file_identity(ds: Dataset, rel: str) -> list[Any]:
    """``[rel, ...]``: what pins the content of one input file (None: the file is missing)."""
    full = ds.join(rel)
    if ds.is_local:
        return local_identity(rel, full)
    try:
        info = ds.fs.info(full)
    except (OSError, ValueError):
        return [rel, None]
    lfs = info.get("lfs") if isinstance(info.get("lfs"), dict) else {}
    found = {k: info.get(k) for k in REMOTE_KEYS if info.get(k) is not None}
    if lfs.get("sha256"):
        found["sha256"] = lfs["sha256"]
    return [rel, info.get("size"), json.dumps(found, sort_keys=True, default=str)]


def source_identity(ds: Dataset) -> dict:
    """The identity of one source: where it is, its episodes fingerprint and every input file."""
    root = os.path.realpath(ds.path) if ds.is_local else ds.root
    files = [file_identity(ds, rel) for rel in input_files(ds)]
    return {"root": root, "fingerprint": ds.fingerprint, "files": files}


def recipe_key(datasets: list[Dataset], selection: np.ndarray, options: dict[str, Any]) -> str:
    """Hash of everything an output depends on: ``datasets`` (their files), ``selection``
    (``(episodes, 2)`` int64: source position and row of each output episode, in order) and
    ``options`` (JSON-able values that define the output)."""
    h = hashlib.sha256(b"episodekit-surgery\0")
    body = {
        "format": FORMAT_VERSION,
        "version": __version__,
        "sources": [source_identity(ds) for ds in datasets],
        "options": options,
    }
    h.update(json.dumps(body, sort_keys=True, default=str).encode())
    h.update(np.ascontiguousarray(selection, dtype=np.int64).tobytes())
    return h.hexdigest()[:32]


def combined_key(keys: dict[str, str]) -> str:
    """One key for several outputs written together (``split``'s parts)."""
    h = hashlib.sha256(b"episodekit-surgery-parts\0")
    h.update(json.dumps(sorted(keys.items())).encode())
    return h.hexdigest()[:32]
