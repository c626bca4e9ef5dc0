"""Reading a mixture plan at start-up (light: numpy, json, fsspec; what the loader imports).

A mixture plan folder (``episodekit metadata plan --mixture m.json --out DIR``) holds
``DIR/mixture.json`` (the normalized spec) and one plan per shape, ``DIR/ws{W}_nw{K}.json``: a
shard plan whose items carry a fourth column, ``source`` (position in the header's ``sources``),
plus ``sources`` (name, root, episodes fingerprint, frames, quota...), ``quotas`` (frames per
source per epoch, summing to ``samples_per_worker x bins``) and ``bin_draws`` (bins x sources:
how many samples each bin draws from each source per epoch; rows sum to ``samples_per_worker``,
columns to the quotas). Everything that reads plans generically (items, bins, samples per
worker) reads a mixture plan the same way.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, DatasetError, open_dataset, resolve_root
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.words import plural
from episodekit.metadata.mixture.spec import MIXTURE_FILE, MixtureSpec, parse_mixture
from episodekit.metadata.plans.plan_file import (
    Plan,
    PlanError,
    PlanNotFoundError,
    StalePlanError,
    plan_flags,
    read_plan_file,
)

MIXTURE_PLAN_VERSION = 1


def mixture_plan_name(world_size: int, num_workers: int) -> str:
    """File name of a mixture plan for one shape, inside its folder."""
    return f"ws{int(world_size)}_nw{int(num_workers)}.json"


def mixture_fix_hint(folder: str, world_size: int, num_workers: int) -> str:
    return (
        f"episodekit metadata plan --mixture {posixpath.join(folder, MIXTURE_FILE)} "
        f"--world-size {world_size} --workers {num_workers} --out {folder}"
    )


class MixturePlan(Plan):
    """A shard plan over several sources: ``item_source`` per item, ``sources`` (header rows),
    ``quotas`` and ``bin_draws`` (bins x sources draws per epoch), and the mixture ``spec``."""

    def __init__(self, doc: dict, path: str | None = None):
        super().__init__(doc, path)
        self.sources: list[dict] = doc["sources"]
        self.source_names: list[str] = [s["name"] for s in self.sources]
        self.quotas = np.asarray(doc["quotas"], dtype=np.int64)
        self.draws = np.asarray(doc["bin_draws"], dtype=np.int64).reshape(
            self.num_bins, len(self.sources)
        )
        self.spec: MixtureSpec = parse_mixture(doc["mixture"])
        self.datasets: list[Dataset] | None = None  # opened by load_mixture_plan(check_fresh)

    def __repr__(self) -> str:
        return (
            f"MixturePlan(sources={self.source_names}, world_size={self.world_size}, "
            f"num_workers={self.num_workers}, samples_per_worker={self.samples_per_worker}, "
            f"quotas={self.quotas.tolist()})"
        )

    def bin_sources(self, rank: int, worker: int) -> np.ndarray:
        """Source of each item of :meth:`bin_items` (same order)."""
        self.bin_items(rank, worker)  # range check
        b = rank * self.num_workers + worker
        return self.item_source[self.bin_offsets[b] : self.bin_offsets[b + 1]]

    def bin_draws(self, rank: int, worker: int) -> np.ndarray:
        """Samples bin (rank, worker) draws from each source per epoch."""
        return self.draws[rank * self.num_workers + worker]


def check_mixture_doc(doc: dict, where: str) -> None:
    """Type and arithmetic checks of a mixture plan's own fields (untrusted file)."""
    sources = doc.get("sources")
    if not isinstance(sources, list) or not sources:
        raise PlanError(f"{where}: field 'sources' must be a non-empty list")
    for i, s in enumerate(sources):
        if not isinstance(s, dict) or not all(
            isinstance(s.get(k), str) for k in ("name", "root", "fingerprint")
        ):
            raise PlanError(f"{where}: sources[{i}] needs string name, root and fingerprint")
    S, B = len(sources), int(doc["num_bins"])
    if not isinstance(doc.get("mixture"), dict):
        raise PlanError(f"{where}: field 'mixture' is missing")
    try:
        q = np.asarray(doc.get("quotas"), dtype=np.int64)
        d = np.asarray(doc.get("bin_draws"), dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"{where}: fields 'quotas'/'bin_draws' must be integers ({exc})") from exc
    if q.shape != (S,) or d.shape != (B, S) or (q < 0).any() or (d < 0).any():
        raise PlanError(f"{where}: 'quotas' needs {S} and 'bin_draws' {B} x {S} integers >= 0")
    if (d.sum(1) != int(doc["samples_per_worker"])).any() or (d.sum(0) != q).any():
        raise PlanError(
            f"{where}: 'bin_draws' rows must sum to samples_per_worker and columns to 'quotas'"
        )
    src = doc["item_source"]
    if len(src) and (src.min() < 0 or src.max() >= S):
        raise PlanError(f"{where}: an item names a source outside 'sources'")


