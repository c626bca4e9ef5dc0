"""Log a warning once per process for the same key (a read-only root, a remote root, ...): a
training job calls these paths on every step and every rank; one line is enough."""

from __future__ import annotations

import logging

_logged: set[tuple[str, ...]] = set()


def log_once(log: logging.Logger, key: tuple[str, ...], message: str) -> None:
    """``log.warning(message)`` the first time this process sees ``key`` (namespace it with the
    caller, e.g. ``("stats", "readonly", root)``)."""
    if key not in _logged:
        _logged.add(key)
        log.warning(message)
