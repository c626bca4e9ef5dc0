"""How each source's samples become a mixture's samples: :class:`FeatureMap` (the union of the
sources' features under the mixture's names, padding to ``pad_to`` with ``KEY_pad_mask``, dtype
promotion, ``source``/``source_index``) and :func:`assemble` (one batch from per-source parts,
arena rows gathered once)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset
from episodekit.loaders.reader import PoolRows
from episodekit.loaders.sharded import concat_batches
from episodekit.metadata.mixture.spec import MixtureError, MixtureSpec, renamed_features

SOURCE, SOURCE_INDEX = "source", "source_index"
PAD_MASK = "_pad_mask"


def _shape(feature: Mapping[str, Any]) -> tuple[int, ...]:
    shape = tuple(int(x) for x in feature.get("shape") or ())
    return () if shape in ((), (1,)) else shape


class FeatureMap:
    """How each source's samples become mixture samples (names, widths, dtypes)."""

    def __init__(self, spec: MixtureSpec, datasets: Sequence[Dataset]):
        self.names = spec.names
        self.rename: list[dict[str, str]] = []
        self.inverse: list[dict[str, str]] = []
        keys_of: list[dict[str, Mapping[str, Any]]] = []
        for i, ds in enumerate(datasets):
            ren = renamed_features(spec, i, ds.features)
            self.rename.append(ren)
            self.inverse.append({v: k for k, v in ren.items()})
            keys_of.append({ren[k]: f for k, f in ds.features.items()})
        self.drop = {k for k, o in spec.features.items() if o.get("drop")}
        self.pad_to = {k: int(o["pad_to"]) for k, o in spec.features.items() if "pad_to" in o}
        union: list[str] = []
        for keys in keys_of:
            union += [k for k in keys if k not in union and k not in self.drop]
        for key in list(self.pad_to) + [k for k in spec.features if k not in union]:
            if key not in union and key not in self.drop:
                raise MixtureError(f"{spec.where}: features.{key}: no source has {key!r}")
        self.keys = union
        self.video = set()
        self.dtype: dict[str, np.dtype] = {}
        self.width: dict[str, dict[int, int]] = {}
        for key in union:
            missing = [self.names[i] for i, keys in enumerate(keys_of) if key not in keys]
            if missing:
                has = [self.names[i] for i, keys in enumerate(keys_of) if key in keys]
                i = self.names.index(missing[0])
                raise MixtureError(
                    f"{spec.where}: source {missing[0]!r} has no feature {key!r} (sources "
                    f"{', '.join(repr(h) for h in has)} have it): map one of its features to it "
                    f"with sources[{i}].rename, or drop it with features.{key}.drop"
                )
            feats = [keys[key] for keys in keys_of]
            kinds = {f.get("dtype") for f in feats}
            if "video" in kinds:
                if kinds != {"video"}:
                    raise MixtureError(f"{spec.where}: feature {key!r} is a video in some "
                                       "sources only")  # fmt: skip
                self.video.add(key)
                continue
            try:
                self.dtype[key] = np.result_type(*[np.dtype(f.get("dtype")) for f in feats])
            except TypeError:
                continue  # images, strings: passed through as they come
            shapes = [_shape(f) for f in feats]
            if key in self.pad_to:
                n = self.pad_to[key]
                for name, shp in zip(self.names, shapes):
                    if len(shp) != 1 or shp[0] > n:
                        raise MixtureError(
                            f"{spec.where}: features.{key}.pad_to {n}: source {name!r} has "
                            f"shape {list(shp)} (pad_to takes vectors of at most {n} values)"
                        )
                self.width[key] = {i: shp[0] for i, shp in enumerate(shapes)}
            elif len(set(shapes)) > 1:
                desc = ", ".join(f"{n!r} {list(s)}" for n, s in zip(self.names, shapes))
                raise MixtureError(
                    f"{spec.where}: feature {key!r} has different shapes ({desc}): declare "
                    f"features.{key}.pad_to"
                )

    def source_deltas(
        self, s: int, delta_timestamps: Mapping[str, Sequence[float]] | None
    ) -> dict[str, list[float]]:
        """``delta_timestamps`` (mixture names) in source ``s``'s names."""
        out = {}
        for key, deltas in (delta_timestamps or {}).items():
            if key not in self.keys:
                raise ValueError(
                    f"delta_timestamps key {key!r} is not a feature of this mixture "
                    f"(features: {sorted(self.keys)})"
                )
            out[self.inverse[s][key]] = list(deltas)
        return out

    def convert(self, s: int, batch: Mapping[str, Any], n: int | None) -> dict[str, Any]:
        """Source ``s``'s batch (``n`` rows) or sample (``n`` None) in mixture form."""
        ren = self.rename[s]
        out: dict[str, Any] = {}
        for key, v in batch.items():
            base, suffix = (key[: -len("_is_pad")], "_is_pad") if key.endswith("_is_pad") else (
                key, ""
            )  # fmt: skip
            name = ren.get(base, base) if base in ren else key
            if suffix and base in ren:
                name = name + suffix
            if (name if not suffix else name[: -len(suffix)]) in self.drop:
                continue
            if not suffix and name in self.dtype and isinstance(v, np.ndarray | np.generic):
                v = np.asarray(v).astype(self.dtype[name], copy=False)
            if not suffix and name in self.width:
                width, n_to = self.width[name][s], self.pad_to[name]
                v = np.asarray(v)
                padded = np.zeros(v.shape[:-1] + (n_to,), dtype=v.dtype)
                padded[..., :width] = v
                v = padded
                mask = np.zeros(n_to, dtype=bool)
                mask[width:] = True
                out[name + PAD_MASK] = (
                    mask if n is None else np.broadcast_to(mask, (n, n_to)).copy()
                )
            out[name] = v
        if n is None:
            out[SOURCE], out[SOURCE_INDEX] = self.names[s], s
        else:
            out[SOURCE] = [self.names[s]] * n
            out[SOURCE_INDEX] = np.full(n, s, dtype=np.int64)
        return out


