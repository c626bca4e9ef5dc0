"""How frames are read: one frozen :class:`ReadOptions`, built once from the keyword arguments a
user passes (``FrameDataset``, ``ShardedLoader``, ``ElasticLoader``, ``make_loader``) and passed
down unchanged to every reader a loader opens (a mixture's sources, a stream's bins, a worker
process), instead of the same keyword list repeated at each level.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from episodekit.loaders.reader import DEFAULT_CACHE_MB, DEFAULT_FOOTER_MB
from episodekit.loaders.store import AUTO

DEFAULT_TOLERANCE_S = 1e-4


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """What every frame reader of a loader shares.

    ``delta_timestamps``: LeRobot's windows (feature -> seconds); ``tolerance_s``: how far a
    delta or a video frame may sit from a frame time; ``cache_mb``: decoded row groups held;
    ``speed``: read the speed artifact, writing it once when missing (``"memory"``: never
    written; False: every sample gets 50); ``footer_mb``: parsed
    footers held; ``video_backend``: ``"auto"`` (decode when PyAV is installed), ``"pyav"``, a
    backend object, or ``"paths"`` / None (``{"path", "timestamp"}``);
    ``store``: ``"auto"``, None or a frame store path; ``warn_cache``: warn when random access
    would thrash the cache (streams pass False).
    """

    delta_timestamps: Mapping[str, Sequence[float]] | None = None
    tolerance_s: float = DEFAULT_TOLERANCE_S
    cache_mb: float = DEFAULT_CACHE_MB
    speed: bool | str = True
    footer_mb: float = DEFAULT_FOOTER_MB
    video_backend: Any = "auto"
    store: str | os.PathLike | None = AUTO
    warn_cache: bool = True

    def __post_init__(self) -> None:
        deltas = self.delta_timestamps
        if deltas is not None:  # a private copy: the options stay what they were made with
            if not isinstance(deltas, Mapping):
                raise TypeError(
                    f"delta_timestamps must be a dict of feature -> seconds, got {deltas!r}"
                )
            object.__setattr__(self, "delta_timestamps", {k: list(v) for k, v in deltas.items()})

    def replace(self, **changes: Any) -> ReadOptions:
        """A copy with ``changes`` (these options are frozen)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], where: str) -> ReadOptions:
        """Options from keyword arguments; a TypeError naming ``where`` for an unknown one."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(
                f"{where} got unexpected keyword argument(s) {', '.join(map(repr, unknown))} "
                f"(reader options: {', '.join(sorted(names))})"
            )
        return cls(**kwargs)
