"""What the plans of a run must leave out: ``--exclude-episodes``, ``--exclude-frames`` and
``--exclude-flagged`` (with ``--flags-from``) turned into one
:class:`~episodekit.metadata.plans.exclude.Exclusion` for a dataset.

The app layer does this because it needs validation (which episodes a ``quality.*`` check flags)
and the plans (which must not know about validation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and pyarrow load only when something is excluded (no-op reruns)
    from episodekit.core.dataset import Dataset
    from episodekit.metadata.plans.exclude import Exclusion


@dataclass(frozen=True)
class ExcludeOptions:
    """The exclusion options as given on the command line (all optional)."""

    episodes: str | None = None  # "3,7,10-12"
    frames: str | None = None  # a JSON/jsonl file of (episode, start, end) ranges
    flagged: str | None = None  # check ids or groups: "quality.frozen,quality.duplicate"
    flags_from: str | None = None  # a validate --json report (else a fresh validation)

    def __bool__(self) -> bool:
        return bool(self.episodes or self.frames or self.flagged)

    def check(self) -> None:
        """ValueError for a bad option before anything runs (list syntax, names of checks)."""
        if self.episodes is not None:
            from episodekit.metadata.plans.exclude import parse_episode_list

            parse_episode_list(self.episodes)
        if self.flags_from is not None and not self.flagged:
            raise ValueError("--flags-from needs --exclude-flagged (which checks to use)")
        if self.flagged:
            from episodekit.validate.flagged import flagged_checks

            flagged_checks(self.flagged)


def build_exclusion(ds: Dataset, opts: ExcludeOptions) -> Exclusion | None:
    """The :class:`Exclusion` of ``opts`` on ``ds`` (None when nothing is excluded). Reasons:
    ``episodes`` (--exclude-episodes), ``frames`` (--exclude-frames) and one per flagging check.
    ValueError names a bad list, file, report or an episode the dataset lacks."""
    if not opts:
        return None
    import numpy as np

    from episodekit.metadata.plans.exclude import (
        Exclusion,
        parse_episode_list,
        read_frame_ranges,
        whole_episodes,
    )

    ep, length = ds.column("episode_index"), ds.column("length")
    parts: list[tuple[str, np.ndarray]] = []
    if opts.episodes:
        parts.append(("episodes", whole_episodes(parse_episode_list(opts.episodes), ep, length)))
    if opts.frames:
        parts.append(("frames", read_frame_ranges(opts.frames)))
    if opts.flagged:
        from episodekit.validate.flagged import flagged_episodes

        by_check: dict[str, list[int]] = {}
        found = flagged_episodes(ds.root, opts.flagged, opts.flags_from, ds.fingerprint)
        for e, checks in found.items():
            for c in checks:
                by_check.setdefault(c, []).append(e)
        for check, eps in sorted(by_check.items()):
            parts.append((check, whole_episodes(np.asarray(eps), ep, length)))
        if not by_check:
            parts.append((opts.flagged, np.empty((0, 3), np.int64)))
    return Exclusion.of(parts, ep, length)
