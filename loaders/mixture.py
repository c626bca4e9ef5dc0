"""The runtime over a mixture: ``FrameDataset``, ``EpisodeAwareSampler`` and ``ShardedLoader`` on
several roots at once (issue 16). Built through the usual classes::

    plan = load_plan("mix-plan", world_size=8, num_workers=4)      # a mixture plan folder
    ds = FrameDataset(plan, delta_timestamps=...)                    # -> MixtureFrameDataset
    sampler = EpisodeAwareSampler(ds, plan=plan, rank=r, world_size=8)  # -> MixtureSampler
    loader = ShardedLoader("mix-plan", plan, rank=r, world_size=8)   # -> MixtureLoader

Samples carry ``source`` (the source's name) and ``source_index``. Features are the union of the
sources' features under the mixture's names (``sources[i].rename`` maps a source's feature to
one): every key must be in every source (or dropped with ``features.KEY.drop``). Vectors of
different widths need ``features.KEY.pad_to: N``: they are zero-padded on the last axis to N,
with ``KEY_pad_mask`` (N bools, True on the padded dimensions; like ``_is_pad``, True = padding).

Order (pure function of plan, seed, epoch): each bin draws exactly ``plan.bin_draws`` samples
per source; the bin's positions are mixed across sources by a keyed bijection; inside a source
its frames are drawn pass after pass (each pass a fresh order of the bin's frames of that source,
the last pass a prefix: a different subset each epoch when the quota is below the frames). The
loader streams each source's passes pool by pool, as :class:`ShardedLoader` does for one root
(``cache_mb`` bounds the decoded row groups of all sources together, shared as the rank draws
from them: a source's pool still holds at least one of its row groups).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset
from episodekit.core.paths import MIB
from episodekit.core.words import plural
from episodekit.core.world import fill_rank
from episodekit.loaders.arena import PoolArena
from episodekit.loaders.frames import DEFAULT_TOLERANCE_S, FrameDataset, int_indices
from episodekit.loaders.reader import DEFAULT_CACHE_MB, PoolRows
from episodekit.loaders.sampler import (
    FEISTEL_ROUNDS,
    EpisodeAwareSampler,
    EpochOrder,
    check_sampler_args,
    feistel_permute,
    items_to_ranges,
)
from episodekit.loaders.sharded import (
    READ_CHUNK,
    BinLayout,
    BinOrder,
    ShardedLoader,
    batch_row,
    check_run,
    concat_batches,
    row_bytes_estimate,
)
from episodekit.loaders.store import AUTO, find_store
from episodekit.metadata.mixture.plan_file import MixturePlan
from episodekit.metadata.mixture.spec import (
    MIXTURE_FILE,
    MixtureError,
    MixtureSpec,
    parse_mixture,
    renamed_features,
)
from episodekit.metadata.plans.plan_file import is_mixture_dir

SOURCE, SOURCE_INDEX = "source", "source_index"
BLOCK = 1 << 16  # positions whose order is computed at once
READ_ROWS = 2048  # positions read at once (batches are handed out from them)
PAD_MASK = "_pad_mask"


def looks_like_mixture(obj: Any) -> bool:
    """A mixture plan, spec, spec dict, inline JSON, ``*.json`` file or mixture plan folder."""
    if isinstance(obj, (MixturePlan, MixtureSpec, MixtureFrameDataset)):
        return True
    if isinstance(obj, dict):
        return "sources" in obj
    if isinstance(obj, (str, os.PathLike)) and not isinstance(obj, Dataset):
        text = os.fspath(obj)
        if text.lstrip().startswith("{") or text.endswith(".json"):
            return True
        if "://" not in text and os.path.isdir(text):
            import fsspec

            return is_mixture_dir(fsspec.filesystem("file"), os.path.abspath(text))
    return False


def open_mixture(obj: Any) -> tuple[MixtureSpec, list[Dataset]]:
    """The spec and the opened source datasets of a mixture given in any accepted form."""
    from episodekit.core.dataset import open_dataset

    if isinstance(obj, MixtureFrameDataset):
        return obj.spec, [f.ds for f in obj.datasets]
    if isinstance(obj, MixturePlan):
        spec = obj.spec
        if obj.datasets is not None:
            return spec, list(obj.datasets)
    elif isinstance(obj, MixtureSpec):
        spec = obj
    elif isinstance(obj, (str, os.PathLike)) and os.path.isdir(os.fspath(obj)):
        spec = parse_mixture(os.path.join(os.fspath(obj), MIXTURE_FILE))
    else:
        spec = parse_mixture(obj)
    datasets = []
    for s in spec.sources:
        try:
            datasets.append(open_dataset(s.root, check_files=False, check_totals=False))
        except Exception as exc:
            raise MixtureError(f"{spec.where}: source {s.name!r}: {exc}") from exc
    return spec, datasets


# ---------------------------------------------------------------------------------------------
# Features: the union under the mixture's names, padding and masks.


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
        return {k: _values(v) for k, v in parts[0][1].items()}
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
                arr[rows] = x
            out[key] = arr.tolist()
        else:
            values = [_values(x) for x in values]
            arr = np.empty((n,) + np.shape(values[0])[1:], dtype=np.asarray(values[0]).dtype)
            for (rows, _), x in zip(parts, values):
                arr[rows] = x
            out[key] = arr
    return out


def _values(v: Any) -> Any:
    """``v`` gathered if it is :class:`PoolRows`, else itself."""
    return v.values() if isinstance(v, PoolRows) else v


def _join(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """One source's consecutive batches as one (rows of one arena array stay unresolved)."""
    out: dict[str, Any] = {}
    for key, v in batches[0].items():
        values = [b[key] for b in batches]
        if isinstance(v, PoolRows) and all(
            isinstance(x, PoolRows) and x.base is v.base for x in values
        ):
            out[key] = PoolRows(v.base, np.concatenate([x.index for x in values]))
        else:
            out[key] = concat_batches([{key: _values(x)} for x in values])[key]
    return out


