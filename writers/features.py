"""Features an edit adds or renames: ``--add-feature NAME --from FILE`` and
``--rename-feature OLD=NEW``.

An added feature's values come from a file keyed by the source's ``episode_index`` and
``frame_index``: parquet or jsonl (columns ``episode_index``, ``frame_index`` and ``NAME`` or
``value``), or npy (a structured array with those fields, or a 2-D numeric array whose first two
columns are the keys). One value per frame: a number (declared shape ``[1]``, stored as a plain
column as LeRobot stores ``next.reward``) or a fixed-length vector (shape ``[D]``, D >= 1, a
``fixed_size_list`` column as ``action``); the dtype is the values' (float32, float64, int64,
int32 or bool).

The file is checked like the data, before anything is written (ValueError naming the option,
the file and the first row at fault; the CLI's exit 2: the file is part of the command line):

- keys are two integers each, looked up exactly: a key is the frame's position in the source
  (its episode's first frame plus ``frame_index``, after checking ``frame_index`` < the
  episode's length), never one number packed from both that two keys could share. A key that
  names no frame of the source, or a frame given twice, is refused;
- values are numbers or bools, every frame's of one length (at least 1), no nulls; NaN and
  infinity are refused unless ``allow_nan`` (``--allow-nan``: written as given);
- every frame the edit keeps has exactly one value; values of frames the edit drops (whole
  episodes, or frames cut by ``--drop-frames`` and the like) are ignored, so a file made for
  the whole source serves any edit of it.

The feature is declared in ``info.json`` and in the data files' ``huggingface`` schema metadata,
and its stats are computed. A renamed feature (a data column; video keys are not renamed) keeps
its values, stats and declaration under the new name. Names LeRobot gives a meaning of its own
(:data:`RESERVED`, and ``*_is_pad``) are refused as new names, as are renames that contradict
each other or ``--remove-feature``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset
from episodekit.core.errors import DatasetError
from episodekit.core.words import plural

PROTECTED = ("index", "episode_index", "frame_index", "timestamp", "task_index")
# names a LeRobot sample or dataset already uses: PROTECTED (its DEFAULT_FEATURES), the task
# string each sample carries, MultiLeRobotDataset's index, lerobot-annotate's language columns
RESERVED = (*PROTECTED, "task", "dataset_index", "language_persistent", "language_events")
PAD_SUFFIX = "_is_pad"  # LeRobot's padding mask of a delta-timestamps key
DTYPES = {"float32", "float64", "int64", "int32", "bool"}
MAX_KEY = 2**62  # a larger episode or frame index names nothing (and overflows int64 maths)


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a new feature's name (None: it can)."""
    if not name or name != name.strip() or "/" in name:
        return f"{name!r} is not a valid feature name (no '/', no leading or trailing space)"
    if name in RESERVED or name.endswith(PAD_SUFFIX):
        return (
            f"{name!r} is a name LeRobot reserves ({', '.join(RESERVED)}, *{PAD_SUFFIX}); "
            "choose another"
        )
    return None


