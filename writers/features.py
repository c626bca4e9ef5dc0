"""Features an edit adds or renames: ``--add-feature NAME --from FILE`` and
``--rename-feature OLD=NEW``.

An added feature's values come from a file keyed by the source's ``episode_index`` and
``frame_index``: parquet or jsonl (columns ``episode_index``, ``frame_index`` and ``NAME`` or
``value``), or npy (a structured array with those fields, or a 2-D numeric array whose first two
columns are the keys). One value per frame: a number (declared shape ``[1]``, stored as a plain
column as LeRobot stores ``next.reward``) or a fixed-length vector (shape ``[D]``, a
``fixed_size_list`` column as ``action``); the dtype is the values' (float32, float64, int64,
int32 or bool). Every kept frame must have exactly one value, and every key in the file must
name a frame of the source: anything else is one clear error. The feature is declared in
``info.json`` and in the data files' ``huggingface`` schema metadata, and its stats are computed.

A renamed feature (a data column; video keys are not renamed) keeps its values, stats and
declaration under the new name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from episodekit.core.dataset import Dataset

PROTECTED = ("index", "episode_index", "frame_index", "timestamp", "task_index")
DTYPES = {"float32", "float64", "int64", "int32", "bool"}


@dataclass
class AddedFeature:
    """One feature's values, sorted by key (``episode * 2**32 + frame``), one row per frame."""

    name: str
    keys: np.ndarray
    values: np.ndarray  # (n,) or (n, D)
    source: str

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

    def column(self, episodes: np.ndarray, frames: np.ndarray, where: str) -> pa.Array:
        """The values of frames ``(episodes, frames)`` (source numbering) as a column."""
        want = episodes.astype(np.int64) * (1 << 32) + frames.astype(np.int64)
        pos = np.clip(np.searchsorted(self.keys, want), 0, max(len(self.keys) - 1, 0))
        hit = self.keys[pos] == want if len(self.keys) else np.zeros(len(want), bool)
        if not hit.all():
            i = int(np.flatnonzero(~hit)[0])
            raise ValueError(
                f"--add-feature {self.name}: {self.source} has no value for episode "
                f"{int(episodes[i])} frame {int(frames[i])} (every kept frame needs one)"
            )
        v = self.values[pos]
        if v.ndim == 1:
            return pa.array(v)
        return pa.FixedSizeListArray.from_arrays(pa.array(v.ravel()), type=self.arrow_type())