# ---------------------------------------------------------------------------------------------
# Map-style frames over all sources.


class MixtureFrameDataset:
    """Frames of every source's selected episodes, source after source (``FrameDataset`` on a
    mixture). ``ds[i]`` / ``get_batch`` like :class:`FrameDataset`, plus ``source`` and
    ``source_index``, with the mixture's feature names, padding and masks."""

    def __init__(
        self,
        mixture: Any,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        episodes: Any = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        speed: bool = True,
        **kwargs: Any,
    ):
        if episodes is not None:
            raise ValueError("a mixture selects episodes per source (sources[i].episodes/tasks)")
        from episodekit.metadata.mixture.spec import select_episodes

        self.spec, datasets = open_mixture(mixture)
        self.features = FeatureMap(self.spec, datasets)
        self.delta_timestamps = dict(delta_timestamps or {})
        self.datasets = [
            FrameDataset(
                ds,
                delta_timestamps=self.features.source_deltas(s, delta_timestamps),
                episodes=ds.column("episode_index")[select_episodes(ds, src, self.spec.where)],
                tolerance_s=tolerance_s,
                cache_mb=cache_mb,
                speed=speed,
                **kwargs,
            )
            for s, (src, ds) in enumerate(zip(self.spec.sources, datasets))
        ]
        self.source_names = self.spec.names
        sizes = [len(f) for f in self.datasets]
        self.source_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.source_offsets[-1])

    def __repr__(self) -> str:
        return f"MixtureFrameDataset(sources={self.source_names}, frames={len(self)})"

    def source_of(self, indices: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.source_offsets, indices, side="right") - 1

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        i = int(int_indices(np.asarray(i)).ravel()[0]) if not isinstance(i, int) else i
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"frame index {i} out of range for {plural(n, 'frame')}")
        s = int(self.source_of(np.array([i]))[0])
        item = self.datasets[s][i - int(self.source_offsets[s])]
        return self.features.convert(s, item, None)

    def get_batch(self, indices: np.ndarray | Sequence[int]) -> dict[str, Any]:
        idx = int_indices(indices).ravel()
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if len(idx) and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"frame index out of range for {plural(n, 'frame')}")
        src = self.source_of(idx)
        parts = []
        for s in np.unique(src).tolist():
            rows = np.flatnonzero(src == s)
            local = idx[rows] - self.source_offsets[s]
            parts.append(
                (rows, self.features.convert(s, self.datasets[s].get_batch(local), len(rows)))
            )
        if not parts:
            raise ValueError("get_batch needs at least one index")
        return assemble(parts, len(idx))


