"""The LeRobot v3.0 layout as one typed model: ``meta/info.json`` parsed once into :class:`Info`
and :class:`Feature` (:mod:`.info`), the rules a value must follow (:mod:`.rules`: defaults,
positive and finite numbers, dtype names) and where files go (:mod:`.files`: LeRobot's file
roll-over, chunk numbering, path templates).

Readers parse strictly (:meth:`Info.parse`: one line naming the key); ``validate`` and ``repair``
parse tolerantly (:meth:`Info.parse_tolerant`: what could be read, plus a finding per problem).
"""

from episodekit.core.layout.files import chunk_file, file_path, roll_over
from episodekit.core.layout.info import Feature, Info, InfoError, LayoutFinding

__all__ = [
    "Feature",
    "Info",
    "InfoError",
    "LayoutFinding",
    "chunk_file",
    "file_path",
    "roll_over",
]
