"""Lay out the package as one folder tree for the API reference: build/apidoc/episodekit/.

The repository maps folders to subpackages (``app/`` -> ``episodekit``, ``core/`` ->
``episodekit.core``, ...; see setup.py), which a static reader such as mkdocstrings' griffe
cannot follow. This makes a tree of symbolic links in the import layout; ``mkdocs.yml`` points
the python handler at it (``make docs`` and ``make test`` run this first).
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUBPACKAGES = (
    "core", "prep", "metadata", "loaders", "validate", "writers", "sample", "importers",
)  # fmt: skip


def build(out: Path = REPO / "build" / "apidoc") -> Path:
    """(Re)make ``out/episodekit`` and return it."""
    pkg = out / "episodekit"
    if out.exists():
        shutil.rmtree(out)
    pkg.mkdir(parents=True)
    for entry in (REPO / "app").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for sub in SUBPACKAGES:
        (pkg / sub).symlink_to(REPO / sub)
    return pkg


if __name__ == "__main__":
    print(build())
