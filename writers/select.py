"""Choosing episodes: parse ``3,7,10-12``, and the episodes a selection keeps (by index, by task,
or by what validation flagged: ``episodekit.validate.flagged``).
"""

from __future__ import annotations

import numpy as np

from episodekit.core.dataset import Dataset
from episodekit.core.words import plural
from episodekit.metadata.plans.exclude import parse_episode_list as _parse


def parse_episode_list(text: str, option: str = "--drop-episodes") -> list[int]:
    """``"3,7,10-12"`` -> ``[3, 7, 10, 11, 12]`` (sorted, unique); ValueError naming the part
    (one parser with ``--exclude-episodes``: :mod:`episodekit.metadata.plans.exclude`)."""
    return _parse(text, option).tolist()


def parse_pairs(values: tuple[str, ...] | list[str], option: str) -> list[tuple[str, str]]:
    """``OLD=NEW`` options -> pairs (ValueError for a value without ``=``)."""
    out = []
    for v in values:
        old, sep, new = v.partition("=")
        if not sep or not old or not new:
            raise ValueError(f"{option} {v!r}: expected OLD=NEW")
        out.append((old, new))
    return out


def choose(
    ds: Dataset,
    drop: list[int] | None = None,
    keep: list[int] | None = None,
    drop_tasks: list[str] | None = None,
    flagged: dict[int, list[str]] | None = None,
) -> tuple[np.ndarray, dict[int, str]]:
    """The episode indices ``ds`` keeps, and each dropped episode's reason."""
    eps = ds.column("episode_index")
    have = set(eps.tolist())
    for option, given in (("--drop-episodes", drop), ("--keep-episodes", keep)):
        unknown = sorted(set(given or []) - have)
        if unknown:
            raise ValueError(
                f"{option}: episodes {unknown[:10]} are not in {ds.root} "
                f"(it has {plural(len(have), 'episode')}, {int(eps.min())}..{int(eps.max())})"
            )
    reasons: dict[int, str] = {}
    if keep is not None:
        kept = set(keep)
        reasons.update({e: "not in --keep-episodes" for e in have - kept})
    for e in drop or []:
        reasons.setdefault(e, "--drop-episodes")
    if drop_tasks:
        strings = set(ds.task_strings())
        unknown = [t for t in drop_tasks if t not in strings]
        if unknown:
            raise ValueError(f"--drop-tasks: no task {unknown[0]!r} in {ds.root}")
        dropped = set(drop_tasks)
        for e, tasks in zip(eps.tolist(), ds.episodes["tasks"].to_pylist()):
            if set(tasks or []) & dropped:
                reasons.setdefault(e, "--drop-tasks")
    for e, checks in (flagged or {}).items():
        if e in have:
            reasons.setdefault(e, "flagged by " + ",".join(checks))
    kept_eps = np.array([e for e in eps.tolist() if e not in reasons], dtype=np.int64)
    return kept_eps, reasons
