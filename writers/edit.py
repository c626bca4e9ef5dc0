"""``episodekit edit``: a new dataset without some episodes, features or task names (never in
place), written by :func:`~episodekit.writers.writer.write_dataset`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from episodekit.core.dataset import open_dataset
from episodekit.core.paths import DEFAULT_TARGET_MB
from episodekit.validate.flagged import flagged_episodes
from episodekit.writers import select
from episodekit.writers.sources import source_episodes
from episodekit.writers.writer import WriteOptions, WriteResult, write_dataset


@dataclass(frozen=True)
class EditSpec:
    """What to change. Episode lists are episode indices of the source."""

    drop_episodes: tuple[int, ...] | None = None
    keep_episodes: tuple[int, ...] | None = None
    drop_tasks: tuple[str, ...] = ()
    drop_flagged: tuple[str, ...] = ()
    report: str | None = None  # a validate --json report for drop_flagged (else a fresh run)
    remove_features: tuple[str, ...] = ()
    rename_tasks: tuple[tuple[str, str], ...] = ()
    target_mb: float = DEFAULT_TARGET_MB
    executor: str = "local"  # or "ray": data files written and verified as Ray tasks


@dataclass
class EditResult:
    """The write's result plus what was dropped and why."""

    write: WriteResult
    dropped: dict[int, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        d = self.write.as_dict()
        d["dropped"] = {str(k): v for k, v in sorted(self.dropped.items())}
        return d


def edit(root: str, out: str | os.PathLike, spec: EditSpec) -> EditResult:
    """Write ``root`` with ``spec`` applied to ``out`` (see :class:`EditSpec`)."""
    ds = open_dataset(root)
    for old, _new in spec.rename_tasks:
        if old not in ds.task_strings():
            raise ValueError(f"--rename-task {old}=...: no task {old!r} in {root}")
    flagged = None
    if spec.drop_flagged:
        flagged = flagged_episodes(root, list(spec.drop_flagged), spec.report, ds.fingerprint)
    kept, dropped = select.choose(
        ds,
        drop=list(spec.drop_episodes) if spec.drop_episodes is not None else None,
        keep=list(spec.keep_episodes) if spec.keep_episodes is not None else None,
        drop_tasks=list(spec.drop_tasks),
        flagged=flagged,
    )
    options = WriteOptions(
        what="episodekit edit",
        remove_features=tuple(spec.remove_features),
        rename_tasks=tuple(spec.rename_tasks),
        target_mb=spec.target_mb,
        executor=spec.executor,
    )
    result = write_dataset(source_episodes(ds, kept), out, options)
    return EditResult(result, dropped)
