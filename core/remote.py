"""Remote roots read with few bytes: existence by a HEAD request, reads of exactly the range asked.

fsspec's ``http`` filesystem answers ``exists`` with a GET of the whole file (a server then sends
the body until the client hangs up: megabytes for a data file) and its files read ahead 5 MB on
every read. Validation of a hub or HTTP root (``validate --metadata-only``) must read metadata
only, so:

- :func:`remote_fs` gives an ``http``/``https`` filesystem whose ``exists`` is a HEAD request
  (:func:`episodekit.core.dataset.resolve_root` returns it for every URL root);
- :func:`open_ranged` opens a file whose every ``read`` is one range request of exactly the bytes
  asked (no read-ahead, no cache): what the mp4 box walk and the sampled row groups read through;
- :func:`read_range` is one range read (``fs.cat_file``).
"""

from __future__ import annotations

from typing import Any

import fsspec

RANGED_BLOCK = 1 << 20  # only tells fsspec the file is seekable; with no cache it reads no more


def protocol(fs: fsspec.AbstractFileSystem) -> str:
    """The filesystem's first protocol name (``file``, ``http``, ``hf``, ``memory``...)."""
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def is_http(fs: fsspec.AbstractFileSystem) -> bool:
    """True for fsspec's ``http``/``https`` filesystem (no listing but HTML pages, no HEAD
    ``exists``)."""
    return protocol(fs) in ("http", "https")


def _head_exists_class() -> type:
    from fsspec.implementations.http import HTTPFileSystem  # noqa: PLC0415 - needs aiohttp

    class HeadHTTPFileSystem(HTTPFileSystem):
        """fsspec's HTTP filesystem whose ``exists`` asks a HEAD, never the body."""

        async def _exists(self, path: str, strict: bool = False, **kwargs: Any) -> bool:
            try:
                await self._info(path, **kwargs)
            except FileNotFoundError:
                return False
            return True

        async def _isfile(self, path: str, **kwargs: Any) -> bool:
            return await self._exists(path, **kwargs)

    return HeadHTTPFileSystem


_HEAD_CLASS: type | None = None


def remote_fs(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """``fs`` itself, or for an ``http(s)`` filesystem the same one with a HEAD ``exists``."""
    global _HEAD_CLASS
    if not is_http(fs):
        return fs
    if _HEAD_CLASS is None:
        _HEAD_CLASS = _head_exists_class()
    if isinstance(fs, _HEAD_CLASS):
        return fs
    return _HEAD_CLASS(**fs.storage_options)


def open_ranged(fs: fsspec.AbstractFileSystem, path: str) -> Any:
    """``path`` opened for reading so that each ``read`` fetches exactly the bytes asked (one
    range request on a remote filesystem; a plain file on the local disk). Close it."""
    if protocol(fs) in ("file", "local"):
        return open(path, "rb")
    try:
        return fs.open(path, "rb", block_size=RANGED_BLOCK, cache_type="none")
    except TypeError:  # a filesystem whose files take no such options (in memory: no I/O)
        return fs.open(path, "rb")


def read_range(fs: fsspec.AbstractFileSystem, path: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``path``: one range request on a remote filesystem."""
    if end <= start:
        return b""
    return bytes(fs.cat_file(path, start=start, end=end))
