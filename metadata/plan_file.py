"""Reading a shard plan at start-up: which (episode, frame range) each (rank, worker) reads.

A plan file ``meta/shard_plans/ws{W}_nw{K}.json`` (written by ``episodekit metadata plan``) assigns
every episode, or contiguous frame ranges of long episodes, to one of ``W * K`` bins;
bin ``b = rank * K + worker``. The file is JSON: a header (parameters, fingerprint, balance figures,
per-bin totals, ``bin_offsets``) and the items, sorted by bin then episode then start frame, as
three integer columns: plain JSON lists for small plans, zlib-compressed little-endian int64 in
base64 for big ones, so 1M items load in a fraction of a second with numpy.

Every bin yields exactly ``samples_per_worker`` samples per epoch (``policy`` "trim": heavier bins
drop their surplus; "wrap": lighter bins repeat frames), so no rank runs out early and DDP does not
hang at the end of an epoch. Only numpy, json and fsspec are needed here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
import zlib
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, open_dataset, resolve_root
from episodekit.core.paths import PLAN_DIR

PLAN_FORMAT = "episodekit.shard_plan"
PLAN_VERSION = 1
POLICIES = ("trim", "wrap")
JSON_ITEMS_MAX = 100_000  # above this many items, columns are stored compressed (base64)
ITEM_COLUMNS = ("episode_index", "start", "end")


class PlanError(Exception):
    """A shard plan that cannot be used; the message names the file and the fix."""


class PlanNotFoundError(PlanError):
    """No plan exists for this (world size, workers) shape."""


class StalePlanError(PlanError):
    """The plan was computed from other episodes than the dataset now has (fingerprint differs)."""


def plan_path(world_size: int, num_workers: int) -> str:
    """Relative path (from the dataset root) of the plan for one shape."""
    return f"{PLAN_DIR}/ws{int(world_size)}_nw{int(num_workers)}.json"


def fix_hint(root: str, world_size: int, num_workers: int) -> str:
    return f"episodekit metadata plan {root} --world-size {world_size} --workers {num_workers}"


def _encode_column(values: np.ndarray, compressed: bool) -> Any:
    values = np.ascontiguousarray(values, dtype="<i8")
    if not compressed:
        return values.tolist()
    return base64.b64encode(zlib.compress(values.tobytes(), 1)).decode("ascii")


def _decode_column(value: Any, n: int, where: str) -> np.ndarray:
    if isinstance(value, str):
        out = np.frombuffer(zlib.decompress(base64.b64decode(value)), dtype="<i8")
    else:
        out = np.asarray(value, dtype=np.int64)
    if len(out) != n:
        raise PlanError(f"{where}: an item column has {len(out)} values, expected {n}")
    return out.astype(np.int64, copy=False)


def encode_plan(plan: dict) -> bytes:
    """The plan file's bytes: sorted keys, no timestamps, so equal plans give equal bytes."""
    items = np.asarray(plan["items"], dtype=np.int64).reshape(-1, 3)
    compressed = len(items) > JSON_ITEMS_MAX
    doc = {k: v for k, v in plan.items() if k not in ("items", "path")}
    for k in ("bin_offsets", "bin_cost", "bin_frames"):
        doc[k] = np.asarray(doc[k]).tolist()
    doc["items"] = {
        "encoding": "zlib-base64-int64le" if compressed else "json",
        "count": len(items),
        **{c: _encode_column(items[:, j], compressed) for j, c in enumerate(ITEM_COLUMNS)},
    }
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode_plan(raw: bytes, where: str = "plan") -> dict:
    """Inverse of :func:`encode_plan`: header values plus numpy ``items`` (n, 3) and bin arrays."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlanError(f"{where}: not a valid plan file ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != PLAN_FORMAT:
        raise PlanError(f"{where}: not an episodekit shard plan")
    if doc.get("version") != PLAN_VERSION:
        raise PlanError(
            f"{where}: plan format version {doc.get('version')}, expected {PLAN_VERSION}"
        )
    try:
        cols = doc.pop("items")
        n = int(cols["count"])
        items = np.empty((n, 3), dtype=np.int64)
        for j, c in enumerate(ITEM_COLUMNS):
            items[:, j] = _decode_column(cols[c], n, where)
        doc["items"] = items
        doc["bin_offsets"] = np.asarray(doc["bin_offsets"], dtype=np.int64)
        doc["bin_cost"] = np.asarray(doc["bin_cost"], dtype=np.float64)
        doc["bin_frames"] = np.asarray(doc["bin_frames"], dtype=np.int64)
    except (KeyError, TypeError, ValueError, zlib.error) as exc:
        raise PlanError(f"{where}: malformed plan file ({exc!r})") from exc
    if len(doc["bin_offsets"]) != doc["num_bins"] + 1 or doc["bin_offsets"][-1] != n:
        raise PlanError(f"{where}: bin_offsets do not match the items")
    return doc


class Plan:
    """A shard plan: the items of every (rank, worker) bin and the per-epoch sample count."""

    def __init__(self, doc: dict, path: str | None = None):
        self.doc = doc
        self.path = path
        self.world_size: int = int(doc["world_size"])
        self.num_workers: int = int(doc["num_workers"])
        self.num_bins: int = int(doc["num_bins"])
        self.fingerprint: str = doc["fingerprint"]
        self.algo: str = doc["algo"]
        self.cost_model: str = doc["cost_model"]
        self.seed: int = int(doc["seed"])
        self.split_long: bool = bool(doc["split_long"])
        self.policy: str = doc["policy"]
        self.samples_per_worker: int = int(doc["samples_per_worker"])
        self.samples_per_rank: int = int(doc["samples_per_rank"])
        self.dropped_frames: int = int(doc["dropped_frames"])
        self.repeated_frames: int = int(doc["repeated_frames"])
        self.balance: dict = doc["balance"]
        self.items: np.ndarray = doc["items"]  # (n, 3) int64, sorted by bin, episode, start
        self.bin_offsets: np.ndarray = doc["bin_offsets"]
        self.locality: str = doc.get("locality", "none")
        self._digest: str | None = None

    @property
    def digest(self) -> str:
        """Hash of what decides the order (items, bins, samples per worker): a loader's state
        names the plan it was taken with by this."""
        if self._digest is None:
            h = hashlib.sha256()
            h.update(np.ascontiguousarray(self.items, dtype="<i8").tobytes())
            h.update(np.ascontiguousarray(self.bin_offsets, dtype="<i8").tobytes())
            h.update(f"{self.world_size}/{self.num_workers}/{self.samples_per_worker}".encode())
            self._digest = h.hexdigest()[:16]
        return self._digest

    def __repr__(self) -> str:
        return (
            f"Plan(world_size={self.world_size}, num_workers={self.num_workers}, "
            f"items={len(self.items)}, samples_per_worker={self.samples_per_worker}, "
            f"locality={self.locality!r}, "
            f"max/lower_bound={self.balance['plan']['max_over_lower_bound']})"
        )

    def bins(self) -> list[np.ndarray]:
        """Per bin ``b = rank * num_workers + worker``: (k, 3) rows (episode, start, end)."""
        return np.split(self.items, self.bin_offsets[1:-1])

    def bin_items(self, rank: int, worker: int) -> np.ndarray:
        """The (k, 3) items of one (rank, worker) bin (end frame exclusive)."""
        if not (0 <= rank < self.world_size and 0 <= worker < self.num_workers):
            raise IndexError(
                f"(rank {rank}, worker {worker}) outside a plan for world size "
                f"{self.world_size} x {self.num_workers} workers"
            )
        b = rank * self.num_workers + worker
        return self.items[self.bin_offsets[b] : self.bin_offsets[b + 1]]

    def rank_items(self, rank: int) -> np.ndarray:
        """All items of one rank (its workers' bins concatenated)."""
        k = self.num_workers
        return self.items[self.bin_offsets[rank * k] : self.bin_offsets[(rank + 1) * k]]

    def bin_frames(self) -> np.ndarray:
        """Frames per bin (before trimming or wrapping to ``samples_per_worker``)."""
        return np.asarray(self.doc["bin_frames"], dtype=np.int64)

    def bin_cost(self) -> np.ndarray:
        """Cost per bin under the plan's cost model."""
        return np.asarray(self.doc["bin_cost"], dtype=np.float64)


def read_plan_file(fs, path: str) -> Plan:
    """Read and decode one plan file (no freshness check)."""
    with fs.open(path, "rb") as fh:
        raw = fh.read()
    return Plan(decode_plan(raw, path), path)


def load_plan(root: str | Any, world_size: int, num_workers: int, check_fresh: bool = True) -> Plan:
    """The plan for ``world_size`` ranks x ``num_workers`` workers under a dataset root.

    ``root`` is a path/URL or an opened ``Dataset``. Raises :class:`PlanNotFoundError` when no plan
    exists for that shape and :class:`StalePlanError` when its episodes fingerprint differs from
    the dataset's (checked when ``check_fresh``: this reads the episodes metadata).
    """
    ds = root if isinstance(root, Dataset) else None
    if ds is not None:
        fs, base, label = ds.fs, ds.path, ds.root
    else:
        fs, base = resolve_root(root)
        label = str(root)
    path = posixpath.join(base.rstrip("/") or "/", plan_path(world_size, num_workers))
    if not fs.exists(path):
        raise PlanNotFoundError(
            f"{path}: no shard plan for world size {world_size} x {num_workers} workers; "
            f"create it with: {fix_hint(label, world_size, num_workers)}"
        )
    plan = read_plan_file(fs, path)
    if check_fresh:
        if ds is None:
            ds = open_dataset(str(root), check_files=False, check_totals=False)
        if plan.fingerprint != ds.fingerprint:
            raise StalePlanError(
                f"{path}: stale shard plan: computed for episodes fingerprint {plan.fingerprint}, "
                f"the dataset now has {ds.fingerprint}; recompute it with: "
                f"{fix_hint(label, world_size, num_workers)} --force"
            )
    return plan
