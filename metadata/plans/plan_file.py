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
import math
import posixpath
import zlib
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset, DatasetError, open_dataset, resolve_root
from episodekit.core.paths import PLAN_DIR
from episodekit.core.words import plural

PLAN_FORMAT = "episodekit.shard_plan"
PLAN_VERSION = 1
POLICIES = ("trim", "wrap")
JSON_ITEMS_MAX = 100_000  # above this many items, columns are stored compressed (base64)
ITEM_COLUMNS = ("episode_index", "start", "end")
SOURCE_COLUMN = "source"  # mixture plans only: the item's source (position in "sources")


class PlanError(DatasetError):
    """A shard plan that cannot be used; the message names the file and the fix."""


class PlanNotFoundError(PlanError):
    """No plan exists for this (world size, workers) shape."""


class StalePlanError(PlanError):
    """The plan was computed from other episodes than the dataset now has (fingerprint differs)."""


@dataclass(frozen=True)
class PlanHeader:
    """The parameters that decide a plan, typed: what a builder records in the document
    (:func:`~episodekit.metadata.plans.build.plan_document`), what :class:`Plan` exposes, and
    what a freshness check compares (:meth:`fresh_for`). Read from a document by :meth:`of`,
    once, with the defaults of older plans (``locality`` none)."""

    world_size: int
    num_workers: int
    algo: str = "auto"
    cost_model: str = "frames"
    seed: int = 0
    split_long: bool = False
    policy: str = "trim"
    locality: str = "none"
    fingerprint: str | None = ""
    costs_digest: str | None = None
    excluded_digest: str | None = None  # the exclusion's digest (None: nothing excluded)
    canonical_bins: int | None = None  # canonical plans only

    @classmethod
    def of(cls, doc: dict) -> PlanHeader:
        """The header of a plan document (decoded, or as a builder returned it)."""
        c = doc.get("canonical_bins")
        return cls(
            world_size=int(doc["world_size"]),
            num_workers=int(doc["num_workers"]),
            algo=doc.get("algo", "auto"),
            cost_model=doc.get("cost_model", "frames"),
            seed=int(doc.get("seed", 0)),
            split_long=bool(doc.get("split_long")),
            policy=doc.get("policy", "trim"),
            locality=doc.get("locality", "none"),  # older plans: none
            fingerprint=doc.get("fingerprint"),
            costs_digest=doc.get("costs_digest"),
            excluded_digest=(doc.get("excluded") or {}).get("digest"),
            canonical_bins=c if isinstance(c, int) and not isinstance(c, bool) else None,
        )

    def fresh_for(self, wanted: PlanHeader, splits: tuple[bool, ...] | list[bool]) -> bool:
        """Whether a stored plan with this header answers ``wanted``: every parameter equal,
        and episodes cut or not as one of ``splits`` allows (``split_long="auto"``: either)."""
        same = replace(self, split_long=False) == replace(wanted, split_long=False)
        return same and self.split_long in splits


def plan_path(world_size: int, num_workers: int) -> str:
    """Relative path (from the dataset root) of the plan for one shape."""
    return f"{PLAN_DIR}/ws{int(world_size)}_nw{int(num_workers)}.json"


def fix_hint(root: str, world_size: int, num_workers: int) -> str:
    """The command that writes the plan for this shape (its default ``--split-long auto`` cuts
    episodes where whole ones cannot give every bin a frame)."""
    return f"episodekit metadata plan {root} --world-size {world_size} --workers {num_workers}"


def plan_flags(doc: dict) -> str:
    """The plan's non-default `metadata plan` options, so the rerun hint rebuilds the same kind
    of plan (not, say, a `rowgroup` plan where the user asked for `--locality none`)."""
    h = PlanHeader.of(doc)  # older plans: locality none
    flags = ""
    for flag, value, default in (("--cost", h.cost_model, "frames"), ("--algo", h.algo, "auto"),
                                 ("--policy", h.policy, "trim"),
                                 ("--locality", h.locality, "rowgroup"),
                                 ("--seed", h.seed, 0)):  # fmt: skip
        if value != default:
            flags += f" {flag} {value}"
    return flags + (" --split-long yes" if h.split_long else "")


