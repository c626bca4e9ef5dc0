"""The decoded frame store: its on-disk format, where it lives, and when it is fresh.

A frame store holds every fixed-width, non-video column of a dataset (numeric scalars and
fixed-size lists of numbers) decoded once, as one ``.npy`` per column with one row per frame at
position ``global frame index - base``, plus the episode bounds and a manifest. Readers
memory-map it, so every process of a node shares one copy through the page cache (the offline
form of LeRobot's ``OnlineBuffer``). Its writer is :mod:`episodekit.prep.frames`, its reader
:mod:`episodekit.loaders.store`; both use this module, so the format is defined once.

Freshness is decided precisely, never guessed from counts: the manifest records the format
version, the episodes fingerprint, the stored features, the first frame index and, per data file,
its relative path, size, mtime (local roots) and a SHA-256 of its parquet footer (which holds
every row group's sizes and statistics, so a rewritten file changes it). The manifest is written
last and the directory published by rename, so a directory with a manifest is complete.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from episodekit.core import interrupt
from episodekit.core.dataset import Dataset, is_local, read_schema
from episodekit.core.errors import DatasetError

STORE_FORMAT = "episodekit-frame-store"
STORE_VERSION = 1
MANIFEST = "manifest.json"
BOUNDS_FILE = "episodes.npy"  # int64 (episodes, 3): episode_index, dataset_from/to_index
CACHE_ENV = "EPISODEKIT_CACHE"
FRAMES_SUBDIR = "frames"
TMP_TAG = ".tmp-"
OLD_TAG = ".old-"
NOT_STORED = ("image", "video", "string")  # feature dtypes that stay in parquet


class StoreError(DatasetError):
    """A frame store that cannot be used: missing, unreadable or stale."""


class StoreNotFoundError(StoreError):
    """No published frame store at the given location."""


class StaleStoreError(StoreError):
    """The store was built from other data (files rewritten, episodes added, features changed)."""


# -- where ----------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """The local cache root: ``$EPISODEKIT_CACHE``, else ``~/.cache/episodekit``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "episodekit"


def dataset_identity(ds: Dataset) -> str:
    """What the store is keyed by: the resolved local path, or the URL of a remote root."""
    if is_local(ds.fs):
        return os.path.realpath(ds.path)
    return str(ds.root).rstrip("/")


def default_store_dir(ds: Dataset) -> Path:
    """``<cache>/frames/<name>-<hash of the dataset identity>``: one store per dataset (and hub
    revision), outside the root, so hub roots work and the root is never written."""
    ident = dataset_identity(ds)
    name = re.sub(r"[^A-Za-z0-9_.@-]+", "_", ident.rstrip("/").rsplit("/", 1)[-1])[:40] or "root"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return cache_dir() / FRAMES_SUBDIR / f"{name.lstrip('.') or 'root'}-{digest}"


def column_file(name: str) -> str:
    """File name of a column's array (feature names may hold dots, slashes or spaces)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "col"
    return f"{safe[:60]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}.npy"


# -- what ------------------------------------------------------------------------------------------


def declared_row_shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    """A feature's row shape as the loader uses it: ``()`` for scalars and shape ``[1]``."""
    shape = tuple(int(x) for x in feature.get("shape") or ())
    return () if shape in ((), (1,)) else shape


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def column_layout(
    arrow_type: pa.DataType, feature: Mapping[str, Any]
) -> tuple[np.dtype, tuple[int, ...]] | None:
    """(numpy dtype, row shape) of a fixed-width column, or None when it is not storable.

    Storable: a numeric scalar, a fixed_size_list (possibly nested) of numbers, or a variable
    list of numbers whose feature declares a shape (every row is checked to have that width
    while building). The row shape matches what the parquet reader returns: the declared shape
    when its size equals the list width, else ``(width,)``.
    """
    if feature.get("dtype") in NOT_STORED:
        return None
    if _numeric(arrow_type):
        return np.dtype(arrow_type.to_pandas_dtype()), ()
    t, width, fixed = arrow_type, 1, True
    while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        if pa.types.is_fixed_size_list(t):
            width *= t.list_size
        else:
            fixed = False
        t = t.value_type
    if not _numeric(t):
        return None
    declared = declared_row_shape(feature)
    if not fixed:
        if not feature.get("shape"):
            return None
        width = int(np.prod(feature["shape"]))
    shape = declared if declared and int(np.prod(declared)) == width else (width,)
    return np.dtype(t.to_pandas_dtype()), shape


