"""Counts in words, in one place, so that no message says "1 row groups" or "1 episodes"."""

from __future__ import annotations


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` (thousands separated) and ``noun`` in agreement with it: ``plural(1, "episode")``
    is "1 episode", ``plural(1024, "row group")`` is "1,024 row groups". ``many``: the plural
    form when it is not ``noun`` + "s"."""
    return f"{n:,} {noun_for(n, noun, many)}"


def noun_for(n: int, noun: str, many: str | None = None) -> str:
    """Just the noun in agreement with ``n`` (for "3 of 1 row group"-style phrases)."""
    return noun if n == 1 else (many or noun + "s")
