"""Format name -> reader class, and detection of a source's format (``import`` without
``--format``): each reader's :meth:`~episodekit.importers.episode.Reader.detect`, from names and
a few bytes (no third-party import)."""

from __future__ import annotations

from pathlib import Path

from episodekit.importers.episode import Reader
from episodekit.importers.hdf5 import AlohaReader, RobomimicReader
from episodekit.importers.rlds import RldsReader
from episodekit.importers.rosbag import RosbagReader
from episodekit.importers.zarr_replay import ZarrReader

READERS: dict[str, type[Reader]] = {
    r.format: r for r in (RldsReader, AlohaReader, RobomimicReader, ZarrReader, RosbagReader)
}


class UnknownLayout(ValueError):
    """The source is in no format a reader knows (exit 2): says what was seen."""


def reader_class(fmt: str) -> type[Reader]:
    """The reader of ``--format fmt`` (:class:`UnknownLayout` naming the known ones)."""
    try:
        return READERS[fmt]
    except KeyError:
        raise UnknownLayout(f"--format {fmt}: unknown (known: {', '.join(READERS)})") from None


def _seen(src: Path) -> str:
    if not src.exists():
        return "it does not exist"
    if src.is_file():
        with open(src, "rb") as f:
            head = f.read(8)
        return f"a file of {src.stat().st_size} bytes starting {head!r}"
    names = sorted(p.name for p in src.iterdir())
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"a folder holding {shown}" if names else "an empty folder"


def detect(src: str | Path) -> type[Reader]:
    """The reader whose layout ``src`` has; :class:`UnknownLayout` saying what it holds."""
    p = Path(src)
    if not p.exists():
        raise UnknownLayout(f"{src}: no such file or folder")
    found = [r for r in READERS.values() if p.exists() and r.detect(p)]
    if len(found) != 1:
        what = "matches " + " and ".join(r.format for r in found) if found else "is no layout"
        raise UnknownLayout(
            f"{src}: {what} episodekit imports ({', '.join(READERS)}): {_seen(p)}; give --format"
        )
    return found[0]