def _check_folder_spec(fs: Any, base: str, path: str, plan: MixturePlan, folder: str) -> None:
    """The plan must be of the mixture its folder's ``mixture.json`` describes: planning another
    mixture into the folder rewrites that file and the planned shapes only, and a job of
    another shape would otherwise train on the old mixture without a word."""
    spec_path = posixpath.join(base.rstrip("/") or "/", MIXTURE_FILE)
    try:
        with fs.open(spec_path, "rb") as fh:
            current = json.loads(fh.read(16 << 20))
    except FileNotFoundError:
        return  # a plan file copied on its own: its own header is all there is
    except ValueError as exc:
        raise PlanError(f"{spec_path}: not valid JSON ({exc})") from None
    if current != plan.doc["mixture"]:
        raise StalePlanError(
            f"{path}: stale mixture plan: it is of another mixture than {spec_path} (the "
            f"folder was planned for a new mixture since); recompute it with: "
            f"{mixture_fix_hint(folder, plan.world_size, plan.num_workers)}"
            f"{plan_flags(plan.doc)} --force"
        )


def load_mixture_plan(
    folder: str | Any, world_size: int, num_workers: int, check_fresh: bool = True
) -> MixturePlan:
    """The mixture plan for one shape in ``folder``. With ``check_fresh`` every source root is
    opened (metadata only) and a changed episodes fingerprint raises :class:`StalePlanError`
    naming the source; the opened datasets are kept on ``plan.datasets`` for the loader."""
    fs, base = resolve_root(str(folder))
    path = posixpath.join(base.rstrip("/") or "/", mixture_plan_name(world_size, num_workers))
    if not fs.exists(path):
        raise PlanNotFoundError(
            f"{path}: no mixture plan for world size {world_size} x "
            f"{plural(num_workers, 'worker')}; "
            f"create it with: {mixture_fix_hint(str(folder), world_size, num_workers)}"
        )
    plan = read_plan_file(fs, path)
    if not isinstance(plan.doc.get("sources"), list):
        raise PlanError(f"{path}: not a mixture plan (no 'sources')")
    check_mixture_doc(plan.doc, path)
    plan = MixturePlan(plan.doc, path)
    if check_fresh:
        _check_folder_spec(fs, base, path, plan, str(folder))
        datasets = []
        for s in plan.sources:
            try:
                ds = open_dataset(s["root"], check_files=False, check_totals=False)
            except DatasetError as exc:
                raise PlanError(f"{path}: source {s['name']!r}: {exc}") from exc
            except EnvironmentProblem as exc:  # e.g. its hub unreachable: still name the source
                raise EnvironmentProblem(f"source {s['name']!r}: {exc}", path) from exc
            if ds.fingerprint != s["fingerprint"]:
                raise StalePlanError(
                    f"{path}: stale mixture plan: source {s['name']!r} ({s['root']}) changed "
                    f"(episodes fingerprint {s['fingerprint']} -> {ds.fingerprint}); recompute "
                    f"it with: {mixture_fix_hint(str(folder), world_size, num_workers)}"
                    f"{plan_flags(plan.doc)} --force"
                )
            datasets.append(ds)
        if len(plan.items) > sum(d.num_frames for d in datasets):
            raise PlanError(f"{path}: more items than the sources have frames")
        plan.datasets = datasets
    return plan
