"""What every step of ``episodekit prepare`` is: the artifacts it owns, ``ensure`` and its result.

A step (one object, :class:`PrepareStep`) declares the artifacts it writes (:class:`Artifact`:
their paths under the root and the key of its inputs that their header records), whether the
options want it (``wanted``), whether its output is current from headers and footers alone
(``is_fresh``: a fresh step shows no progress bar), brings its output up to date (``ensure``
-> :class:`Ensured`), words its summary line (``summary``) and says what a rerun of the same
options on the root it left will report (``rerun_detail``, kept in the validation stamp, and
``replayed`` by the stamp-only rerun). The registry is :data:`episodekit.prepare_steps.STEPS`:
the runner, the no-op rerun, the stamp and ``format_result`` read from it, so a new artifact
is one module with its step, its line in that registry, and its CLI command.

Every heavy import happens inside ``ensure``: a rerun where everything is fresh imports only
what reading headers needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from episodekit.core.paths import INFO_FILE

if TYPE_CHECKING:
    from collections.abc import Callable

    from episodekit.core.dataset import Dataset
    from episodekit.metadata.plans.exclude import Exclusion
    from episodekit.prepare_model import PlanShape, PrepareOptions, PrepareResult, Step


class Ensured(NamedTuple):
    """A step's typed result: ``status`` ("done" | "skipped" | "failed"), the ``detail`` the
    report shows, and the files it ``changed`` (relative to the work root)."""

    status: str
    detail: dict
    changed: list[str]


def done_or_skipped(detail: dict, changed: list[str]) -> Ensured:
    """Status "done" when files changed, else "skipped" (the output was fresh)."""
    return Ensured("done" if changed else "skipped", detail, changed)


@dataclass(frozen=True)
class Artifact:
    """One artifact a step owns: its ``paths`` under the root (globs), the ``key`` of its
    inputs that its header records (what decides it is fresh), and whether the validation
    stamp keys on its files (``stamped``: those inside the root that validation reads)."""

    name: str
    paths: tuple[str, ...]
    key: str
    stamped: bool = True


@dataclass
class Context:
    """What the steps share: the options, the source, the work root, the result so far."""

    root: str
    opts: PrepareOptions
    say: Callable[[str], None]
    result: PrepareResult
    source: Dataset
    shapes: list[PlanShape]
    work: Path = field(default_factory=Path)
    steps: tuple[PrepareStep, ...] = ()  # the registry this run takes (set by the runner)
    _ds: Dataset | None = None
    rows_rewritten: bool = False
    _exclusion: Any = False  # not built yet

    @property
    def exclusion(self) -> Exclusion | None:
        """What the plans leave out (``--exclude-*``), built once from the dataset the plans
        read (after the rewrite: flagged episodes are judged on the rows that are trained on)."""
        if self._exclusion is False:
            from episodekit.exclusions import build_exclusion

            self._exclusion = (
                build_exclusion(self.ds, self.opts.exclude) if self.opts.exclude else None
            )
        return self._exclusion

    @property
    def ds(self) -> Dataset:
        """The dataset the metadata steps read: the source unless its rows were rewritten
        elsewhere (``--out``) or in place."""
        if self._ds is None:
            from episodekit.core.dataset import open_dataset

            self.rows_rewritten = any(s.changed for s in self.result.steps)
            fresh_rows = self.opts.out is None and not self.rows_rewritten
            self._ds = self.source if fresh_rows else open_dataset(str(self.work))
        return self._ds


class PrepareStep(ABC):
    """One step; subclasses set ``name`` and ``artifacts`` and override what they need."""

    name = ""
    artifacts: tuple[Artifact, ...] = ()  # a rewrite of the dataset's own files owns none
    stops_on_failure = False  # a failed rewrite leaves nothing sound to plan or validate
    verdict = False  # its failure is a verdict on a complete output (validation, frame store)

    def wanted(self, opts: PrepareOptions) -> bool:
        return True

    def is_fresh(self, ctx: Context) -> bool:
        """True when the output is current, known from headers alone (False: ``ensure``
        decides)."""
        return False

    @abstractmethod
    def ensure(self, ctx: Context) -> Ensured:
        """Bring the step's output up to date (nothing is written when it is fresh)."""

    def summary(self, step: Step) -> str:
        """What the step did, for the summary table; skipped steps print nothing."""
        return ""

    def rerun_detail(self, step: Step) -> dict | None:
        """What ``step`` (this step's record in a run) will report when rerun with the same
        options on the root it left (None: cannot tell, so no stamp-only rerun)."""
        return None

    def replayed(self, recorded: dict | None, root: str, stamp: dict) -> dict:
        """The detail a stamp-only rerun on ``root`` reports, from what was ``recorded``."""
        return recorded or {}


# what validation reads besides the data files and the artifacts (the stamp keys on them too)
DATASET_GLOBS = (
    INFO_FILE,
    "meta/tasks.parquet",
    "meta/episodes/*/*.parquet",
    "videos/*/*/*.mp4",  # video.* checks read them (v3.0 and v2.1 layouts)
)


def stamped_globs(steps: Sequence[PrepareStep]) -> tuple[str, ...]:
    """What the validation stamp keys on (size and mtime), besides the data files: the files
    validation reads and every stamped artifact's paths of ``steps``, in their order."""
    paths = [p for s in steps for a in s.artifacts if a.stamped for p in a.paths]
    return DATASET_GLOBS + tuple(paths)


def steps_before(steps: Sequence[PrepareStep], step: PrepareStep, opts: PrepareOptions) -> list:
    """The steps a run with ``opts`` takes before ``step`` (in the registry ``steps``)."""
    upto = list(steps).index(step) if step in steps else len(steps)
    return [s for s in steps[:upto] if s.wanted(opts)]
