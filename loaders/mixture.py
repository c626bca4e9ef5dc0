"""The runtime over a mixture: ``FrameDataset``, ``EpisodeAwareSampler`` and ``ShardedLoader`` on
several roots at once (issue 16). Built through the usual classes::

    plan = load_plan("mix-plan", world_size=8, num_workers=4)      # a mixture plan folder
    ds = FrameDataset(plan, delta_timestamps=...)                    # ds.is_mixture
    sampler = EpisodeAwareSampler(ds, plan=plan, rank=r, world_size=8)  # draws: MixtureDraws
    loader = ShardedLoader("mix-plan", plan, rank=r, world_size=8)   # stream: MixtureStream

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
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from episodekit.core.dataset import Dataset
from episodekit.core.paths import MIB
from episodekit.loaders.arena import PoolArena
from episodekit.loaders.frames import FrameDataset, RootFrameDataset
from episodekit.loaders.kinds import register_mixture
from episodekit.loaders.mixture_features import (
    FeatureMap,
    assemble,
    join_parts,
    values_of,
)
from episodekit.loaders.options import ReadOptions
from episodekit.loaders.reader import PoolRows
from episodekit.loaders.sampler import (
    FEISTEL_ROUNDS,
    Draws,
    EpisodeAwareSampler,
    EpochOrder,
    feistel_permute,
    items_to_ranges,
)
from episodekit.loaders.sharded import (
    BinLayout,
    BinOrder,
    ShardedLoader,
    Stream,
    row_bytes_estimate,
)
from episodekit.loaders.store import AUTO, find_store
from episodekit.metadata.mixture.plan_file import MixturePlan
from episodekit.metadata.mixture.spec import MIXTURE_FILE, MixtureError, MixtureSpec, parse_mixture

BLOCK = 1 << 16  # positions whose order is computed at once
READ_ROWS = 2048  # positions read at once (batches are handed out from them)


def open_mixture(obj: Any) -> tuple[MixtureSpec, list[Dataset]]:
    """The spec and the opened source datasets of a mixture given in any accepted form."""
    from episodekit.core.dataset import open_dataset

    if isinstance(obj, FrameDataset) and obj.is_mixture:
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
# Map-style frames over all sources.


def open_sources(
    mixture: Any, options: ReadOptions
) -> tuple[MixtureSpec, FeatureMap, list[RootFrameDataset]]:
    """A mixture's spec, feature map and sources (``FrameDataset`` on a mixture): each source a
    :class:`RootFrameDataset` of its selected episodes opened with ``options``, its windows
    renamed to the source's names."""
    from episodekit.metadata.mixture.spec import select_episodes

    spec, datasets = open_mixture(mixture)
    features = FeatureMap(spec, datasets)
    deltas = options.delta_timestamps
    sources = [
        RootFrameDataset.open(
            ds,
            options.replace(delta_timestamps=features.source_deltas(s, deltas)),
            ds.column("episode_index")[select_episodes(ds, src, spec.where)],
        )
        for s, (src, ds) in enumerate(zip(spec.sources, datasets))
    ]
    return spec, features, sources


# The mixture kinds' former class names: the same classes (``is_mixture`` tells the kind).
MixtureFrameDataset = FrameDataset
MixtureSampler = EpisodeAwareSampler
MixtureLoader = ShardedLoader


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