@dataclass(frozen=True)
class FrameKeys:
    """The source's frames in one numbering: frame ``f`` of episode row ``p`` is ``starts[p] +
    f`` (0..total-1), exact and unique because ``f < lengths[p]`` is checked first."""

    episodes: np.ndarray  # episode_index per row, sorted
    lengths: np.ndarray
    starts: np.ndarray
    root: str

    @classmethod
    def of(cls, ds: Dataset) -> FrameKeys:
        lengths = ds.column("length").astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        return cls(ds.column("episode_index").astype(np.int64), lengths, starts, ds.root)

    @property
    def total(self) -> int:
        return int(self.lengths.sum())

    def ordinals(self, ep: np.ndarray, fi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(position, bad)`` of frames ``(ep, fi)`` (int64): ``bad`` where no such frame."""
        if not len(self.episodes):
            return np.zeros(len(ep), np.int64), np.ones(len(ep), bool)
        pos = np.clip(np.searchsorted(self.episodes, ep), 0, len(self.episodes) - 1)
        bad = (self.episodes[pos] != ep) | (fi < 0) | (fi >= self.lengths[pos])
        return np.where(bad, 0, self.starts[pos] + fi), bad

    def frame(self, ordinal: int) -> tuple[int, int]:
        """``(episode_index, frame_index)`` of a position."""
        p = int(np.searchsorted(self.starts, ordinal, side="right")) - 1
        return int(self.episodes[p]), int(ordinal - self.starts[p])


@dataclass
class AddedFeature:
    """One feature's values, one row per frame, sorted by the frame's position in the source
    (:class:`FrameKeys`)."""

    name: str
    keys: np.ndarray  # int64 positions, sorted, unique
    values: np.ndarray  # (n,) or (n, D), D >= 1
    source: str
    frames: FrameKeys
    nonfinite: int = 0  # NaN/inf values among the kept frames' (set by FeatureChanges.require)

    @property
    def where(self) -> str:
        return f"--add-feature {self.name} --from {self.source}"

    @property
    def dtype(self) -> str:
        return str(self.values.dtype)

    @property
    def shape(self) -> list[int]:
        return [1] if self.values.ndim == 1 else [int(self.values.shape[1])]

    def arrow_type(self) -> pa.DataType:
        item = pa.from_numpy_dtype(self.values.dtype)
        # parquet reads fixed-size lists back with the child named "element" (as LeRobot's)
        return item if self.values.ndim == 1 else pa.list_(pa.field("element", item), self.shape[0])

    def hf_feature(self) -> dict:
        value = {"dtype": self.dtype, "_type": "Value"}
        if self.values.ndim == 1:
            return value
        return {"feature": value, "length": self.shape[0], "_type": "List"}

    def require(self, need: np.ndarray, allow_nan: bool) -> None:
        """Every frame ``need`` marks (a bool per source frame: the frames the edit keeps) has a
        value, finite unless ``allow_nan``; ValueError naming the first frame at fault."""
        has = np.zeros(len(need), dtype=bool)
        has[self.keys] = True
        missing = np.flatnonzero(need & ~has)
        if len(missing):
            e, f = self.frames.frame(int(missing[0]))
            more = f", nor for {plural(len(missing) - 1, 'other')}" if len(missing) > 1 else ""
            raise ValueError(
                f"--add-feature {self.name}: {self.source} has no value for episode {e} frame "
                f"{f} (every kept frame needs one){more}"
            )
        if self.values.dtype.kind != "f":
            return
        finite = np.isfinite(self.values)
        bad = ~(finite if finite.ndim == 1 else finite.all(axis=1)) & need[self.keys]
        self.nonfinite = int(np.count_nonzero(bad))
        if self.nonfinite and not allow_nan:
            i = int(np.flatnonzero(bad)[0])
            e, f = self.frames.frame(int(self.keys[i]))
            what = "a NaN" if np.isnan(self.values[i]).any() else "an infinite"
            raise ValueError(
                f"{self.where}: episode {e} frame {f} has {what} value ("
                f"{plural(self.nonfinite, 'kept frame')} with NaN or inf; give --allow-nan to "
                "write them as they are)"
            )

    def column(
        self, episodes: np.ndarray, frames: np.ndarray, path: str, need: np.ndarray | None = None
    ) -> pa.Array:
        """The values of source rows ``(episodes, frames)`` as a column; ``need``: the rows
        that are written (the others get a placeholder: the caller drops them)."""
        pos, bad = self.frames.ordinals(episodes.astype(np.int64), frames.astype(np.int64))
        if bad.any():  # a data row outside its episode: the source contradicts its table
            i = int(np.flatnonzero(bad)[0])
            raise DatasetError(
                f"episode {int(episodes[i])} frame {int(frames[i])} is not a frame of its "
                "episodes table",
                path,
            )
        at = np.clip(np.searchsorted(self.keys, pos), 0, max(len(self.keys) - 1, 0))
        hit = self.keys[at] == pos if len(self.keys) else np.zeros(len(pos), bool)
        missing = ~hit if need is None else ~hit & need
        if missing.any():  # require() said otherwise: never a silent placeholder
            i = int(np.flatnonzero(missing)[0])
            raise ValueError(
                f"--add-feature {self.name}: {self.source} has no value for episode "
                f"{int(episodes[i])} frame {int(frames[i])} (every kept frame needs one)"
            )
        v = self.values[at] if len(self.keys) else np.zeros((len(pos), *self.values.shape[1:]),
                                                            self.values.dtype)  # fmt: skip
        if v.ndim == 1:
            return pa.array(v)
        return pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), type=self.arrow_type())


def _numeric(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_)


def _read_arrays(path: Path, name: str, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(episode, frame, values) as the file holds them (ValueError naming ``where``)."""
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".parquet", ".jsonl", ".json"):
        raise ValueError(f"{where}: expected a .parquet, .jsonl or .npy file")
    try:
        if suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
        elif suffix == ".parquet":
            import fsspec

            from episodekit.core.dataset import read_parquet

            table = read_parquet(fsspec.filesystem("file"), str(path))
        else:
            import pyarrow.json as pj

            table = pj.read_json(path)
    except DatasetError as exc:  # read_parquet's, naming the file: told once
        text = str(exc)
        reason = text[len(f"{exc.path}: ") :] if text.startswith(f"{exc.path}: ") else text
        raise ValueError(f"{where}: {reason}") from None
    except (OSError, ValueError, EOFError, pa.ArrowException) as exc:
        raise ValueError(f"{where}: cannot read it as {suffix[1:]} ({exc})") from None
    if suffix == ".npy":
        return _npy_arrays(arr, name, where)
    value = name if name in table.column_names else "value"
    missing = {"episode_index", "frame_index", value} - set(table.column_names)
    if missing:
        raise ValueError(f"{where}: no column {sorted(missing)[0]!r} (have {table.column_names})")
    keys = []
    for k in ("episode_index", "frame_index"):
        col = table[k].combine_chunks()
        if col.null_count:
            raise ValueError(f"{where}: {col.null_count} rows have no {k}")
        if not _numeric(col.type) or pa.types.is_boolean(col.type):
            raise ValueError(f"{where}: {k} is {col.type}, not integers")
        keys.append(col.to_numpy(zero_copy_only=False))
    return keys[0], keys[1], _arrow_values(table[value].combine_chunks(), where)