def assemble(parts: list[tuple[np.ndarray, dict[str, Any]]], n: int) -> dict[str, Any]:
    """One batch of ``n`` rows from per-source batches and the rows each one fills.

    Values that are :class:`PoolRows` of one arena array are gathered once for the whole batch
    (their indices interleaved); other values are scattered into the batch."""
    if len(parts) == 1 and np.array_equal(parts[0][0], np.arange(n)):
        return {k: values_of(v) for k, v in parts[0][1].items()}
    out: dict[str, Any] = {}
    first = parts[0][1]
    for key, v in first.items():
        values = [b[key] for _, b in parts]
        if isinstance(v, Mapping):
            out[key] = assemble([(rows, b[key]) for rows, b in parts], n)
        elif isinstance(v, PoolRows) and all(
            isinstance(x, PoolRows) and x.base is v.base for x in values
        ):
            index = np.empty((n,) + v.index.shape[1:], dtype=np.int64)
            for (rows, _), x in zip(parts, values):
                index[rows] = x.index
            out[key] = np.take(v.base, index, axis=0)
        elif isinstance(v, list):
            arr = np.empty(n, dtype=object)
            for (rows, _), x in zip(parts, values):
                arr[rows] = np.fromiter(x, dtype=object, count=len(x))  # (lists stay objects)
            out[key] = arr.tolist()
        else:
            values = [values_of(x) for x in values]
            arr = np.empty((n,) + np.shape(values[0])[1:], dtype=np.asarray(values[0]).dtype)
            for (rows, _), x in zip(parts, values):
                arr[rows] = x
            out[key] = arr
    return out


def values_of(v: Any) -> Any:
    """``v`` gathered if it is :class:`PoolRows`, else itself."""
    return v.values() if isinstance(v, PoolRows) else v


def join_parts(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """One source's consecutive batches as one (rows of one arena array stay unresolved)."""
    out: dict[str, Any] = {}
    for key, v in batches[0].items():
        values = [b[key] for b in batches]
        if isinstance(v, PoolRows) and all(
            isinstance(x, PoolRows) and x.base is v.base for x in values
        ):
            out[key] = PoolRows(v.base, np.concatenate([x.index for x in values]))
        else:
            out[key] = concat_batches([{key: values_of(x)} for x in values])[key]
    return out
