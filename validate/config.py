"""``episodekit.toml`` at a dataset's root: the validation settings a dataset repository keeps
with its data, so that CI, the pre-commit hook and a person run the same checks.

    [validate]
    select = ["all"]              # or "info,episodes,stats": what --select takes
    ignore = ["layout"]           # what --ignore takes
    fail-on = "warning"           # error (default) or warning
    baseline = "validate-baseline.json"   # relative to the root

An option given on the command line wins over the file's key. An unknown key, a wrong type or an
unreadable file is an error naming the file (exit 2), never silently ignored.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass

CONFIG_FILE = "episodekit.toml"
KEYS = ("select", "ignore", "fail-on", "baseline")


class ConfigError(ValueError):
    """An episodekit.toml that cannot be used."""


@dataclass(frozen=True)
class ValidateConfig:
    """The ``[validate]`` table; None where the file does not set a key."""

    path: str | None = None  # the file read (None: the root has none)
    select: list[str] | None = None
    ignore: list[str] | None = None
    fail_on: str | None = None
    baseline: str | None = None  # as a path usable from here (joined to the root)


def _names(value: object, key: str, path: str) -> list[str]:
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [validate] {key} must be a list of check names or a string")
    return [v.strip() for v in value if v.strip()]


def load_config(root: str) -> ValidateConfig:
    """The ``[validate]`` table of ``ROOT/episodekit.toml`` (an empty config when the root has
    no such file); raises :class:`ConfigError`."""
    from episodekit.core import toml

    if "://" in root:
        from fsspec.core import url_to_fs

        fs, base = url_to_fs(root)
        path = posixpath.join(base.rstrip("/"), CONFIG_FILE)
        shown = f"{root.rstrip('/')}/{CONFIG_FILE}"
    else:
        from fsspec.implementations.local import LocalFileSystem

        fs, path = LocalFileSystem(), os.path.join(root, CONFIG_FILE)
        shown = path
    try:
        if not fs.isfile(path):
            return ValidateConfig()
        text = fs.cat_file(path).decode("utf-8")
        doc = toml.loads(text)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{shown}: cannot read: {exc}") from exc
    table = doc.get("validate", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{shown}: [validate] must be a table")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ConfigError(
            f"{shown}: unknown key {unknown[0]!r} in [validate]; known: {', '.join(KEYS)}"
        )
    fail_on = table.get("fail-on")
    if fail_on is not None and fail_on not in ("error", "warning"):
        raise ConfigError(f"{shown}: [validate] fail-on must be 'error' or 'warning'")
    baseline = table.get("baseline")
    if baseline is not None:
        if not isinstance(baseline, str) or not baseline:
            raise ConfigError(f"{shown}: [validate] baseline must be a file name")
        if "://" in root:
            raise ConfigError(
                f"{shown}: [validate] baseline is read from a local file: give --baseline FILE"
            )
        baseline = os.path.join(root, baseline)
    return ValidateConfig(
        path=shown,
        select=_names(table["select"], "select", shown) if "select" in table else None,
        ignore=_names(table["ignore"], "ignore", shown) if "ignore" in table else None,
        fail_on=fail_on,
        baseline=baseline,
    )