def _arrow_values(col: pa.Array, where: str) -> np.ndarray:
    """A value column as (n,) or (n, D): numbers or bools, or lists of them of one length."""
    expect = "numbers or bools, or fixed-length lists of numbers"
    if col.null_count:
        raise ValueError(f"{where}: {col.null_count} frames have a null value")
    if (
        pa.types.is_list(col.type)
        or pa.types.is_large_list(col.type)
        or (pa.types.is_fixed_size_list(col.type))
    ):
        if not _numeric(col.type.value_type):
            raise ValueError(f"{where}: values of type {col.type} (expected {expect})")
        lengths = np.unique(pa.compute.list_value_length(col).to_numpy(zero_copy_only=False))
        if len(lengths) > 1:
            raise ValueError(
                f"{where}: every frame's value must have the same length (found lengths "
                f"{lengths[:5].tolist()})"
            )
        flat = pa.compute.list_flatten(col)
        if flat.null_count:
            raise ValueError(f"{where}: {flat.null_count} list elements are null")
        d = int(lengths[0]) if len(lengths) else 1
        return flat.to_numpy(zero_copy_only=False).reshape(len(col), d)
    if not _numeric(col.type):
        raise ValueError(f"{where}: values of type {col.type} (expected {expect})")
    return col.to_numpy(zero_copy_only=False)


def _npy_arrays(arr: np.ndarray, name: str, where: str) -> tuple:
    if arr.dtype.names:
        value = name if name in arr.dtype.names else "value"
        missing = {"episode_index", "frame_index", value} - set(arr.dtype.names)
        if missing:
            raise ValueError(f"{where}: no field {sorted(missing)[0]!r} in the array")
        return arr["episode_index"], arr["frame_index"], np.asarray(arr[value])
    if arr.ndim != 2 or arr.shape[1] < 3:
        raise ValueError(
            f"{where}: expected a structured array or rows [episode, frame, value...] "
            f"(got shape {list(arr.shape)})"
        )
    vals = arr[:, 2:] if arr.shape[1] > 3 else arr[:, 2]
    return arr[:, 0], arr[:, 1], vals


def _keys(arr: np.ndarray, what: str, where: str) -> np.ndarray:
    """An episode_index or frame_index column as int64: integers in 0..2**62 (a float column
    must hold whole numbers), else ValueError naming the first bad row."""
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"{where}: {what} is {arr.dtype}, not integers")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr)
        bad[~bad] = arr[~bad] != np.floor(arr[~bad])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{where}: row {i}: {what} {float(arr[i])} is not an integer")
    over = (arr < 0) | (arr > MAX_KEY)
    if over.any():
        i = int(np.flatnonzero(over)[0])
        value = int(arr[i]) if arr.dtype.kind in "iu" else float(arr[i])
        raise ValueError(f"{where}: row {i}: {what} {value} names no frame (0..2**62)")
    return arr.astype(np.int64)


