"""Packages are discovered, never listed by hand: every folder holding an ``__init__.py`` under
one of the mapped folders below is installed (a hand-written list once left two subpackages out
of the wheel while every test passed on the editable install).

The repository maps folders to subpackages (``app/`` -> ``episodekit``, ``core/`` ->
``episodekit.core``, ...); no folder at the top is named ``episodekit``, so a regular
``pip install .`` run from here is never shadowed. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

PACKAGE_DIR = {
    "episodekit": "app",
    "episodekit.core": "core",
    "episodekit.prep": "prep",
    "episodekit.metadata": "metadata",
    "episodekit.loaders": "loaders",
    "episodekit.validate": "validate",
    "episodekit.writers": "writers",
    "episodekit.sample": "sample",
    "episodekit.importers": "importers",
}


def discover() -> list[str]:
    """Each mapped package and every package found below its folder."""
    found = []
    for name, folder in PACKAGE_DIR.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(where=folder)]
    return sorted(found)


setup(packages=discover(), package_dir=PACKAGE_DIR)