def _encode_column(values: np.ndarray, compressed: bool) -> Any:
    values = np.ascontiguousarray(values, dtype="<i8")
    if not compressed:
        return values.tolist()
    return base64.b64encode(zlib.compress(values.tobytes(), 1)).decode("ascii")


def _decode_column(value: Any, n: int, where: str) -> np.ndarray:
    if isinstance(value, str):
        out = np.frombuffer(_inflate(base64.b64decode(value), 8 * n, where), dtype="<i8")
    else:
        if not isinstance(value, list) or len(value) != n:  # before numpy allocates anything
            got = len(value) if isinstance(value, list) else type(value).__name__
            raise PlanError(f"{where}: an item column has {got} values, expected {n}")
        out = np.asarray(value, dtype=np.int64)
    if len(out) != n:
        raise PlanError(f"{where}: an item column has {len(out)} values, expected {n}")
    return out.astype(np.int64, copy=False)


def encode_plan(plan: dict) -> bytes:
    """The plan file's bytes: sorted keys, no timestamps, so equal plans give equal bytes.

    A mixture plan (``item_source`` present) stores a fourth item column, ``source``."""
    items = np.asarray(plan["items"], dtype=np.int64).reshape(-1, 3)
    compressed = len(items) > JSON_ITEMS_MAX
    doc = {k: v for k, v in plan.items() if k not in ("items", "path", "item_source")}
    for k in ("bin_offsets", "bin_cost", "bin_frames"):
        doc[k] = np.asarray(doc[k]).tolist()
    columns = [items[:, j] for j in range(len(ITEM_COLUMNS))]
    names = list(ITEM_COLUMNS)
    if "item_source" in plan:
        columns.append(np.asarray(plan["item_source"], dtype=np.int64))
        names.append(SOURCE_COLUMN)
        doc["bin_draws"] = np.asarray(doc["bin_draws"]).tolist()
    doc["items"] = {
        "encoding": "zlib-base64-int64le" if compressed else "json",
        "count": len(items),
        "digest": items_digest(columns),
        **{c: _encode_column(col, compressed) for c, col in zip(names, columns)},
    }
    return (json.dumps(doc, sort_keys=True, separators=(",", ":")) + "\n").encode()


def decode_plan(raw: bytes, where: str = "plan", max_items: int | None = None) -> dict:
    """Inverse of :func:`encode_plan`: header values plus numpy ``items`` (n, 3) and bin arrays.

    The file is untrusted input: header fields are type-checked, the item count is bounded
    (``max_items``: e.g. the dataset's frame count) before anything is allocated or inflated,
    and the items must match their recorded digest. Every failure is a :class:`PlanError` naming
    the file and the field."""
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
    _check_header(doc, where)
    try:
        cols = doc.pop("items")
        n = _item_count(cols, where, max_items)
        names = ITEM_COLUMNS + ((SOURCE_COLUMN,) if "sources" in doc else ())
        decoded = [_decode_column(cols[c], n, where) for c in names]
        check_items_digest(cols, decoded, where)
        items = np.stack(decoded[:3], axis=1) if n else np.empty((0, 3), dtype=np.int64)
        doc["items"] = items
        if "sources" in doc:  # a mixture plan (see metadata/mixture/plan_file.py)
            doc["item_source"] = decoded[3]
        doc["bin_offsets"] = np.asarray(doc["bin_offsets"], dtype=np.int64)
        doc["bin_cost"] = np.asarray(doc["bin_cost"], dtype=np.float64)
        doc["bin_frames"] = np.asarray(doc["bin_frames"], dtype=np.int64)
    except KeyError as exc:
        raise PlanError(f"{where}: malformed plan file: field {exc} is missing") from exc
    except (TypeError, ValueError, zlib.error) as exc:
        raise PlanError(f"{where}: malformed plan file ({exc!r})") from exc
    if len(doc["bin_offsets"]) != doc["num_bins"] + 1 or doc["bin_offsets"][-1] != n:
        raise PlanError(f"{where}: bin_offsets do not match the items")
    return doc