def _values(vals: np.ndarray, where: str) -> np.ndarray:
    """Values as (n,) or (n, D >= 1) of one of :data:`DTYPES` (floats other than float32 as
    float64), else ValueError."""
    vals = np.asarray(vals)
    if vals.ndim not in (1, 2):
        raise ValueError(
            f"{where}: one number or one list of numbers per frame (got values of shape "
            f"{list(vals.shape[1:])} per frame)"
        )
    if vals.ndim == 2 and vals.shape[1] == 0:
        raise ValueError(f"{where}: every value is an empty list (a feature needs >= 1 number)")
    if vals.dtype.kind == "f" and vals.dtype != np.float32:
        vals = vals.astype(np.float64)
    if str(vals.dtype) not in DTYPES:
        raise ValueError(
            f"{where}: values of dtype {vals.dtype} (expected {', '.join(sorted(DTYPES))})"
        )
    return vals


def read_feature(ds: Dataset, name: str, path: str | Path) -> AddedFeature:
    """The values of feature ``name`` from ``path``, checked against ``ds`` (see the module
    docstring; which frames need one is :meth:`FeatureChanges.require`'s); ValueError naming
    the first problem."""
    path = Path(path)
    where = f"--add-feature {name} --from {path}"
    problem = name_problem(name)
    if problem:
        raise ValueError(f"{where}: {problem}")
    if name in ds.features:
        raise ValueError(f"{where}: {name!r} is already a feature of {ds.root}")
    if not path.is_file():
        raise ValueError(f"{where}: no such file")
    ep, fi, vals = _read_arrays(path, name, where)
    ep, fi = _keys(ep, "episode_index", where), _keys(fi, "frame_index", where)
    vals = _values(vals, where)
    frames = FrameKeys.of(ds)
    pos, bad = frames.ordinals(ep, fi)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{where}: row {i}: episode {int(ep[i])} frame {int(fi[i])} is not a frame of {ds.root}"
        )
    order = np.argsort(pos, kind="stable")
    pos, vals = pos[order], vals[order]
    dup = np.flatnonzero(pos[1:] == pos[:-1])
    if len(dup):
        e, f = frames.frame(int(pos[dup[0]]))
        raise ValueError(f"{where}: episode {e} frame {f} has two values")
    return AddedFeature(name, pos, vals, str(path), frames)