def _table(path: Path, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(episode, frame, values) from a parquet, jsonl or npy file."""
    where = f"--add-feature {name} --from {path}"
    suffix = path.suffix.lower()
    if suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        if arr.dtype.names:
            value = name if name in arr.dtype.names else "value"
            missing = {"episode_index", "frame_index", value} - set(arr.dtype.names)
            if missing:
                raise ValueError(f"{where}: no field {sorted(missing)[0]!r} in the array")
            return arr["episode_index"], arr["frame_index"], np.asarray(arr[value])
        if arr.ndim != 2 or arr.shape[1] < 3:
            raise ValueError(
                f"{where}: expected a structured array or rows [episode, frame, value...]"
            )
        vals = arr[:, 2:] if arr.shape[1] > 3 else arr[:, 2]
        return arr[:, 0], arr[:, 1], vals
    if suffix == ".parquet":
        import fsspec

        from episodekit.core.dataset import read_parquet

        table = read_parquet(fsspec.filesystem("file"), str(path))
    elif suffix in (".jsonl", ".json"):
        import pyarrow.json as pj

        table = pj.read_json(path)
    else:
        raise ValueError(f"{where}: expected a .parquet, .jsonl or .npy file")
    value = name if name in table.column_names else "value"
    missing = {"episode_index", "frame_index", value} - set(table.column_names)
    if missing:
        raise ValueError(f"{where}: no column {sorted(missing)[0]!r} (have {table.column_names})")
    col = table[value].combine_chunks()
    if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type):
        lengths = set(pa.compute.list_value_length(col).to_pylist())
        if len(lengths) != 1 or col.null_count:
            raise ValueError(f"{where}: every frame's value must have the same length")
        flat = pa.compute.list_flatten(col).to_numpy(zero_copy_only=False)
        vals = flat.reshape(len(col), lengths.pop())
    else:
        if col.null_count:
            raise ValueError(f"{where}: {col.null_count} frames have a null value")
        vals = col.to_numpy(zero_copy_only=False)
    return table["episode_index"].to_numpy(), table["frame_index"].to_numpy(), vals


def read_feature(ds: Dataset, name: str, path: str | Path) -> AddedFeature:
    """The values of feature ``name`` from ``path``, checked against ``ds`` (see the module
    docstring); ValueError naming the first problem."""
    path = Path(path)
    where = f"--add-feature {name} --from {path}"
    if name in ds.features or name in PROTECTED or not name or "/" in name:
        raise ValueError(f"{where}: {name!r} is already a feature or not a valid name")
    if not path.is_file():
        raise ValueError(f"{where}: no such file")
    try:
        ep, fi, vals = _table(path, name)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ValueError(f"{where}: cannot read it ({exc})") from None
    vals = np.asarray(vals)
    if vals.dtype.kind == "f" and vals.dtype != np.float32:
        vals = vals.astype(np.float64)
    if str(vals.dtype) not in DTYPES:
        raise ValueError(f"{where}: values of dtype {vals.dtype} (expected numbers or bools)")
    if not (np.all(ep == np.round(ep)) and np.all(fi == np.round(fi))):
        raise ValueError(f"{where}: episode_index and frame_index must be integers")
    keys = ep.astype(np.int64) * (1 << 32) + fi.astype(np.int64)
    order = np.argsort(keys, kind="stable")
    keys, vals = keys[order], vals[order]
    dup = np.flatnonzero(keys[1:] == keys[:-1])
    if len(dup):
        k = int(keys[dup[0]])
        raise ValueError(f"{where}: episode {k >> 32} frame {k & 0xFFFFFFFF} has two values")
    # every key names a frame of the source
    eps, lengths = ds.column("episode_index"), ds.column("length")
    e, f = keys >> 32, keys & 0xFFFFFFFF
    pos = np.clip(np.searchsorted(eps, e), 0, len(eps) - 1)
    bad = (eps[pos] != e) | (f >= lengths[pos]) | (ep[order] < 0) | (fi[order] < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{where}: episode {int(ep[order][i])} frame {int(fi[order][i])} is not a frame of "
            f"{ds.root}"
        )
    return AddedFeature(name, keys, vals, str(path))


@dataclass
class FeatureChanges:
    """Added and renamed features, applied by the writer to each batch it reads, to the
    schema, to the features of ``info.json`` and to the episodes' stats columns."""

    added: list[AddedFeature] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)  # old -> new

    def __bool__(self) -> bool:
        return bool(self.added or self.renamed)

    def digest(self) -> str:
        """What the changes decide (for the rerun key): names, renames and every value."""
        import hashlib

        h = hashlib.sha256(b"episodekit-features-v1\0")
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

    def apply(self, batch: pa.RecordBatch, path: str) -> pa.RecordBatch:
        """A batch of source rows (source numbering) with the changes applied."""
        names = [self.renamed.get(n, n) for n in batch.schema.names]
        cols = list(batch.columns)
        if self.added:
            ep = batch.column("episode_index").to_numpy()
            fi = batch.column("frame_index").to_numpy()
            for a in self.added:
                names.append(a.name)
                cols.append(a.column(ep, fi, path))
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


def check_renames(ds: Dataset, pairs: list[tuple[str, str]]) -> dict[str, str]:
    """``--rename-feature`` pairs checked against ``ds`` (ValueError naming the first bad one)."""
    out: dict[str, str] = {}
    for old, new in pairs:
        where = f"--rename-feature {old}={new}"
        if old not in ds.features:
            raise ValueError(f"{where}: no feature {old!r} (have {sorted(ds.features)})")
        if old in PROTECTED or new in PROTECTED:
            raise ValueError(f"{where}: LeRobot datasets need that column under its name")
        if ds.features[old].get("dtype") in ("video", "image"):
            raise ValueError(f"{where}: image and video features are not renamed (yet)")
        if new in ds.features or new in out.values() or "/" in new:
            raise ValueError(f"{where}: {new!r} is already a feature or not a valid name")
        out[old] = new
    return out