def features_digest(columns: Mapping[str, Mapping[str, Any]]) -> str:
    """Hash of the stored columns' descriptions (name, dtype, shape, arrow type, feature)."""
    blob = json.dumps(columns, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


# -- data-file identity ----------------------------------------------------------------------------


def footer_digest(fh) -> str:
    """SHA-256 (32 hex) of a parquet file's footer (its length and magic included)."""
    fh.seek(-8, os.SEEK_END)
    tail = fh.read(8)
    if len(tail) != 8 or tail[4:] != b"PAR1":
        raise DatasetError("not a parquet file (no PAR1 footer)", getattr(fh, "name", None))
    n = int.from_bytes(tail[:4], "little")
    fh.seek(-8 - n, os.SEEK_END)
    return hashlib.sha256(fh.read(n) + tail).hexdigest()[:32]


def file_identity(ds: Dataset, rel: str) -> dict[str, Any]:
    """``{path, size, mtime_ns, footer}`` of one data file (mtime only on a local disk)."""
    full = ds.join(rel)
    try:
        if ds.is_local:
            st = os.stat(full)
            with open(full, "rb") as fh:
                footer = footer_digest(fh)
            return {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "footer": footer}
        with ds.fs.open(full, "rb") as fh:
            footer = footer_digest(fh)
        return {"path": rel, "size": int(ds.fs.size(full)), "mtime_ns": None, "footer": footer}
    except OSError as exc:
        raise DatasetError(f"cannot read ({exc})", full) from exc


def data_identities(ds: Dataset) -> list[dict[str, Any]]:
    """Identity of every data file of the dataset, in ``ds.data_files`` order."""
    return [file_identity(ds, rel) for rel in ds.data_files]


def episode_bounds(ds: Dataset) -> np.ndarray:
    """int64 (episodes, 3): episode_index, dataset_from_index, dataset_to_index."""
    cols = ("episode_index", "dataset_from_index", "dataset_to_index")
    if not ds.num_episodes:
        return np.zeros((0, 3), np.int64)
    return np.stack([ds.column(c).astype(np.int64) for c in cols], axis=1)


def first_frame(ds: Dataset) -> int:
    """Global index of the dataset's first frame (the store's ``base``)."""
    return int(ds.column("dataset_from_index")[0]) if ds.num_episodes else 0


# -- the manifest ----------------------------------------------------------------------------------


def read_manifest(store_dir: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a published store; :class:`StoreNotFoundError` when there is none."""
    path = Path(store_dir) / MANIFEST
    try:
        doc = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise StoreNotFoundError("no frame store here (no manifest.json)", str(store_dir)) from exc
    except (OSError, ValueError) as exc:
        raise StoreError(f"unreadable manifest ({exc})", str(path)) from exc
    if not isinstance(doc, dict) or doc.get("format") != STORE_FORMAT:
        raise StoreError(f"not an {STORE_FORMAT} manifest", str(path))
    if doc.get("version") != STORE_VERSION:
        raise StaleStoreError(
            f"format version {doc.get('version')!r}, this episodekit reads {STORE_VERSION}",
            str(path),
        )
    if not _well_formed(doc):
        raise StoreError("malformed manifest (missing or mistyped fields)", str(path))
    return doc


def _well_formed(doc: Mapping[str, Any]) -> bool:
    """The fields readers rely on are there with the right types."""
    ints = all(isinstance(doc.get(k), int) for k in ("num_frames", "base", "num_episodes"))
    strs = all(isinstance(doc.get(k), str) for k in ("fingerprint", "features_digest"))
    cols, files = doc.get("columns"), doc.get("files")
    if not (ints and strs and isinstance(cols, dict) and isinstance(files, list)):
        return False
    for c in cols.values():
        if not isinstance(c, dict) or not isinstance(c.get("file"), str):
            return False
        if "/" in c["file"] or c["file"].startswith(".") or not isinstance(c.get("shape"), list):
            return False
        if not isinstance(c.get("dtype"), str):
            return False
    return all(isinstance(f, dict) for f in files)


def open_columns(
    store_dir: str | os.PathLike, manifest: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Every column of a store, memory-mapped read-only, checked against the manifest (file
    present, dtype and shape as recorded); :class:`StoreError` otherwise."""
    out = {}
    n = int(manifest["num_frames"])
    for name, c in manifest["columns"].items():
        path = Path(store_dir) / c["file"]
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, TypeError) as exc:
            raise StoreError(f"unreadable column {name!r} ({exc})", str(path)) from exc
        want = (n, *c["shape"])
        if arr.shape != want or arr.dtype.str != c["dtype"]:
            raise StoreError(
                f"column {name!r} is {arr.dtype.str}{arr.shape}, the manifest says "
                f"{c['dtype']}{want}",
                str(path),
            )
        out[name] = arr
    return out


def stale_reasons(
    manifest: Mapping[str, Any],
    ds: Dataset,
    columns: Mapping[str, Mapping[str, Any]] | None = None,
    identities: list[dict[str, Any]] | None = None,
) -> list[str]:
    """Why a store does not describe ``ds`` as it is now (empty list: it is fresh).

    ``columns`` (as :func:`expected_columns` gives) defaults to the dataset's own;
    ``identities`` to reading every data file's identity (stat + footer).
    """
    if manifest.get("version") != STORE_VERSION:
        got = manifest.get("version")
        return [f"format version {got!r}, this episodekit reads {STORE_VERSION}"]
    reasons = []
    if manifest.get("fingerprint") != ds.fingerprint:
        reasons.append("episodes changed (fingerprint differs)")
    if manifest.get("num_frames") != ds.num_frames or manifest.get("base") != first_frame(ds):
        reasons.append("frame count or first frame index differs")
    if columns is None:
        columns = expected_columns(ds)
    if manifest.get("features_digest") != features_digest(columns):
        reasons.append("stored features differ from the dataset's")
    stored = manifest.get("files") or []
    if [f.get("path") for f in stored] != list(ds.data_files):
        reasons.append("a different set of data files")
    elif not reasons:
        now = identities if identities is not None else data_identities(ds)
        for old, new in zip(stored, now):
            if old != new:
                reasons.append(f"data file {new['path']} changed (size, mtime or footer)")
                break
    return reasons


def expected_columns(ds: Dataset) -> dict[str, dict[str, Any]]:
    """The columns a store of ``ds`` holds: ``{name: {dtype, shape, arrow_type, feature}}``.

    Decided from info.json's features and the first data file's arrow schema (the other files
    are checked against it while building).
    """
    features = ds.features
    if not ds.data_files:
        return {}
    schema = read_schema(ds.fs, ds.data_path(0))
    out: dict[str, dict[str, Any]] = {}
    for name, feat in features.items():
        if name not in schema.names:
            continue
        t = schema.field(name).type
        layout = column_layout(t, feat)
        if layout is None:
            continue
        dtype, shape = layout
        out[name] = {
            "dtype": dtype.str,
            "shape": list(shape),
            "arrow_type": str(t),
            "feature": {"dtype": feat.get("dtype"), "shape": feat.get("shape")},
            "file": column_file(name),
        }
    return out


# -- publishing a directory ------------------------------------------------------------------------


def temp_store_dir(final: Path) -> Path:
    """A unique sibling of ``final`` to build in (the pid lets a later run clean it up)."""
    return final.with_name(f".{final.name}{TMP_TAG}{os.getpid()}-{uuid.uuid4().hex[:12]}")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (a stale temp file or segment's owner)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(final: Path) -> list[Path]:
    """Delete builds of ``final`` left by crashed writers (their pid is gone) and old copies."""
    removed = []
    parent = final.parent
    if not parent.is_dir():
        return removed
    for p in parent.glob(f".{glob.escape(final.name)}.*"):
        rest = p.name[len(final.name) + 1 :]
        if rest.startswith(TMP_TAG):
            pid = rest[len(TMP_TAG) :].split("-", 1)[0]
            if pid.isdigit() and pid_alive(int(pid)):
                continue  # another builder is still at work
        elif not rest.startswith(OLD_TAG):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def fsync_path(path: Path) -> None:
    """fsync a file or folder (best effort for folders: some filesystems refuse)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def publish_dir(tmp: Path, final: Path, attempts: int = 20) -> None:
    """Move the complete directory ``tmp`` to ``final``, replacing any previous one.

    The previous store is first renamed aside (readers holding its files keep their mappings),
    then ``tmp`` takes its name; a concurrent publisher makes us retry. In between, ``final``
    does not exist: readers see no store (and read parquet), never a half store. A Ctrl-C in
    between is raised once the new store is in place (the old one is not lost to it).
    """
    with interrupt.deferred():
        _publish_dir(tmp, final, attempts)


def _publish_dir(tmp: Path, final: Path, attempts: int) -> None:
    for _ in range(attempts):
        if final.exists():
            aside = final.with_name(f".{final.name}{OLD_TAG}{uuid.uuid4().hex[:12]}")
            with contextlib.suppress(FileNotFoundError):
                os.rename(final, aside)
        try:
            os.rename(tmp, final)
        except OSError as exc:
            if final.exists():  # another builder published meanwhile: move it aside, retry
                continue
            raise exc
        fsync_path(final.parent)
        for p in final.parent.glob(f".{glob.escape(final.name)}{OLD_TAG}*"):
            shutil.rmtree(p, ignore_errors=True)
        return
    raise OSError(f"could not publish {final}: other builders kept replacing it")
