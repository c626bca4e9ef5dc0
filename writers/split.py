"""``episodekit split``: one new dataset per fraction (``train=0.9,val=0.1``), episodes assigned
at random (``--seed``) either one by one or a whole task at a time (``--by task``: no task in
two splits). Each output keeps its episodes in source order; the writer writes every part and
publishes them together (``--out/<name>`` for each, or nothing)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from episodekit.core.dataset import Dataset, open_dataset
from episodekit.core.paths import DEFAULT_TARGET_MB
from episodekit.core.words import plural
from episodekit.writers.sources import source_episodes
from episodekit.writers.writer import Part, WriteOptions, WriteResult, write_parts

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
BY = ("episode", "task")


def parse_fractions(text: str) -> list[tuple[str, float]]:
    """``"train=0.9,val=0.1"`` -> ``[("train", 0.9), ("val", 0.1)]``; fractions > 0 summing
    to 1 (ValueError naming the problem otherwise)."""
    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            frac = float(value)
        except ValueError:
            frac = float("nan")
        if not sep or not NAME.match(name) or not frac > 0:
            raise ValueError(f"--fractions {text!r}: {part!r} is not NAME=FRACTION (e.g. val=0.1)")
        if name in dict(out):
            raise ValueError(f"--fractions {text!r}: {name!r} given twice")
        out.append((name, frac))
    if len(out) < 2:
        raise ValueError(f"--fractions {text!r}: give at least two parts, e.g. train=0.9,val=0.1")
    total = sum(f for _, f in out)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"--fractions {text!r}: the fractions sum to {total:g}, not 1")
    return out


def _quotas(n: int, fractions: list[float]) -> np.ndarray:
    """Largest-remainder rounding of ``n * fractions`` (sums to ``n``)."""
    raw = np.asarray(fractions) * n
    q = np.floor(raw).astype(np.int64)
    q[np.argsort(-(raw - q), kind="stable")[: n - int(q.sum())]] += 1
    return q


def assign(
    ds: Dataset, fractions: list[tuple[str, float]], seed: int, by: str = "episode"
) -> dict[str, np.ndarray]:
    """Episode indices of each split (sorted). ``by="task"`` keeps each task in one split,
    filling the split furthest below its share of episodes with the next (shuffled) task."""
    if by not in BY:
        raise ValueError(f"--by {by!r}: expected one of {BY}")
    eps = ds.column("episode_index")
    rng = np.random.default_rng(seed)
    names = [n for n, _ in fractions]
    if by == "episode":
        perm = rng.permutation(eps)
        bounds = np.concatenate([[0], np.cumsum(_quotas(len(eps), [f for _, f in fractions]))])
        out = {n: np.sort(perm[a:b]) for n, a, b in zip(names, bounds[:-1], bounds[1:])}
    else:
        task = ds.column("task_index")
        target = np.array([f for _, f in fractions]) * len(eps)
        got = np.zeros(len(names))
        parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for t in rng.permutation(np.unique(task)).tolist():
            members = eps[task == t]
            i = int(np.argmax(target - got))
            parts[names[i]].append(members)
            got[i] += len(members)
        out = {n: np.sort(np.concatenate(p)) if p else eps[:0] for n, p in parts.items()}
    empty = [n for n, e in out.items() if len(e) == 0]
    if empty:
        raise ValueError(
            f"split {empty[0]!r} gets no episodes ({plural(len(eps), 'episode')}"
            + (
                f", {plural(len(np.unique(ds.column('task_index'))), 'task')}"
                if by == "task"
                else ""
            )
            + "): give it a larger fraction"
        )
    return out


@dataclass
class SplitResult:
    out: str
    splits: dict[str, WriteResult] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"out": self.out, "splits": {k: v.as_dict() for k, v in self.splits.items()}}


def split(
    root: str,
    out: str | os.PathLike,
    fractions: list[tuple[str, float]],
    seed: int = 0,
    by: str = "episode",
    target_mb: float = DEFAULT_TARGET_MB,
    executor: str = "local",
) -> SplitResult:
    """Write one dataset per fraction under ``out/<name>`` (see the module docstring)."""
    ds = open_dataset(root)
    parts = [
        Part(
            name,
            source_episodes(ds, eps),
            WriteOptions(
                what="episodekit split",
                target_mb=target_mb,
                extra=(("split", name), ("seed", str(seed)), ("by", by)),
                executor=executor,
            ),
        )
        for name, eps in assign(ds, fractions, seed, by).items()
    ]
    result = SplitResult(str(out))
    result.splits = write_parts(parts, out, "episodekit split")
    return result
