"""Mixtures: train on several LeRobot roots at once, each drawn with a weight.

A mixture spec (``mixture.json``, or the same JSON inline on the command line)::

    {
      "sources": [
        {"root": "/data/aloha", "weight": 2, "name": "aloha"},
        {"root": "hf://datasets/owner/pusht@v1", "weight": 1,
         "episodes": "0:500", "tasks": ["push the T"],
         "rename": {"observation.joints": "observation.state"}}
      ],
      "balance": "frames",          # none | frames | episodes
      "epoch_frames": 1000000,      # frames one epoch draws (default: the sources' frames)
      "overflow": "repeat",         # repeat | cap: a share larger than the source's frames
      "features": {"observation.state": {"pad_to": 32}, "observation.extra": {"drop": true}}
    }

Per source: ``root`` (local path, relative to the spec file, or ``hf://``), ``weight`` > 0,
optional ``name`` (default: the root's last path part), ``episodes`` (a list of episode indices
or a ``"start:stop"`` range), ``tasks`` (task strings or task indices: an episode is kept when
one of its tasks matches), ``rename`` (source feature -> mixture feature).

Arithmetic (exact, with fractions, so it can be checked by hand):
- effective weight ``e_i = w_i`` (``none``), ``w_i * frames_i`` (``frames``) or
  ``w_i * episodes_i`` (``episodes``: Octo's ``balance_weights``), over the selected episodes;
- the quota of source i for an epoch of ``N`` frames is ``N * e_i / sum(e)`` rounded by the
  largest-remainder method (ties: the earlier source), so the quotas sum to ``N`` exactly;
- ``overflow="repeat"``: a quota larger than the source's frames repeats its frames
  (``repeats = quota / frames``); ``"cap"``: such a quota is cut to the source's frames and the
  surplus is shared by the other sources by their weights (repeated until nothing exceeds).

Errors are :class:`MixtureError` (a :class:`DatasetError`, exit 1): one line naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from episodekit.core import interrupt
from episodekit.core.dataset import Dataset, DatasetError, open_dataset
from episodekit.core.errors import EnvironmentProblem
from episodekit.core.words import plural
from episodekit.metadata.mixture.errors import (
    MixtureError,
    MixtureFileError,
    MixtureSourceMissing,
)
from episodekit.metadata.mixture.quotas import (
    bin_draws,
    effective_weights,
    epoch_size,
    largest_remainder,
    quotas,
)

__all__ = [  # the arithmetic and the errors live in their own modules; imported from here too
    "MixtureError",
    "MixtureFileError",
    "MixtureSourceMissing",
    "bin_draws",
    "effective_weights",
    "epoch_size",
    "largest_remainder",
    "quotas",
]

BALANCES = ("none", "frames", "episodes")
OVERFLOWS = ("repeat", "cap")
MIXTURE_FILE = "mixture.json"
MIXTURE_FORMAT = "episodekit.mixture"
MIXTURE_VERSION = 1
_SOURCE_KEYS = {"root", "weight", "name", "episodes", "tasks", "rename"}
_TOP_KEYS = {"sources", "balance", "epoch_frames", "overflow", "features", "format", "version"}
_FEATURE_KEYS = {"pad_to", "drop"}
_MAX_SPEC_BYTES = 16 << 20  # a mixture file is a few KiB; never read a huge file whole


@dataclass
class SourceSpec:
    """One source of a mixture, as written in the spec."""

    root: str
    weight: Fraction
    name: str
    episodes: list[int] | tuple[int, int] | None = None
    tasks: list[str | int] | None = None
    rename: dict[str, str] = field(default_factory=dict)
    index: int | None = field(default=None, compare=False)  # position in ``sources`` (messages)

    def field_name(self, key: str) -> str:
        """How messages name one of its fields: ``sources[i].key``."""
        return f"sources[{'?' if self.index is None else self.index}].{key}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "root": self.root, "weight": _number(self.weight)}
        if self.episodes is not None:
            eps = self.episodes
            out["episodes"] = f"{eps[0]}:{eps[1]}" if isinstance(eps, tuple) else list(eps)
        if self.tasks is not None:
            out["tasks"] = list(self.tasks)
        if self.rename:
            out["rename"] = dict(sorted(self.rename.items()))
        return out


@dataclass
class MixtureSpec:
    """A parsed mixture: sources and the mixture-wide settings."""

    sources: list[SourceSpec]
    balance: str = "none"
    epoch_frames: int | None = None
    overflow: str = "repeat"
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    where: str = "mixture"

    def to_dict(self) -> dict[str, Any]:
        """The normalized spec (roots resolved): what a mixture plan records and hashes."""
        return {
            "format": MIXTURE_FORMAT,
            "version": MIXTURE_VERSION,
            "sources": [s.to_dict() for s in self.sources],
            "balance": self.balance,
            "epoch_frames": self.epoch_frames,
            "overflow": self.overflow,
            "features": {k: dict(sorted(v.items())) for k, v in sorted(self.features.items())},
        }

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.sources]


def _number(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def _fail(where: str, msg: str) -> MixtureError:
    return MixtureError(f"{where}: {msg}")


def _fraction(value: Any, where: str, what: str) -> Fraction:
    """A JSON number as an exact fraction (0.1 is 1/10: the decimal the user wrote)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, f"{what} must be a number > 0, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(where, f"{what} must be a finite number > 0, got {value!r}")
    out = Fraction(value) if isinstance(value, int) else Fraction(repr(value))
    if out <= 0:
        raise _fail(where, f"{what} must be a number > 0, got {value!r}")
    return out