@dataclass
class FeatureChanges:
    """Added and renamed features, applied by the writer to each batch it reads, to the
    schema, to the features of ``info.json`` and to the episodes' stats columns."""

    added: list[AddedFeature] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # old -> new

    def __bool__(self) -> bool:
        return bool(self.added or self.renamed)

    def require(
        self, kept: np.ndarray, masks: dict[int, np.ndarray], allow_nan: bool = False
    ) -> None:
        """Every frame the edit keeps (episodes ``kept``, cut by ``masks``: episode -> kept-frame
        mask) has a value of every added feature, finite unless ``allow_nan``."""
        if not self.added:
            return
        frames = self.added[0].frames
        need = np.repeat(np.isin(frames.episodes, kept), frames.lengths)
        for e, mask in masks.items():
            p = int(np.searchsorted(frames.episodes, e))
            start = int(frames.starts[p])
            need[start : start + len(mask)] &= mask
        for a in self.added:
            a.require(need, allow_nan)

    def digest(self) -> str:
        """What the changes decide (for the rerun key): names, renames and every value."""
        import hashlib

        h = hashlib.sha256(b"episodekit-features-v2\0")
        h.update(json.dumps(sorted(self.renamed.items())).encode())
        for a in self.added:
            h.update(a.name.encode() + b"\0" + a.dtype.encode() + str(a.shape).encode())
            h.update(np.ascontiguousarray(a.keys).tobytes())
            h.update(np.ascontiguousarray(a.values).tobytes())
        return h.hexdigest()[:16]

    def read_names(self, names: list[str]) -> list[str]:
        """The source columns to read for output columns ``names``."""
        back = {v: k for k, v in self.renamed.items()}
        added = {a.name for a in self.added}
        return [back.get(n, n) for n in names if n not in added]

    def apply(
        self, batch: pa.RecordBatch, path: str, need: np.ndarray | None = None
    ) -> pa.RecordBatch:
        """A batch of source rows (source numbering) with the changes applied; ``need``: the
        rows that will be written (None: all), the only ones that must have added values."""
        names = [self.renamed.get(n, n) for n in batch.schema.names]
        cols = list(batch.columns)
        if self.added:
            ep = batch.column("episode_index").to_numpy()
            fi = batch.column("frame_index").to_numpy()
            for a in self.added:
                names.append(a.name)
                cols.append(a.column(ep, fi, path, need))
        return pa.RecordBatch.from_arrays(cols, names=names)

    def schema(self, schema: pa.Schema) -> pa.Schema:
        """The output data schema: renamed fields, added fields, ``huggingface`` metadata."""
        fields = [f.with_name(self.renamed.get(f.name, f.name)) for f in schema]
        fields += [pa.field(a.name, a.arrow_type()) for a in self.added]
        meta = dict(schema.metadata or {})
        raw = meta.get(b"huggingface")
        if raw:
            try:
                hf = json.loads(raw)
                feats = hf.get("info", {}).get("features", {})
                hf["info"]["features"] = {self.renamed.get(k, k): v for k, v in feats.items()}
                for a in self.added:
                    hf["info"]["features"][a.name] = a.hf_feature()
                meta[b"huggingface"] = json.dumps(hf).encode()
            except (ValueError, AttributeError, KeyError, TypeError):
                pass
        return pa.schema(fields, metadata=meta)

    def features(self, features: dict) -> dict:
        """The output features of ``info.json``."""
        out = {self.renamed.get(k, k): v for k, v in features.items()}
        for a in self.added:
            out[a.name] = {"dtype": a.dtype, "shape": a.shape, "names": None}
        return out

    def episodes(self, table: pa.Table) -> pa.Table:
        """The episodes table with renamed features' ``stats/<name>/*`` columns renamed."""
        names = []
        for n in table.column_names:
            parts = n.split("/")
            if len(parts) == 3 and parts[0] == "stats" and parts[1] in self.renamed:
                n = f"stats/{self.renamed[parts[1]]}/{parts[2]}"
            names.append(n)
        return table.rename_columns(names)

    def stats(self, stats: dict) -> dict:
        """A ``stats.json`` dict with renamed features' entries renamed."""
        return {self.renamed.get(k, k): v for k, v in stats.items()}


def check_renames(
    ds: Dataset, pairs: list[tuple[str, str]], removed: tuple[str, ...] | list[str] = ()
) -> dict[str, str]:
    """``--rename-feature`` pairs checked against ``ds`` and ``removed`` (``--remove-feature``);
    ValueError naming the first bad one."""
    out: dict[str, str] = {}
    for old, new in pairs:
        where = f"--rename-feature {old}={new}"
        if old not in ds.features:
            raise ValueError(f"{where}: no feature {old!r} (have {sorted(ds.features)})")
        if old in PROTECTED:
            raise ValueError(f"{where}: LeRobot datasets need that column under its name")
        if ds.features[old].get("dtype") in ("video", "image"):
            raise ValueError(f"{where}: image and video features are not renamed (yet)")
        if old in removed:
            raise ValueError(f"{where}: {old!r} is also given to --remove-feature")
        if old in out:
            raise ValueError(f"{where}: {old!r} is renamed twice (also to {out[old]!r})")
        problem = name_problem(new)
        if problem:
            raise ValueError(f"{where}: {problem}")
        if new in ds.features:
            raise ValueError(f"{where}: {new!r} is already a feature of {ds.root}")
        twin = [o for o, n in out.items() if n == new]
        if twin:
            raise ValueError(f"{where}: {twin[0]!r} is renamed to {new!r} too")
        out[old] = new
    return out


def feature_changes(
    ds: Dataset,
    add: list[tuple[str, str]],
    rename: list[tuple[str, str]],
    removed: tuple[str, ...] | list[str] = (),
) -> FeatureChanges:
    """The features an edit adds (``(name, file)``: values read and checked now) and renames
    (``(old, new)``), checked against ``ds``, ``removed`` and each other (ValueError naming the
    options)."""
    renamed = check_renames(ds, rename, removed)
    seen: set[str] = set()
    for name, _ in add:
        if name in seen:
            raise ValueError(f"--add-feature {name}: given twice (each new feature once)")
        if name in renamed.values():
            old = next(o for o, n in renamed.items() if n == name)
            raise ValueError(
                f"--add-feature {name}: also the new name of --rename-feature {old}={name}"
            )
        seen.add(name)
    return FeatureChanges([read_feature(ds, name, path) for name, path in add], renamed)