# ---------------------------------------------------------------------------------------------
# Untrusted plan files (trust): item digest, bounded counts and inflation, typed header fields.

MAX_PLAN_ITEMS = 1 << 26  # without the dataset at hand: no plan of ours comes near this
MAX_PLAN_BYTES = 1 << 30
_HEADER = {  # field -> accepted type (bool is not an int here)
    "world_size": int,
    "num_workers": int,
    "num_bins": int,
    "seed": int,
    "samples_per_worker": int,
    "samples_per_rank": int,
    "dropped_frames": int,
    "repeated_frames": int,
    "fingerprint": str,
    "algo": str,
    "cost_model": str,
    "policy": str,
    "split_long": bool,
    "balance": dict,
    "bin_offsets": list,
    "bin_cost": list,
    "bin_frames": list,
    "items": dict,
}


def items_digest(columns: list[np.ndarray]) -> str:
    """Digest of a plan's item columns (episode_index, start, end), recorded in the file and
    checked on load, so items edited behind an unchanged fingerprint are refused."""
    import hashlib

    h = hashlib.sha256(b"episodekit-plan-items-v1\0")
    for col in columns:
        h.update(np.ascontiguousarray(col, dtype="<i8").tobytes())
    return h.hexdigest()[:32]


def check_items_digest(cols: dict, decoded: list[np.ndarray], where: str) -> None:
    recorded = cols.get("digest")
    if not isinstance(recorded, str):
        raise PlanError(f"{where}: items.digest is missing; recompute the plan with --force")
    if recorded != items_digest(decoded):
        raise PlanError(
            f"{where}: items.digest does not match the items (the plan was edited or damaged); "
            "recompute it with --force"
        )


def _check_header(doc: dict, where: str) -> None:
    for key, kind in _HEADER.items():
        if key not in doc:
            raise PlanError(f"{where}: malformed plan file: field {key!r} is missing")
        value = doc[key]
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if not ok:
            raise PlanError(
                f"{where}: field {key!r} must be {kind.__name__}, got {type(value).__name__}"
            )
        if kind is int and value < 0:
            raise PlanError(f"{where}: field {key!r} must be >= 0, got {value}")
    if doc["world_size"] < 1 or doc["num_workers"] < 1:
        raise PlanError(f"{where}: world_size and num_workers must be >= 1")
    if doc["num_bins"] != doc["world_size"] * doc["num_workers"]:
        raise PlanError(f"{where}: field 'num_bins' is not world_size x num_workers")
    if len(doc["bin_offsets"]) != doc["num_bins"] + 1:
        raise PlanError(f"{where}: field 'bin_offsets' does not have num_bins + 1 entries")
    for key in ("bin_cost", "bin_frames", "bin_offsets"):
        values = doc[key]
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in values
        ):
            raise PlanError(f"{where}: field {key!r} holds a non-number, NaN or infinity")


def _item_count(cols: Any, where: str, max_items: int | None) -> int:
    if not isinstance(cols, dict):
        raise PlanError(f"{where}: field 'items' must be an object")
    n = cols.get("count")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise PlanError(f"{where}: field 'items.count' must be an integer >= 0, got {n!r}")
    limit = MAX_PLAN_ITEMS if max_items is None else int(max_items)
    if n > limit:
        raise PlanError(
            f"{where}: field 'items.count' is {n}, more than the dataset can have ({limit})"
        )
    return n


def _inflate(data: bytes, size: int, where: str) -> bytes:
    """zlib-inflate at most ``size`` bytes (+1 to tell "too long"): a bomb costs nothing."""
    d = zlib.decompressobj()
    out = d.decompress(data, size + 1)
    if len(out) != size or d.unconsumed_tail:
        raise PlanError(f"{where}: an item column does not inflate to items.count values")
    return out