def _episodes(value: Any, where: str, what: str) -> list[int] | tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, str):
        parts = value.split(":")
        try:
            lo, hi = (int(p) for p in parts)
        except ValueError:
            raise _fail(
                where, f"{what} must be a list of episode indices or 'start:stop', got {value!r}"
            ) from None
        if lo < 0 or hi <= lo:
            raise _fail(where, f"{what} range {value!r} is empty or negative")
        return (lo, hi)
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return sorted(set(value))
    raise _fail(
        where,
        f"{what} must be a non-empty list of episode indices >= 0 or 'start:stop', got {value!r}",
    )


def _source(obj: Any, i: int, where: str, base_dir: str | None) -> SourceSpec:
    what = f"sources[{i}]"
    if not isinstance(obj, dict):
        raise _fail(where, f"{what} must be an object with 'root' and 'weight', got {obj!r}")
    unknown = sorted(set(obj) - _SOURCE_KEYS)
    if unknown:
        raise _fail(
            where,
            f"{what}.{unknown[0]} is not a source field "
            f"(fields: {', '.join(sorted(_SOURCE_KEYS))})",
        )
    root = obj.get("root")
    if not isinstance(root, str) or not root.strip():
        raise _fail(where, f"{what}.root must be a path or URL, got {root!r}")
    if "://" not in root and base_dir is not None and not os.path.isabs(root):
        root = os.path.normpath(os.path.join(base_dir, root))
    if "weight" not in obj:
        raise _fail(where, f"{what}.weight is missing (a number > 0)")
    weight = _fraction(obj["weight"], where, f"{what}.weight")
    name = obj.get("name")
    if name is None:
        name = posixpath.basename(root.rstrip("/").split("@")[0]) or f"source{i}"
    if not isinstance(name, str) or not name or "/" in name:
        raise _fail(where, f"{what}.name must be a non-empty string without '/', got {name!r}")
    tasks = obj.get("tasks")
    if tasks is not None and not (
        isinstance(tasks, list)
        and tasks
        and all(isinstance(t, (str, int)) and not isinstance(t, bool) for t in tasks)
    ):
        raise _fail(
            where,
            f"{what}.tasks must be a non-empty list of task strings or indices, got {tasks!r}",
        )
    rename = obj.get("rename") or {}
    if not isinstance(rename, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in rename.items()
    ):
        raise _fail(where, f"{what}.rename must map source feature names to mixture names")
    return SourceSpec(
        root=root,
        weight=weight,
        name=name,
        episodes=_episodes(obj.get("episodes"), where, f"{what}.episodes"),
        tasks=tasks,
        rename=dict(rename),
        index=i,
    )