class MixtureDraws(Draws):
    """A mixture's draws (:class:`EpisodeAwareSampler` over a mixture ``FrameDataset`` with its
    mixture plan): rank ``r`` yields ``plan.samples_per_rank`` indices per epoch, each bin
    exactly its ``bin_draws`` per source; a pure function of (seed, epoch); resumable at any
    position. ``drop_n_first_frames``/``drop_n_last_frames`` (as LeRobot's sampler) are never
    drawn; the quotas stay exact, so the kept frames of a source are drawn a little more often."""

    def _select(self, dataset: Any, drop_first: int, drop_last: int) -> None:
        plan = self.plan
        if not isinstance(plan, MixturePlan):
            raise ValueError(
                "a mixture needs its mixture plan: EpisodeAwareSampler(ds, plan=load_plan(DIR, "
                "world_size, num_workers))"
            )
        if not (isinstance(dataset, FrameDataset) and dataset.is_mixture):
            dataset = FrameDataset(dataset)
        if dataset.source_names != plan.source_names:
            raise ValueError(
                f"dataset sources {dataset.source_names} differ from the plan's {plan.source_names}"
            )
        self.dataset = dataset
        K = plan.num_workers
        self.per_bin = int(plan.samples_per_worker)
        self.num_samples = self.per_bin * K
        self.natural = self.num_samples
        # (bin, source) -> (base, size) in the mixture dataset's index space
        self._ranges: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        for w in range(K):
            items, srcs = plan.bin_items(self.rank, w), plan.bin_sources(self.rank, w)
            for s, fd in enumerate(dataset.datasets):
                sel = items[srcs == s]
                base, size = items_to_ranges(
                    sel, fd.episode_index, fd.episode_lengths, fd.episode_starts,
                    drop_first, drop_last,
                )  # fmt: skip
                if not size.sum() and plan.bin_draws(self.rank, w)[s]:
                    raise ValueError(
                        f"drop_n_first_frames={drop_first}, drop_n_last_frames="
                        f"{drop_last} leave no frames of source {plan.source_names[s]!r} "
                        f"in bin (rank {self.rank}, worker {w}), which draws from it"
                    )
                self._ranges[(w, s)] = (base + dataset.source_offsets[s], size)
        self._orders: dict[tuple, EpochOrder] = {}
        self._order_epoch = -1
        self.identity = {
            "plan": plan.digest,
            "rank": self.rank,
            "world_size": self.world_size,
            "shuffle": self.shuffle,
            "frames": self.num_samples,
        }
        if drop_first or drop_last:  # (states without drops stay valid)
            self.identity["drop"] = [int(drop_first), int(drop_last)]

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


class MixtureStream(Stream):
    """A mixture's stream (:class:`ShardedLoader` over a mixture plan): one (rank, worker) bin,
    exactly ``plan.bin_draws`` samples of each source per epoch, streamed pool by pool per
    source."""

    @staticmethod
    def source(root: Any) -> Any:
        return None if root is None else os.fspath(root)

    def _open(self, source: Any, options: ReadOptions) -> None:
        plan = self.plan
        if not isinstance(plan, MixturePlan):
            raise ValueError("a mixture root needs its mixture plan (load_plan(DIR, ...))")
        spec, datasets = open_mixture(plan)
        self.spec, self.features = spec, FeatureMap(spec, datasets)
        K, S = self.num_workers, len(datasets)
        self.sources: list[RootFrameDataset] = []
        self._layouts: dict[tuple[int, int], BinLayout] = {}
        pool_rows = []
        # cache_mb is the budget of all sources together, shared as this rank draws from them
        # (a source's pool still holds at least one of its row groups)
        rank_draws = np.array([plan.bin_draws(self.rank, w) for w in range(K)]).sum(0)
        source_mb = options.cache_mb * rank_draws / max(int(rank_draws.sum()), 1)
        for s, ds in enumerate(datasets):
            per_worker = []
            for w in range(K):
                items, srcs = plan.bin_items(self.rank, w), plan.bin_sources(self.rank, w)
                per_worker.append(items[srcs == s])
            eps = np.unique(np.concatenate(per_worker)[:, 0])
            deltas = self.features.source_deltas(s, options.delta_timestamps)
            # store=None: a frame store fills the pool instead (below)
            fd = RootFrameDataset.open(
                ds, options.replace(delta_timestamps=deltas, cache_mb=source_mb[s], store=None), eps
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
                        got = [{k: values_of(v) for k, v in b.items()} for b in got]
                    fd.reader.hold(rgs, *need)
                    self._held[si] = key
                decoded = fd.reader.row_groups_read
                got.append(fd.get_frames(frames))
                if fd.reader.row_groups_read != decoded and len(got) > 1:  # pragma: no cover
                    raise RuntimeError("a held pool missed a row group its frames need")
            batch = got[0] if len(got) == 1 else join_parts(got)
            parts.append((rows, self.features.convert(si, batch, len(rows))))
        self.chunks_read += 1
        idx = [b.get("index") for _, b in parts]
        if all(isinstance(x, PoolRows) and x.base is idx[0].base for x in idx):
            self.shared_chunks += 1  # (figures for tests and benchmarks)
        return assemble(parts, n)

    def blocks(self, epoch: int, start: int, size: int) -> Iterator[tuple[int, Callable]]:
        # read several batches at once (one gather per source and part); the loader cuts them
        read = size * max(1, READ_ROWS // size)
        for n, chunk in self._chunks(epoch, start, read):
            yield n, partial(self._read_chunk, n, chunk)


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


register_mixture(
    open_sources=open_sources, assemble=assemble, draws=MixtureDraws, stream=MixtureStream
)