# ---------------------------------------------------------------------------------------------
# The draws of one bin: exact per-source counts, mixed positions, passes over each source.


def _derive(*values: int) -> int:
    """A 63-bit seed from integers (stable across machines)."""
    h = hashlib.sha256(b"episodekit-mixture-order\0")
    for v in values:
        h.update(int(v).to_bytes(16, "little", signed=True))
    return int.from_bytes(h.digest()[:8], "little") >> 1


class BinMix:
    """Which source each position of a bin's epoch draws from: a keyed bijection of
    ``[0, P)`` onto slots, slots ``[cum[s], cum[s+1])`` belonging to source ``s``."""

    def __init__(self, draws: np.ndarray, seed: int, epoch: int, bin_id: int, shuffle: bool = True):
        self.draws = np.asarray(draws, dtype=np.int64)
        self.cum = np.concatenate([[0], np.cumsum(self.draws)]).astype(np.int64)
        self.total = int(self.cum[-1])
        rng = np.random.default_rng([int(seed), int(epoch), int(bin_id), 0x4D4958])
        self.keys = (
            rng.integers(0, 2**63, size=FEISTEL_ROUNDS, dtype=np.uint64) if shuffle else None
        )

    def slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source, draw number inside the source) of positions."""
        p = np.asarray(positions, dtype=np.int64)
        q = feistel_permute(p, self.total, self.keys) if self.keys is not None else p
        s = np.searchsorted(self.cum, q, side="right") - 1
        return s, q - self.cum[s]


# ---------------------------------------------------------------------------------------------
# Sampler (map-style).


class MixtureSampler(EpisodeAwareSampler):
    """:class:`EpisodeAwareSampler` over a :class:`MixtureFrameDataset` with its mixture plan:
    rank ``r`` yields ``plan.samples_per_rank`` indices per epoch, each bin exactly its
    ``bin_draws`` per source; a pure function of (seed, epoch); resumable at any position.
    ``drop_n_first_frames``/``drop_n_last_frames`` (as LeRobot's sampler) are never drawn; the
    quotas stay exact, so the kept frames of a source are drawn a little more often."""

    def __init__(
        self,
        dataset: Any,
        seed: int = 0,
        shuffle: bool = True,
        drop_n_first_frames: int = 0,
        drop_n_last_frames: int = 0,
        plan: Any | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        if not isinstance(plan, MixturePlan):
            raise ValueError(
                "a mixture needs its mixture plan: EpisodeAwareSampler(ds, plan=load_plan(DIR, "
                "world_size, num_workers))"
            )
        rank, world_size = check_sampler_args(
            seed, drop_n_first_frames, drop_n_last_frames, rank, world_size, plan
        )
        if not isinstance(dataset, MixtureFrameDataset):
            dataset = MixtureFrameDataset(dataset)
        if dataset.source_names != plan.source_names:
            raise ValueError(
                f"dataset sources {dataset.source_names} differ from the plan's {plan.source_names}"
            )
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.rank, self.world_size, self.plan = int(rank), int(world_size), plan
        self.dataset = dataset
        K = plan.num_workers
        self.per_bin = int(plan.samples_per_worker)
        self.num_samples = self.per_bin * K
        self.natural = self.num_samples
        self._stride = 1
        # (bin, source) -> (base, size) in the mixture dataset's index space
        self._ranges: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for w in range(K):
            items, srcs = plan.bin_items(self.rank, w), plan.bin_sources(self.rank, w)
            for s, fd in enumerate(dataset.datasets):
                sel = items[srcs == s]
                base, size = items_to_ranges(
                    sel, fd.episode_index, fd.episode_lengths, fd.episode_starts,
                    drop_n_first_frames, drop_n_last_frames,
                )  # fmt: skip
                if not size.sum() and plan.bin_draws(self.rank, w)[s]:
                    raise ValueError(
                        f"drop_n_first_frames={drop_n_first_frames}, drop_n_last_frames="
                        f"{drop_n_last_frames} leave no frames of source {plan.source_names[s]!r} "
                        f"in bin (rank {self.rank}, worker {w}), which draws from it"
                    )
                self._ranges[(w, s)] = (base + dataset.source_offsets[s], size)
        self.epoch, self.position = 0, 0
        self._order = None
        self._orders: dict[tuple, EpochOrder] = {}
        self._order_epoch = -1
        self._identity = {
            "plan": plan.digest,
            "rank": self.rank,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
            "frames": self.num_samples,
        }
        if drop_n_first_frames or drop_n_last_frames:  # (states without drops stay valid)
            self._identity["drop"] = [int(drop_n_first_frames), int(drop_n_last_frames)]

    def _pass_order(self, epoch: int, w: int, s: int, p: int) -> EpochOrder:
        if self._order_epoch != epoch:
            self._orders, self._order_epoch = {}, epoch
        key = (w, s, p)
        if key not in self._orders:
            base, size = self._ranges[(w, s)]
            b = self.rank * self.plan.num_workers + w
            seed = _derive(self.seed, b, s, p)
            self._orders[key] = EpochOrder(base, size, seed, epoch, self.shuffle)
        return self._orders[key]

    def indices(self, epoch: int, positions: np.ndarray) -> np.ndarray:
        """Mixture dataset indices at ``positions`` (0..len-1) of ``epoch``."""
        p = np.asarray(positions, dtype=np.int64)
        if p.size and (p.min() < 0 or p.max() >= self.num_samples):
            raise IndexError(f"positions must be in [0, {self.num_samples})")
        if self.shuffle and self.num_samples > 1:
            rng = np.random.default_rng([self.seed, int(epoch), self.rank, 0x52414E4B])
            keys = rng.integers(0, 2**63, size=FEISTEL_ROUNDS, dtype=np.uint64)
            p = feistel_permute(p, self.num_samples, keys)
        w, local = p // self.per_bin, p % self.per_bin
        out = np.empty(len(p), dtype=np.int64)
        for wi in np.unique(w).tolist():
            rows = np.flatnonzero(w == wi)
            b = self.rank * self.plan.num_workers + wi
            mix = BinMix(self.plan.draws[b], self.seed, epoch, b, self.shuffle)
            s, k = mix.slots(local[rows])
            for si in np.unique(s).tolist():
                sel = s == si
                f = int(self._ranges[(wi, si)][1].sum())
                kk = k[sel]
                ps, j = kk // f, kk % f
                res = np.empty(len(kk), dtype=np.int64)
                for pi in np.unique(ps).tolist():
                    m = ps == pi
                    res[m] = self._pass_order(epoch, wi, si, pi)(j[m])
                out[rows[sel]] = res
        return out


# ---------------------------------------------------------------------------------------------
# Streaming loader.


class MixtureLoader(ShardedLoader):
    """:class:`ShardedLoader` over a mixture plan: one (rank, worker) bin, exactly
    ``plan.bin_draws`` samples of each source per epoch, streamed pool by pool per source."""

    def __init__(
        self,
        root: Any = None,
        plan: Any | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        worker: int | None = None,
        num_workers: int | None = None,
        batch_size: int | None = None,
        seed: int = 0,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        cache_mb: float = DEFAULT_CACHE_MB,
        speed: bool = True,
        video_backend: Any = None,
    ):
        rank, world_size = fill_rank(rank, world_size)
        if plan is None:
            from episodekit.metadata.plans.load import load_plan

            plan = load_plan(os.fspath(root), world_size, num_workers or 1)
        if not isinstance(plan, MixturePlan):
            raise ValueError("a mixture root needs its mixture plan (load_plan(DIR, ...))")
        check_run(plan, rank, world_size, worker, num_workers, batch_size, cache_mb)

        spec, datasets = open_mixture(plan)
        self.spec, self.features = spec, FeatureMap(spec, datasets)
        self.plan, self.rank, self.world_size = plan, int(rank), int(world_size)
        self.num_workers = int(plan.num_workers)
        self.worker = worker
        self.batch_size, self.seed = batch_size, int(seed)
        self.samples_per_worker = int(plan.samples_per_worker)
        self.plan_id = int(plan.digest[:15], 16)
        K, S = self.num_workers, len(datasets)
        self.sources: list[FrameDataset] = []
        self._layouts: dict[tuple[int, int], BinLayout] = {}
        pool_rows = []
        # cache_mb is the budget of all sources together, shared as this rank draws from them
        # (a source's pool still holds at least one of its row groups)
        rank_draws = np.array([plan.bin_draws(self.rank, w) for w in range(K)]).sum(0)
        source_mb = cache_mb * rank_draws / max(int(rank_draws.sum()), 1)
        for s, ds in enumerate(datasets):
            per_worker = []
            for w in range(K):
                items, srcs = plan.bin_items(self.rank, w), plan.bin_sources(self.rank, w)
                per_worker.append(items[srcs == s])
            eps = np.unique(np.concatenate(per_worker)[:, 0])
            fd = FrameDataset(
                ds,
                delta_timestamps=self.features.source_deltas(s, delta_timestamps),
                episodes=eps,
                tolerance_s=tolerance_s,
                cache_mb=source_mb[s],
                speed=speed,
                video_backend=video_backend,
                warn_cache=False,  # the stream decodes each row group once per epoch
                store=None,  # a frame store fills the pool instead (below)
            )
            store = find_store(ds, AUTO)
            if store is not None:  # pools copied from the store: no decode, one gather
                fd.reader.use_store(store)
            self.sources.append(fd)
            reader = fd.reader
            ep, length = ds.column("episode_index"), ds.column("length")
            frm = ds.column("dataset_from_index")
            for w in range(K):
                layout = BinLayout(per_worker[w], ep, length, frm, reader.rg_start, reader.rg_rows)
                if plan.bin_draws(self.rank, w)[s] and not layout.total:
                    raise ValueError(f"bin (rank {self.rank}, worker {w}) has no frames of {s}")
                self._layouts[(w, s)] = layout
            row_bytes = row_bytes_estimate(ds, reader.columns)
            pool_rows.append(max(int(source_mb[s] * MIB // row_bytes), 1))
        self._pool_rows = pool_rows
        # the sources' pools side by side in one array per shared column: a batch is gathered
        # once, not gathered per source and then scattered (see loaders/arena.py)
        self.arena = PoolArena(self._shared_columns(datasets), self.features.dtype)
        for s, fd in enumerate(self.sources):
            if fd.store is None:  # (always: a store fills the pool, see above)
                fd.defer_pool_rows = True
                largest = int(fd.reader.rg_rows.max()) if len(fd.reader.rg_rows) else 0
                self.arena.register(s, fd.reader, max(pool_rows[s], largest))
        self.pool_rows = int(hashlib.sha256(repr(pool_rows).encode()).hexdigest()[:12], 16)
        self._num_sources = S
        self._orders: dict[tuple, BinOrder] = {}
        self._orders_epoch = -1
        self._held: dict[int, tuple] = {}
        self.chunks_read = self.shared_chunks = 0  # chunks read / gathered through the arena
        self.epoch = 0
        self.position = 0

    def _shared_columns(self, datasets: Sequence[Dataset]) -> dict[int, dict[str, str]]:
        """Per source, its columns that every source holds with the batch's dtype and shape
        (no padding, no conversion): source column -> mixture name."""
        fm = self.features
        keys = [k for k in fm.keys if k in fm.dtype and k not in fm.width and k not in fm.drop]
        out: dict[int, dict[str, str]] = {}
        for s, (ds, fd) in enumerate(zip(datasets, self.sources)):
            mine = {}
            for k in keys:
                c = fm.inverse[s].get(k, k)
                try:
                    same = np.dtype((ds.features.get(c) or {}).get("dtype")) == fm.dtype[k]
                except TypeError:
                    same = False
                if same and c in fd.reader.columns:
                    mine[c] = k
            out[s] = mine
        return out

    # -- the order --------------------------------------------------------------------------

    def _pass(self, epoch: int, w: int, s: int, p: int) -> BinOrder:
        if self._orders_epoch != epoch:
            self._orders, self._orders_epoch = {}, epoch
        key = (w, s, p)
        if key not in self._orders:
            b = self.rank * self.num_workers + w
            self._orders[key] = BinOrder(
                self._layouts[(w, s)], _derive(self.seed, s, p), epoch, b, self._pool_rows[s]
            )
        return self._orders[key]

    def _draw_parts(self, epoch: int, w: int, s: int, k0: int, k1: int) -> Iterator[tuple]:
        """((pool rgs, needed rgs, their row ranges), frames) of draws [k0, k1) of source ``s``
        in bin ``w``.

        Draws run pass after pass over the bin's frames of the source. A last, partial pass no
        larger than the previous pass's last pool repeats that pool (still resident: no decode,
        as ``wrap`` does for single roots) instead of starting a new pool order."""
        f = self._layouts[(w, s)].total
        full, rem = divmod(int(self.plan.bin_draws(self.rank, w)[s]), f)
        wrap = False
        if full and rem:
            last = self._pass(epoch, w, s, full - 1)
            wrap = rem <= last.total - int(last.pool_cum[last.num_pools - 1])
        while k0 < k1:
            if wrap and k0 >= full * f:
                p, j0 = full - 1, f + k0 - full * f
                j1 = j0 + (k1 - k0)
            else:
                p, j0 = divmod(k0, f)
                j1 = min(f, j0 + (k1 - k0))
            order = self._pass(epoch, w, s, p)
            for pool, frames, segs in order.parts(j0, j1):
                yield (order.pool_rgs[pool], *order.need_of_segments(segs)), frames
            k0 += j1 - j0

    def _bin_chunks(self, epoch: int, w: int, start: int, size: int) -> Iterator[tuple]:
        """Chunks of ``size`` positions of bin ``w`` from ``start``: ``(n, [(source, rows,
        parts)])``, rows being the chunk's rows that source fills and parts its
        ``(part id, pool row groups, needed row groups, frames)`` in draw order. The order is
        computed a block (>= 64k positions) at a time: per-call overhead stays off the batches."""
        b = self.rank * self.num_workers + w
        mix = BinMix(self.plan.draws[b], self.seed, epoch, b)
        total = self.samples_per_worker
        S = self._num_sources
        counts = np.zeros(S, dtype=np.int64)
        for p0 in range(0, start, BLOCK):  # draws made before ``start`` (resume)
            s, _ = mix.slots(np.arange(p0, min(start, p0 + BLOCK)))
            counts += np.bincount(s, minlength=S)
        block = size * max(1, BLOCK // size)  # batches keep their alignment to ``start``
        for p0 in range(start, total, block):
            p1 = min(total, p0 + block)
            labels, _ = mix.slots(np.arange(p0, p1))
            streams: dict[int, list] = {}
            for si in np.unique(labels).tolist():
                n = int((labels == si).sum())
                k0 = int(counts[si])
                streams[si] = [
                    [(epoch, w, si, k0, j), rgs, need, frames]
                    for j, ((rgs, *need), frames) in enumerate(
                        self._draw_parts(epoch, w, si, k0, k0 + n)
                    )
                ]
                counts[si] += n
            for q0 in range(p0, p1, size):
                lab = labels[q0 - p0 : min(p1, q0 + size) - p0]
                chunk = []
                for si in np.unique(lab).tolist():
                    rows = np.flatnonzero(lab == si)
                    chunk.append((si, rows, _take(streams[si], len(rows))))
                yield len(lab), chunk

    def _chunks(self, epoch: int, start: int, size: int) -> Iterator[tuple]:
        spw = self.samples_per_worker
        for j, w in enumerate(self.workers()):
            lo, hi = j * spw, (j + 1) * spw
            if start >= hi:
                continue
            yield from self._bin_chunks(epoch, w, max(start, lo) - lo, size)

    def epoch_draws(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(source_index, global frame in that source) of every sample of an epoch for this
        process, in order (no data read; for checks and tests)."""
        srcs, frames = [], []
        for n, chunk in self._chunks(epoch, 0, 1 << 16):
            s_out = np.empty(n, dtype=np.int64)
            f_out = np.empty(n, dtype=np.int64)
            for si, rows, parts in chunk:
                s_out[rows] = si
                f_out[rows] = np.concatenate([p[3] for p in parts])
            srcs.append(s_out)
            frames.append(f_out)
        if not srcs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(srcs), np.concatenate(frames)

    def frame_order(self, epoch: int, start: int = 0) -> Iterator[np.ndarray]:
        raise NotImplementedError("a mixture's order is (source, frame): use epoch_draws()")

    def bin_order(self, epoch: int, worker: int) -> BinOrder:
        raise NotImplementedError("a mixture bin has one order per source and pass")

    def _read_chunk(self, n: int, chunk: list[tuple]) -> dict[str, Any]:
        """The ``n`` rows of a chunk: each source's frames read from its pool (shared columns as
        arena row indices), then one gather per shared column for all sources."""
        parts = []
        for si, rows, draw_parts in chunk:
            fd = self.sources[si]
            got: list[dict[str, Any]] = []
            for key, rgs, need, frames in draw_parts:
                if self._held.get(si) != key:  # a part's row groups are held once
                    if got and not fd.reader.holding(rgs, *need):
                        # the hold overwrites this source's region: gather what points at it
                        got = [{k: _values(v) for k, v in b.items()} for b in got]
                    fd.reader.hold(rgs, *need)
                    self._held[si] = key
                decoded = fd.reader.row_groups_read
                got.append(fd.get_frames(frames))
                if fd.reader.row_groups_read != decoded and len(got) > 1:  # pragma: no cover
                    raise RuntimeError("a held pool missed a row group its frames need")
            batch = got[0] if len(got) == 1 else _join(got)
            parts.append((rows, self.features.convert(si, batch, len(rows))))
        self.chunks_read += 1
        idx = [b.get("index") for _, b in parts]
        if all(isinstance(x, PoolRows) and x.base is idx[0].base for x in idx):
            self.shared_chunks += 1  # (figures for tests and benchmarks)
        return assemble(parts, n)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        total = len(self)
        if total and self.position >= total:
            self.epoch, self.position = self.epoch + 1, 0
        epoch = self.epoch
        size = self.batch_size or READ_CHUNK
        # read several batches at once (one gather per source and part), hand them out one by one
        read = size * max(1, READ_ROWS // size)
        for n, chunk in self._chunks(epoch, self.position, read):
            block = self._read_chunk(n, chunk)
            for a in range(0, n, size):
                batch = _slice(block, a, min(n, a + size)) if n > size else block
                if self.batch_size:
                    self.position += len(batch[SOURCE_INDEX])
                    yield batch
                    if epoch != self.epoch:
                        return
                    continue
                for j in range(len(batch[SOURCE_INDEX])):
                    self.position += 1
                    yield batch_row(batch, j)
                if epoch != self.epoch:
                    return


def _take(stream: list[list], n: int) -> list[tuple]:
    """The next ``n`` frames of a source's parts (consumed from the front of ``stream``)."""
    out = []
    while n:
        key, rgs, need, frames = stream[0]
        if len(frames) <= n:
            out.append((key, rgs, need, frames))
            n -= len(frames)
            stream.pop(0)
        else:
            out.append((key, rgs, need, frames[:n]))
            stream[0][3] = frames[n:]
            n = 0
    return out


def _slice(batch: Mapping[str, Any], a: int, b: int) -> dict[str, Any]:
    """Rows ``[a, b)`` of a batch dict (nested dicts included)."""
    return {k: (_slice(v, a, b) if isinstance(v, Mapping) else v[a:b]) for k, v in batch.items()}
