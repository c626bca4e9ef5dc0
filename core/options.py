"""Option objects: one frozen dataclass per call that takes many settings, with the keyword
arguments callers already pass applied on top (``fn(root, opts, force=True)``)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, TypeVar

_T = TypeVar("_T")


def with_overrides(cls: type[_T], options: _T | None, overrides: dict[str, Any]) -> _T:
    """``options`` (default: ``cls()``) with ``overrides`` applied; an unknown name is a
    TypeError, as for any keyword argument."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise TypeError(f"unexpected {cls.__name__} option(s): {', '.join(unknown)}")
    return replace(options or cls(), **overrides)  # type: ignore[type-var]
