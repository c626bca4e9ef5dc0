"""What an ``--out`` copy was made from, so a rerun copies only what changed at the source.

``prep rowgroups --out DIR`` (and ``prepare --out DIR``) copy the source's ``meta/`` (and
``videos/``) into DIR and rewrite or copy its data files there; later steps then change some of
those copies in DIR (stats into ``meta/``, re-encoded videos). Copying everything again on each
rerun would undo that work and make every step run again. So DIR keeps a record
(:data:`RECORD_FILE`): for each file copied or written from the source, the source file's key
(size and modification time, or the hub's blob id / an object store's etag). A file whose source
key is the recorded one is left as it is in DIR; a changed or new source file is copied again.
A source whose listing gives no such key (an in-memory filesystem) is always copied.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from pathlib import Path

from episodekit.core.atomic import atomic_write_text
from episodekit.core.paths import inside_root
from episodekit.prep.rewrite import copy_file

RECORD_FILE = ".episodekit-copy.json"  # in DIR, next to the output marker
RECORD_FORMAT = "episodekit.copy"
KEY_FIELDS = ("mtime", "blob_id", "ETag", "etag", "LastModified", "last_modified")


def source_key(info: dict) -> str | None:
    """A source file's key from its fsspec listing entry: its size and whichever of
    :data:`KEY_FIELDS` the filesystem gives; None when it gives none (never trusted)."""
    parts = {k: info[k] for k in KEY_FIELDS if info.get(k) is not None}
    if not parts:
        return None
    return json.dumps({"size": info.get("size"), **parts}, sort_keys=True, default=str)


def source_keys(fs, root: str, sub: str) -> dict[str, str | None]:
    """``{relative path: key}`` of every file under ``root/sub`` (one listing)."""
    folder = posixpath.join(root, sub)
    if not fs.exists(folder):
        return {}
    found = fs.find(folder, detail=True)
    return {posixpath.relpath(p, root): source_key(info) for p, info in sorted(found.items())}


class CopyRecord:
    """The record of DIR: which source each copied file came from (see the module docstring)."""

    def __init__(self, out: Path, source: str):
        self.path = out / RECORD_FILE
        self.source = source
        self.files: dict[str, str] = {}
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(self.path.read_text())
            if doc.get("format") == RECORD_FORMAT and doc.get("source") == source:
                self.files = {str(k): str(v) for k, v in (doc.get("files") or {}).items()}
        self._saved = dict(self.files)

    def same(self, rel: str, key: str | None) -> bool | None:
        """True when DIR's ``rel`` was made from the source file as it is now (``key``), False
        when the source changed since, None when the record has no entry for it."""
        if rel not in self.files:
            return None
        return key is not None and self.files[rel] == key

    def note(self, rel: str, key: str | None) -> None:
        if key is None:
            self.files.pop(rel, None)
        else:
            self.files[rel] = key

    def save(self) -> None:
        """Write the record (atomically) when it changed."""
        if self.files == self._saved and self.path.exists():
            return
        doc = {"format": RECORD_FORMAT, "source": self.source, "files": self.files}
        atomic_write_text(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
        self._saved = dict(self.files)


def copied_without(fs, root: str, sub: str) -> str | None:
    """The source of ``root`` when ``root`` is an ``--out`` copy whose record holds no file under
    ``sub`` (e.g. ``videos``: a copy made without ``--videos``), else None (no record, another
    format, or ``sub`` copied)."""
    try:
        with fs.open(posixpath.join(root, RECORD_FILE), "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        return None
    files = doc.get("files") or {}
    if any(str(k).startswith(sub + "/") for k in files):
        return None
    return str(doc.get("source") or "its source")


def copy_tree(fs, root: str, out: Path, sub: str, record: CopyRecord) -> list[str]:
    """Copy every file under ``root/sub`` to ``out/sub`` (each write atomic) unless DIR's copy
    was made from the source file as it is now; returns the relative paths copied."""
    copied = []
    for rel, key in source_keys(fs, root, sub).items():
        dst = Path(inside_root(out, rel))
        if record.same(rel, key) and dst.exists():
            continue
        copy_file(posixpath.join(root, rel), dst, fs)
        record.note(rel, key)
        copied.append(rel)
    return copied


def gone_from_source(fs, root: str, record: CopyRecord) -> set[str]:
    """The files ``record`` says were copied from the source that the source no longer has: a
    rerun leaves their copies behind, so the output stays a copy of the source as it is now."""
    there: set[str] = set()
    for sub in sorted({rel.split("/", 1)[0] for rel in record.files}):
        there |= set(source_keys(fs, root, sub))
    return set(record.files) - there