def renamed_features(spec: MixtureSpec, i: int, features: Any) -> dict[str, str]:
    """Source ``i``'s features -> their mixture names (``sources[i].rename`` applied). A rename
    of a feature the source lacks, or two features landing on one name (a rename onto a feature
    the source keeps), is a :class:`MixtureError` naming it, never a silent pick of one."""
    s = spec.sources[i]
    unknown = [k for k in s.rename if k not in features]
    if unknown:
        raise MixtureError(
            f"{spec.where}: source {s.name!r}: rename of {unknown[0]!r}, which is not a feature "
            f"of {s.root}"
        )
    ren = {k: s.rename.get(k, k) for k in features}
    seen: dict[str, str] = {}
    for k, v in ren.items():
        if v in seen:
            a, b = sorted((seen[v], k))
            raise MixtureError(
                f"{spec.where}: sources[{i}].rename maps {a!r} and {b!r} of source {s.name!r} "
                f"to one feature {v!r}: rename the other one too (to a new name, which "
                f"features.NAME.drop can drop)"
            )
        seen[v] = k
    return ren


def parse_mixture(value: str | os.PathLike | dict) -> MixtureSpec:
    """A mixture spec from a dict, inline JSON (a string starting with ``{``) or a JSON file
    (relative roots are taken from the file's folder; for inline JSON and dicts from the current
    directory, made absolute so a plan keeps working from any directory). Raises
    :class:`MixtureError`."""
    base_dir, where = os.getcwd(), "mixture"
    if isinstance(value, dict):
        doc = value
    else:
        text = os.fspath(value)
        if not text.strip():
            raise MixtureFileError("--mixture is empty: give a mixture.json path or inline JSON")
        if text.lstrip().startswith(("{", "[")):  # JSON, not a path (a list: the error below)
            where = "--mixture (inline JSON)"
            raw = text
        else:
            where = text
            try:
                with open(text, "rb") as fh:
                    data = fh.read(_MAX_SPEC_BYTES + 1)
            except FileNotFoundError:
                raise MixtureFileError(f"{where}: no such mixture file") from None
            except IsADirectoryError:
                inside = os.path.join(text, MIXTURE_FILE)
                hint = f": give {inside}" if os.path.isfile(inside) else ""
                raise MixtureFileError(
                    f"{where}: is a folder, not a mixture file (a .json){hint}"
                ) from None
            except OSError as exc:
                raise MixtureFileError(
                    f"{where}: cannot read the mixture file ({exc.strerror or exc})"
                ) from None
            base_dir = os.path.dirname(os.path.abspath(text))
            if len(data) > _MAX_SPEC_BYTES:
                raise _fail(where, f"larger than {_MAX_SPEC_BYTES >> 20} MiB: not a mixture spec")
            try:
                raw = data.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise _fail(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        try:
            doc = json.loads(raw)
        except ValueError as exc:
            raise _fail(where, f"not valid JSON ({exc})") from None
        except RecursionError:
            raise _fail(where, "not a mixture spec (JSON nested too deeply)") from None
    if not isinstance(doc, dict):
        raise _fail(where, "a mixture is a JSON object with a 'sources' list")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise _fail(
            where,
            f"{unknown[0]} is not a mixture field "
            f"(fields: {', '.join(sorted(_TOP_KEYS - {'format', 'version'}))})",
        )
    sources = doc.get("sources")
    if not isinstance(sources, list) or not sources:
        raise _fail(where, "sources must be a non-empty list of {root, weight} objects")
    specs = [_source(s, i, where, base_dir) for i, s in enumerate(sources)]
    names = [s.name for s in specs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise _fail(
            where,
            f"sources[{names.index(dup, names.index(dup) + 1)}].name {dup!r} is "
            "used twice: give each source its own name",
        )
    balance = doc.get("balance", "none")
    if balance not in BALANCES:
        raise _fail(where, f"balance must be one of {', '.join(BALANCES)}, got {balance!r}")
    overflow = doc.get("overflow", "repeat")
    if overflow not in OVERFLOWS:
        raise _fail(where, f"overflow must be one of {', '.join(OVERFLOWS)}, got {overflow!r}")
    epoch = doc.get("epoch_frames")
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1):
        raise _fail(where, f"epoch_frames must be an integer >= 1, got {epoch!r}")
    features = doc.get("features") or {}
    if not isinstance(features, dict):
        raise _fail(where, "features must map feature names to {pad_to: N} or {drop: true}")
    for key, opts in features.items():
        if not isinstance(opts, dict) or not opts or set(opts) - _FEATURE_KEYS:
            raise _fail(
                where, f"features.{key} must be {{'pad_to': N}} or {{'drop': true}}, got {opts!r}"
            )
        pad = opts.get("pad_to")
        if pad is not None and (not isinstance(pad, int) or isinstance(pad, bool) or pad < 1):
            raise _fail(where, f"features.{key}.pad_to must be an integer >= 1, got {pad!r}")
        if "drop" in opts and opts["drop"] is not True:
            raise _fail(where, f"features.{key}.drop must be true, got {opts['drop']!r}")
    return MixtureSpec(specs, balance, epoch, overflow, dict(features), where)


# ---------------------------------------------------------------------------------------------
# Sources on disk: the selected episodes of each root.


@dataclass
class ResolvedSource:
    """A source opened: its dataset and the selected episodes (sorted) with their lengths."""

    spec: SourceSpec
    ds: Dataset
    episode_index: np.ndarray
    length: np.ndarray

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def frames(self) -> int:
        return int(self.length.sum())

    @property
    def episodes(self) -> int:
        return len(self.episode_index)


def _index_list(values: np.ndarray, limit: int = 5) -> str:
    shown = ", ".join(str(int(v)) for v in values[:limit])
    return f"[{shown}{', ...' if len(values) > limit else ''}]"


def _index_span(values: np.ndarray) -> str:
    """``0..11`` for a contiguous set of indices, else the first few (a gap is possible)."""
    if len(values) == 0:
        return "none"
    lo, hi = int(values.min()), int(values.max())
    if hi - lo + 1 == len(values):
        return f"{lo}..{hi}"
    return f"{_index_list(np.sort(values))} ({len(values)} in {lo}..{hi})"


def _has_task(tasks: pa.ChunkedArray, names: set[str]) -> np.ndarray:
    """Per episode (a ``list<string>`` column): does one of its tasks lie in ``names``."""
    col = tasks.combine_chunks()
    hit = pc.is_in(pc.list_flatten(col), value_set=pa.array(sorted(names), pa.string()))
    out = np.zeros(len(col), dtype=bool)
    parents = pc.list_parent_indices(col).to_numpy()
    out[parents[hit.to_numpy(zero_copy_only=False)]] = True
    return out


def select_episodes(ds: Dataset, spec: SourceSpec, where: str = "mixture") -> np.ndarray:
    """Rows of ``ds.episodes`` the source keeps (its ``episodes`` and ``tasks`` filters).

    Every index a filter names must exist in the source: a list entry or a ``start:stop`` range
    beyond its episodes, or a task (string or index) it does not have, is a
    :class:`MixtureError` naming the field, the value and what the source holds (a silently
    shorter range would change the mixture's weights without a word)."""
    ep = ds.column("episode_index").astype(np.int64)
    keep = np.ones(len(ep), dtype=bool)
    label = f"source {spec.name!r}"
    holds = f"{spec.root} has {plural(len(ep), 'episode')}, indices {_index_span(ep)}"
    if spec.episodes is not None:
        what = spec.field_name("episodes")
        if isinstance(spec.episodes, tuple):
            lo, hi = spec.episodes
            if len(ep) == 0 or lo < int(ep.min()) or hi > int(ep.max()) + 1:
                raise _fail(where, f"{what}: range '{lo}:{hi}' goes beyond {label}: {holds}")
            keep &= (ep >= lo) & (ep < hi)
        else:
            wanted = np.asarray(spec.episodes, dtype=np.int64)
            missing = np.setdiff1d(wanted, ep)
            if len(missing):
                raise _fail(
                    where, f"{what}: episodes {_index_list(missing)} are not in {label}: {holds}"
                )
            keep &= np.isin(ep, wanted)
    if spec.tasks is not None:
        what = spec.field_name("tasks")
        task_ids = ds.tasks.column("task_index").to_numpy().astype(np.int64)
        task_names = ds.task_strings()
        n_tasks = plural(len(task_names), "task")
        known = f"({spec.root} has {n_tasks}, indices {_index_span(task_ids)})"
        names = {t for t in spec.tasks if isinstance(t, str)}
        ids = {t for t in spec.tasks if isinstance(t, int)}
        unknown = [t for t in spec.tasks if isinstance(t, str) and t not in set(task_names)]
        if unknown:
            raise _fail(where, f"{what}: task {unknown[0]!r} is not a task of {label} {known}")
        bad_ids = np.setdiff1d(np.asarray(sorted(ids), dtype=np.int64), task_ids)
        if len(bad_ids):
            raise _fail(
                where,
                f"{what}: task indices {_index_list(bad_ids)} are not tasks of {label} {known}",
            )
        # an index stands for its task string: either form matches any of an episode's tasks
        names |= {n for i, n in zip(task_ids.tolist(), task_names) if i in ids}
        keep &= _has_task(ds.episodes.column("tasks"), names)
    rows = np.flatnonzero(keep)
    if len(rows) == 0 or int(ds.column("length")[rows].sum()) == 0:
        raise _fail(
            where,
            f"{label}: its episodes/tasks filters select no frames of {spec.root} "
            "(no episode matches both, or the ones that do are empty)",
        )
    return rows


def _check_local_root(spec: MixtureSpec, s: SourceSpec) -> None:
    """A local source root that is missing, a file or not a dataset: one line naming
    ``sources[i].root`` (before opening it gives a message about meta/info.json)."""
    root = s.root[len("file://") :] if s.root.startswith("file://") else s.root
    if "://" in root:
        return
    what = f"{spec.where}: {s.field_name('root')} ({s.name!r})"
    if not os.path.exists(root):
        raise MixtureSourceMissing(f"{what}: {root}: no such folder")
    if not os.path.isdir(root):
        raise MixtureSourceMissing(f"{what}: {root}: is a file, not a dataset folder")
    if not os.path.exists(os.path.join(root, "meta", "info.json")):
        raise MixtureSourceMissing(f"{what}: {root}: not a LeRobot dataset (no meta/info.json)")


def resolve_sources(spec: MixtureSpec, check_files: bool = False) -> list[ResolvedSource]:
    """Open every source root and apply its filters (metadata only)."""
    out = []
    for s in spec.sources:
        _check_local_root(spec, s)
        try:
            ds = open_dataset(s.root, check_files=check_files, check_totals=False)
        except DatasetError as exc:
            raise MixtureError(f"{spec.where}: source {s.name!r}: {exc}") from exc
        except EnvironmentProblem as exc:
            raise EnvironmentProblem(
                f"{spec.where}: {s.field_name('root')} ({s.name!r}): {exc}"
            ) from exc
        except Exception as exc:
            interrupt.check()  # Ctrl-C that a library turned into an error
            if "://" not in s.root or s.root.startswith("file://"):
                raise
            # a remote source that cannot be opened (server unreachable, no such repository,
            # no access): name the source, which the bare network error does not
            raise EnvironmentProblem(
                f"{spec.where}: {s.field_name('root')} ({s.name!r}): cannot open {s.root} "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        rows = select_episodes(ds, s, spec.where)
        ep = ds.column("episode_index")[rows].astype(np.int64)
        out.append(ResolvedSource(s, ds, ep, ds.column("length")[rows].astype(np.int64)))
    _check_feature_keys(spec, out)
    return out


def _check_feature_keys(spec: MixtureSpec, sources: list[ResolvedSource]) -> None:
    """A ``features.KEY`` (pad_to/drop) must name a feature of some source, after ``rename``:
    a typo would otherwise leave the real feature unpadded or undropped without a word."""
    names = {s.spec.rename.get(k, k) for s in sources for k in s.ds.features}
    unknown = sorted(k for k in spec.features if k not in names)
    if unknown:
        raise MixtureError(
            f"{spec.where}: features.{unknown[0]} names no feature of any source (after "
            f"rename): the sources have {', '.join(sorted(names))}"
        )


def mixture_fingerprint(spec: MixtureSpec, fingerprints: list[str]) -> str:
    """Hash of the normalized spec and its sources' episodes fingerprints."""
    h = hashlib.sha256(b"episodekit-mixture-v1\0")
    h.update(json.dumps(spec.to_dict(), sort_keys=True).encode())
    for f in fingerprints:
        h.update(f.encode() + b"\0")
    return h.hexdigest()[:32]


def summarize(
    spec: MixtureSpec, frames: list[int], episodes: list[int], total: int | None = None
) -> dict[str, Any]:
    """Effective weights, per-epoch quotas and repeats (JSON-ready) for the given source sizes."""
    n = int(total if total is not None else (spec.epoch_frames or sum(frames)))
    eff = effective_weights([s.weight for s in spec.sources], frames, episodes, spec.balance)
    q = quotas(n, eff, frames, spec.overflow)
    return {
        "balance": spec.balance,
        "overflow": spec.overflow,
        "epoch_frames": n,
        "sources": [
            {
                "name": s.name,
                "root": s.root,
                "weight": _number(s.weight),
                "episodes": e,
                "frames": f,
                "effective_weight": float(w),
                "quota": qi,
                "share": qi / n if n else 0.0,
                "repeats": qi / f if f else 0.0,
            }
            for s, f, e, w, qi in zip(spec.sources, frames, episodes, eff, q)
        ],
    }


def describe_mixture(value: str | os.PathLike | dict) -> dict[str, Any]:
    """``episodekit info --mixture``: each source's frames, effective weight, quota, repeats."""
    spec = parse_mixture(value)
    sources = resolve_sources(spec)
    out = summarize(spec, [s.frames for s in sources], [s.episodes for s in sources])
    for row, s in zip(out["sources"], sources):
        row["fingerprint"] = s.ds.fingerprint
        row["fps"] = s.ds.fps
        row["total_episodes"] = s.ds.num_episodes
    out["mixture"] = spec.where
    out["fingerprint"] = mixture_fingerprint(spec, [s.ds.fingerprint for s in sources])
    return out


def format_mixture(d: dict[str, Any]) -> str:
    """Human-readable form of :func:`describe_mixture`."""
    lines = [
        f"mixture         {d['mixture']}",
        f"balance         {d['balance']}   overflow {d['overflow']}",
        f"epoch frames    {d['epoch_frames']:,}",
        f"fingerprint     {d['fingerprint']}",
        f"  {'source':<16} {'episodes':>9} {'frames':>12} {'weight':>8} {'effective':>10} "
        f"{'quota':>12} {'share':>7} {'repeats':>8}",
    ]
    for s in d["sources"]:
        lines.append(
            f"  {s['name'][:16]:<16} {s['episodes']:>9,} {s['frames']:>12,} {s['weight']:>8g} "
            f"{s['effective_weight']:>10.4f} {s['quota']:>12,} {s['share']:>7.4f} "
            f"{s['repeats']:>8.3f}"
        )
    for s in d["sources"]:
        lines.append(f"  {s['name']}: {s['root']}")
    return "\n".join(lines)