class Plan:
    """A shard plan: the items of every (rank, worker) bin and the per-epoch sample count."""

    def __init__(self, doc: dict, path: str | None = None):
        self.doc = doc
        self.path = path
        self.header = h = PlanHeader.of(doc)
        self.world_size: int = h.world_size
        self.num_workers: int = h.num_workers
        self.num_bins: int = int(doc["num_bins"])
        self.fingerprint: str = doc["fingerprint"]
        self.algo: str = h.algo
        self.cost_model: str = h.cost_model
        self.seed: int = h.seed
        self.split_long: bool = h.split_long
        self.policy: str = h.policy
        self.samples_per_worker: int = int(doc["samples_per_worker"])
        self.samples_per_rank: int = int(doc["samples_per_rank"])
        self.dropped_frames: int = int(doc["dropped_frames"])
        self.repeated_frames: int = int(doc["repeated_frames"])
        self.balance: dict = doc["balance"]
        self.items: np.ndarray = doc["items"]  # (n, 3) int64, sorted by bin, episode, start
        self.bin_offsets: np.ndarray = doc["bin_offsets"]
        self.locality: str = h.locality
        # mixture plans: the source of each item (None for a single root)
        self.item_source: np.ndarray | None = doc.get("item_source")
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
            if self.item_source is not None:  # mixture: sources and draws decide the order too
                h.update(np.ascontiguousarray(self.item_source, dtype="<i8").tobytes())
                h.update(json.dumps(self.doc["bin_draws"], sort_keys=True).encode())
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
                f"{self.world_size} x {plural(self.num_workers, 'worker')}"
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


def read_plan_file(fs, path: str, max_items: int | None = None) -> Plan:
    """Read and decode one plan file (no freshness check; at most ``max_items`` items)."""
    with fs.open(path, "rb") as fh:
        raw = fh.read(MAX_PLAN_BYTES + 1)
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError(f"{path}: larger than any plan can be ({MAX_PLAN_BYTES} bytes)")
    return Plan(decode_plan(raw, path, max_items), path)


def plan_root(root: str | Any) -> tuple[Dataset | None, Any, str, str]:
    """Where a root's plans live: ``(dataset or None, filesystem, base path, label for
    messages)`` of an opened ``Dataset`` or a path/URL."""
    if isinstance(root, Dataset):
        return root, root.fs, root.path, root.root
    fs, base = resolve_root(root)
    return None, fs, base, str(root)


def load_root_plan(
    root: str | Any, world_size: int, num_workers: int, check_fresh: bool = True
) -> Plan:
    """The plan for ``world_size`` ranks x ``num_workers`` workers under a dataset root
    (mixture plan folders: :func:`episodekit.metadata.plans.load.load_plan`).

    ``root`` is a path/URL or an opened ``Dataset``. Raises :class:`PlanNotFoundError` when no plan
    exists for that shape and :class:`StalePlanError` when its episodes fingerprint differs from
    the dataset's (checked when ``check_fresh``: this reads the episodes metadata).
    """
    ds, fs, base, label = plan_root(root)
    path = posixpath.join(base.rstrip("/") or "/", plan_path(world_size, num_workers))
    if not fs.exists(path):
        raise PlanNotFoundError(
            f"{path}: no shard plan for world size {world_size} x "
            f"{plural(num_workers, 'worker')}; "
            f"create it with: "
            f"{fix_hint(label, world_size, num_workers)}"
        )
    if check_fresh and ds is None:
        ds = open_dataset(str(root), check_files=False, check_totals=False)
    # Every item is a non-empty frame range: no plan has more items than frames.
    plan = read_plan_file(fs, path, max_items=ds.num_frames if ds is not None else None)
    if check_fresh:
        if plan.fingerprint != ds.fingerprint:
            raise StalePlanError(
                f"{path}: stale shard plan: computed for episodes fingerprint {plan.fingerprint}, "
                f"the dataset now has {ds.fingerprint}; recompute it with: "
                f"{fix_hint(label, world_size, num_workers)}{plan_flags(plan.doc)} --force"
            )
    return plan


def is_mixture_dir(fs, path: str) -> bool:
    """A folder written by ``metadata plan --mixture --out DIR`` (not a dataset root)."""
    base = path.rstrip("/") or "/"
    return fs.exists(posixpath.join(base, "mixture.json")) and not fs.exists(
        posixpath.join(base, "meta", "info.json")
    )
