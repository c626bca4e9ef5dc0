"""The contract between a format reader and ``episodekit import``: source episodes as arrays,
one at a time, before the map.

A :class:`Reader` is made from the source path and its options (picklable, so each worker
process makes its own), lists the source's episodes (:meth:`Reader.episodes`: cheap
references, in source order) and reads one (:meth:`Reader.read`) into a :class:`RawEpisode`:
every per-step value under its source key (``observation/state``, ``obs/agentview_image``,
``/joint_states.position``), in the source's dtype, with a leading step axis; images as
:class:`Images` (decoded only when asked: a PNG can be copied as it is); episode-level values in
``meta``. Memory: one episode at a time, never the whole source.

Errors: input that is not what it claims (a truncated record, a bad CRC, a corrupt HDF5, ragged
shapes) raises :class:`SourceError` naming the file, the episode and the key; a missing optional
dependency raises :class:`MissingExtra` naming the pip extra that brings it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from episodekit.core.errors import DatasetError, EnvironmentProblem

KINDS = ("array", "image", "text")  # per-step values; episode-level ones live in ``meta``
IMAGE_ENCODINGS = ("raw", "png", "jpeg", "jxl")


class SourceError(DatasetError):
    """The source is not what it claims (exit 1): names file, episode and key where known."""

    def __init__(
        self, message: str, file: str | None = None, episode: str | None = None,
        key: str | None = None,
    ) -> None:  # fmt: skip
        where = ", ".join(x for x in (f"episode {episode}" if episode is not None else None,
                                      f"key {key!r}" if key else None) if x)  # fmt: skip
        super().__init__(f"{where}: {message}" if where else message, file)
        self.file, self.episode, self.key = file, episode, key


class MissingExtra(EnvironmentProblem):  # noqa: N818 - named for what the user must do
    """A format's third-party reader is not installed (exit 2): names the pip extra."""

    def __init__(self, fmt: str, module: str, extra: str) -> None:
        super().__init__(
            f"reading {fmt} needs the {module!r} package: pip install 'episodekit[{extra}]'"
        )
        self.extra = extra


def need(module: str, fmt: str, extra: str) -> Any:
    """Import ``module`` for format ``fmt`` or raise :class:`MissingExtra` naming ``extra``."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(fmt, module, extra) from None


@dataclass(frozen=True)
class Key:
    """A per-step source key a reader offers (what ``--print-map`` lists).

    ``kind``: ``array`` (numbers), ``image`` (one image per step), ``text`` (one string per
    step); ``dtype``: numpy's name (``uint8`` for images); ``shape``: per step (images: (H, W,
    C)); ``encoding``: images only, how the source stores them (``raw``, ``png``, ``jpeg``,
    ``jxl``); ``names``: per-dimension names where the source has them (joint names)."""

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str | None = None
    names: tuple[str, ...] | None = None


class Images(ABC):
    """The images of one key of one episode, one per step, decoded only when asked."""

    @abstractmethod
    def __len__(self) -> int:
        """Steps."""

    @property
    @abstractmethod
    def encoding(self) -> str:
        """``raw`` (decoded arrays) or the codec of :meth:`encoded` (``png``, ``jpeg``...)."""

    @abstractmethod
    def frames(self) -> Iterator[np.ndarray]:
        """Each step's image as uint8 (H, W, C), in step order."""

    def encoded(self) -> Sequence[bytes] | None:
        """Each step's image file bytes as the source stores them (None for ``raw``)."""
        return None


class ArrayImages(Images):
    """Images already decoded: a uint8 (T, H, W, C) array (or any array-like sliced by step,
    such as an h5py dataset: read one step at a time)."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @property
    def encoding(self) -> str:
        return "raw"

    def frames(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield np.asarray(self.array[i])


class EncodedImages(Images):
    """Images stored as files (PNG, JPEG, JPEG-XL bytes), decoded by ``decode`` when asked."""

    def __init__(self, blobs: Sequence[bytes], encoding: str, decode: Any) -> None:
        self.blobs, self._encoding, self.decode = blobs, encoding, decode

    def __len__(self) -> int:
        return len(self.blobs)

    @property
    def encoding(self) -> str:
        return self._encoding

    def frames(self) -> Iterator[np.ndarray]:
        for blob in self.blobs:
            yield self.decode(blob)

    def encoded(self) -> Sequence[bytes]:
        return self.blobs


@dataclass
class RawEpisode:
    """One source episode as read (see the module docstring).

    ``source``: where it is, for messages (``file#record 17``, ``data/demo_12``);
    ``length``: steps; ``arrays`` / ``images`` / ``texts``: per-step values by source key
    (leading axis ``length``); ``meta``: episode-level values (RLDS ``episode_metadata/*``,
    HDF5 attributes, a robomimic split); ``timestamps``: seconds per step when the source
    records them (ROS), else None; ``report``: the reader's figures for the import report
    (ROS: per-topic latency and drops)."""

    source: str
    length: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    images: dict[str, Images] = field(default_factory=dict)
    texts: dict[str, list[str]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    timestamps: np.ndarray | None = None
    report: dict[str, Any] = field(default_factory=dict)


class Reader(ABC):
    """A format's reader (see the module docstring). Subclasses set :attr:`format` (the
    ``--format`` name), :attr:`extra` (the pip extra of its third-party reader, "" for none)
    and implement the methods below. ``options``: the map's ``[source]`` table (format
    specific: ROS topics and staleness, a robomimic split, ...); both must pickle."""

    format: ClassVar[str] = ""
    extra: ClassVar[str] = ""

    def __init__(self, src: str | Path, options: dict[str, Any] | None = None) -> None:
        self.src = Path(src)
        self.options = dict(options or {})
        self.rate: float | None = None  # the output fps, set by import before read(): readers
        # of timed streams (ROS) resample onto it; the others ignore it

    @classmethod
    @abstractmethod
    def detect(cls, src: Path) -> bool:
        """Whether ``src`` (a file or folder) is in this format, from names and a few bytes
        (no third-party import): how ``import`` picks the format when ``--format`` is not
        given."""

    @abstractmethod
    def keys(self) -> dict[str, Key]:
        """Every per-step key of the source, from its own metadata where it has some (RLDS
        features.json), else from the first episode."""

    def fps(self) -> float | None:
        """The source's control frequency when it records one (robomimic env_args), else None
        (the map's ``fps`` or ``--fps`` must say)."""
        return None

    @abstractmethod
    def episodes(self) -> list[Any]:
        """References to every episode, in source order: small picklable values (a file and
        an offset, an HDF5 group name) that :meth:`read` takes. No episode data is read."""

    @abstractmethod
    def read(self, ref: Any) -> RawEpisode:
        """One episode (raises :class:`SourceError` for bad input)."""

    def describe(self, ref: Any) -> str:
        """``ref`` for messages (default: its ``str``)."""
        return str(ref)

    def file(self, ref: Any) -> str:
        """The file episode ``ref`` is read from, for messages (default: ``src`` itself, or
        ``src / ref`` when ``src`` is a folder of episode files)."""
        return str(self.src / str(ref)) if self.src.is_dir() else str(self.src)

    @abstractmethod
    def default_map(self) -> dict[str, Any]:
        """The built-in map of this layout (the TOML map's structure as a dict: see
        :mod:`episodekit.importers.mapping`), inferred from :meth:`keys`; ``--print-map``
        writes it for the user to edit."""
