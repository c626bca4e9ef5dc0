"""Where in info.json a finding points: the line of the key it is about, for the formats that
show a line (GitHub annotations, SARIF regions).

A finding on ``meta/info.json`` names a feature (``feature``, or a feature's name in its
message) or a top-level key (its check's usual key, or one its message names); the line is that
key's in the file as written.
"""

from __future__ import annotations

import json
import re

from episodekit.core.paths import INFO_FILE
from episodekit.validate.raw import Finding

# The key a check's info.json finding is about when its message names none.
CHECK_KEYS = {
    "info.version": "codebase_version",
    "info.fps": "fps",
    "info.totals": "total_episodes",
    "info.paths": "data_path",
    "info.videos": "video_path",
    "info.features": "features",
    "info.names": "features",
    "info.video": "features",
    "video.readable": "features",
}
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|\n')


def key_lines(text: str) -> dict[tuple[str, ...], int]:
    """``(key, subkey, ...) -> line`` (1-based) of every object key in a JSON text (the
    first occurrence of a path wins)."""
    out: dict[tuple[str, ...], int] = {}
    stack: list[str | None] = []  # the key of each open container (None: an array)
    line, pending = 1, None
    last_string: tuple[str, int] | None = None
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok == "\n":
            line += 1
        elif tok.startswith('"'):
            last_string = (tok, line)
        elif tok == ":" and last_string is not None:
            try:
                pending = json.loads(last_string[0])
            except ValueError:
                pending = None
            if pending is not None:
                path = tuple(k for k in stack if k is not None) + (pending,)
                out.setdefault(path, last_string[1])
        elif tok in "{[":
            stack.append(pending)
            pending = None
        elif tok in "}]":
            if stack:
                stack.pop()
            pending = None
        elif tok == ",":
            pending = None
        if not tok.startswith('"') and tok != "\n":
            last_string = None
    return out


def _names(name: str, message: str) -> bool:
    """Whether ``message`` names ``name`` as a whole word (``index`` is not in
    ``episode_index``, ``fps`` is not in ``video.fps``)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", message) is not None


class InfoLines:
    """Lines of info.json's keys, and the line a finding on it points at."""

    def __init__(self, text: str | None):
        self.lines = key_lines(text) if text else {}
        self.features = sorted(
            (p[1] for p in self.lines if len(p) == 2 and p[0] == "features"),
            key=len,
            reverse=True,
        )
        self.top = sorted((p[0] for p in self.lines if len(p) == 1), key=len, reverse=True)

    def line(self, f: Finding) -> int | None:
        """The line of ``f`` in info.json, or None (not an info.json finding, or no key)."""
        if f.file != INFO_FILE or not self.lines:
            return None
        feature = f.feature or next((n for n in self.features if _names(n, f.message)), None)
        if feature and ("features", feature) in self.lines:
            return self.lines[("features", feature)]
        usual = CHECK_KEYS.get(f.check)
        named = [k for k in self.top if _names(k, f.message)]
        key = usual if usual in named or not named else named[0]
        return self.lines.get((key,)) if key else None
