"""The data of a ``prepare`` run: its options, its result, the shapes it plans and the
validation stamp that lets an unchanged root skip validation (and the whole run). No import of
the steps, so every module of ``prepare`` can use it without a cycle."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from episodekit.core.errors import EnvironmentProblem
from episodekit.core.paths import DEFAULT_TARGET_MB, STAMP_FILE, check_target_mb
from episodekit.core.version import __version__

STAMP_VERSION = 1
SPLIT_LONG = ("no", "yes", "auto")
STATS_MODES = ("keep", "recompute")


@dataclass
class Step:
    """One step of the job: what it did and how long it took."""

    name: str
    status: str  # "done" | "skipped" | "failed"
    seconds: float
    detail: dict[str, Any] = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)  # files written, relative to the root

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "changed": self.changed,
            "detail": self.detail,
        }


@dataclass
class PrepareResult:
    """The whole job's outcome; ``ok`` is the validation verdict."""

    root: str
    work_root: str
    steps: list[Step] = field(default_factory=list)
    ok: bool = False
    seconds: float = 0.0
    pushed: Any = None
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> list[str]:
        return sorted({p for s in self.steps for p in s.changed})

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "work_root": self.work_root,
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "changed": self.changed,
            "pushed": str(self.pushed) if self.pushed is not None else None,
            "warnings": self.warnings,
            "steps": [s.to_dict() for s in self.steps],
        }


def state_digest(
    root: Path, fingerprint: str, data_files: Sequence[str], globs: Sequence[str]
) -> str:
    """Hash of what validation looked at: fingerprint, data files' and artifacts' size/mtime
    (``globs``: the step registry's, :func:`episodekit.prepare_steps.stamped_globs`)."""
    h = hashlib.sha256(f"{STAMP_VERSION}\0{fingerprint}\0{__version__}\0".encode())
    paths = [root / rel for rel in data_files]
    for pattern in globs:
        paths += sorted(root.glob(pattern))
    for p in paths:
        try:
            st = p.stat()
        except FileNotFoundError:
            h.update(f"{p.relative_to(root)}\0missing\0".encode())
            continue
        h.update(f"{p.relative_to(root)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def read_stamp(root: Path) -> dict | None:
    try:
        return json.loads((root / STAMP_FILE).read_text())
    except (OSError, ValueError):  # a cache: unreadable means "validate again"
        return None


@dataclass(frozen=True)
class PlanShape:
    """One world size to plan, and how (``split_long``), or why it is skipped (``skip``)."""

    world_size: int
    split_long: bool = False
    skip: str | None = None


@dataclass
class PrepareOptions:
    """Every option of :func:`prepare` (see its docstring), checked by :meth:`check`."""

    out: str | None = None
    target_mb: float = DEFAULT_TARGET_MB
    world_sizes: Sequence[int] = (8, 64)
    num_workers: int = 4
    cost: str = "frames"
    executor: str = "local"
    jobs: int | None = None
    push_to_hub: str | None = None
    include_videos: bool = False
    force: bool = False
    hub_api: Any = None
    progress: Callable[[str], None] | None = None
    split_long: str | bool = "auto"
    videos_gop: int | None = None
    locality: str = "rowgroup"
    frames: bool = False
    wait: bool = True
    canonical_bins: int | None | bool = False
    stats: str = "keep"
    plans_required: bool = True  # False for a mixture's sources: the mixture's plans are loaded
    exclude: Any = None  # episodekit.exclusions.ExcludeOptions: frames the plans never draw
    convert: bool = False  # a v2.x root: convert it into ``out`` first, then prepare that

    def check_values(self) -> None:
        """Raise ``ValueError`` for a bad value (no import: the no-op rerun starts fast)."""
        if isinstance(self.split_long, bool):
            self.split_long = "yes" if self.split_long else "no"
        if self.split_long not in SPLIT_LONG:
            raise ValueError(f"split_long must be one of {SPLIT_LONG}, got {self.split_long!r}")
        if not self.world_sizes or any(int(w) < 1 for w in self.world_sizes):
            raise ValueError(f"world sizes must be >= 1, got {list(self.world_sizes)}")
        if self.num_workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.num_workers}")
        self.target_mb = check_target_mb(self.target_mb)  # MiB until the writer
        c = self.canonical_bins
        if c is not False and c is not None and int(c) < 1:
            raise ValueError(f"canonical_bins must be >= 1, got {c}")
        if self.exclude:
            self.exclude.check()
        if self.stats not in STATS_MODES:
            raise ValueError(f"stats must be one of {STATS_MODES}, got {self.stats!r}")

    def check(self, root: str) -> None:
        """Raise ``ValueError`` / ``EnvironmentProblem`` for bad options, before any write."""
        import importlib.util

        from episodekit.core.hub import is_remote
        from episodekit.metadata.costs import check_model

        self.check_values()
        check_model(self.cost)
        if self.executor == "ray" and importlib.util.find_spec("ray") is None:
            raise EnvironmentProblem("--executor ray needs ray: pip install 'episodekit[ray]'")
        if is_remote(root) and self.out is None:
            raise ValueError(
                f"{root} is remote: pass --out DIR (it is read there, prepared locally)"
            )
        if self.out is not None:
            self.out = str(self.out)
