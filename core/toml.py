"""TOML reading on every supported Python: ``tomllib`` (3.11+), else the ``tomli`` backport
(a dependency on 3.10 only)."""

from __future__ import annotations

from typing import Any

try:
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10
    import tomli as _toml  # type: ignore[no-redef]

TOMLDecodeError = _toml.TOMLDecodeError


def loads(text: str) -> dict[str, Any]:
    """The TOML document ``text`` as a dict; raises :data:`TOMLDecodeError` (a ValueError)."""
    return _toml.loads(text)
