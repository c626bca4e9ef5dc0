"""torch adapters for the loaders (import this module only when torch is installed).

- :class:`TorchFrameDataset`: a map-style ``torch.utils.data.Dataset`` over a :class:`FrameDataset`;
  it has ``__getitems__``, so a ``DataLoader(..., collate_fn=collate)`` reads each batch with one
  vectorized ``get_batch`` call;
- :class:`TorchShardedDataset`: an ``IterableDataset`` over a :class:`ShardedLoader` that binds
  each DataLoader worker to its plan bin (``DataLoader(ds, batch_size=None, num_workers=K)`` with a
  loader made with ``batch_size``), resumable from the number of batches consumed;
- :class:`TorchElasticDataset`: an ``IterableDataset`` over an :class:`ElasticLoader` (one batch
  per step; workers take steps in turn), whose state resumes on any world size; it is
  ``Stateful`` for torchdata's ``StatefulDataLoader`` (see :func:`elastic_states`);
- :func:`collate` / :func:`to_torch`: numpy -> tensors (strings, paths and bytes stay lists);
- :func:`make_loader`: the loader's own worker processes, batches handed over through one
  shared-memory ring (:mod:`~episodekit.loaders.workers`): the same batches in the same order as
  in-process, resumable, as fast as in-process on numeric data and faster where decoding
  dominates (``DataLoader`` workers pass every tensor of a batch through its own segment).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

try:
    import torch
except ModuleNotFoundError as exc:  # torch is an optional extra, not one of our modules
    raise ImportError(
        "episodekit.loaders.torch needs torch, which is not installed: "
        "pip install 'episodekit[torch]' (episodekit.loaders works without it)"
    ) from exc
from torch.utils.data import Dataset, IterableDataset

from episodekit.loaders.elastic import ElasticLoader
from episodekit.loaders.frames import FrameDataset
from episodekit.loaders.sharded import ShardedLoader
from episodekit.loaders.sources import LoaderRun, batch_source
from episodekit.loaders.workers import BatchLoader


class Batch(dict):
    """A batch that is already collated (returned by ``__getitems__``; ``collate`` passes it)."""


def to_torch(x: Any) -> Any:
    """numpy arrays/scalars -> tensors (recursively in dicts); object arrays -> lists."""
    if isinstance(x, Mapping):
        out = {k: to_torch(v) for k, v in x.items()}
        return Batch(out) if isinstance(x, Batch) else out
    if isinstance(x, np.ndarray):
        return x.tolist() if x.dtype == object else torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, np.generic):
        return torch.as_tensor(x.item() if x.dtype == object else x)
    return x


def collate(samples: Sequence[Mapping[str, Any]] | Batch) -> dict[str, Any]:
    """Stack samples (numpy dicts, as ``FrameDataset[i]`` returns) into a dict of tensors."""
    if isinstance(samples, Batch):
        return samples
    first = samples[0]
    out: dict[str, Any] = {}
    for key, v in first.items():
        values = [s[key] for s in samples]
        if isinstance(v, Mapping):
            out[key] = collate(values)
        elif isinstance(v, (np.ndarray, np.generic, bool, int, float)) and not (
            isinstance(v, np.ndarray) and v.dtype == object
        ):
            out[key] = torch.from_numpy(np.stack([np.asarray(x) for x in values]))
        elif isinstance(v, torch.Tensor):
            out[key] = torch.stack(values)
        else:
            out[key] = values
    return out


class TorchFrameDataset(Dataset):
    """Map-style torch dataset over a :class:`FrameDataset` (numpy samples become tensors)."""

    def __init__(self, frames: FrameDataset):
        self.frames = frames

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return to_torch(self.frames[int(i)])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        """A whole batch in one vectorized read (use ``collate_fn=collate``)."""
        return Batch(to_torch(self.frames.get_batch(np.asarray(indices, dtype=np.int64))))


class TorchShardedDataset(IterableDataset):
    """Iterable torch dataset over a :class:`ShardedLoader`; each DataLoader worker reads its bin.

    Call :meth:`set_epoch` before each epoch (workers get fresh copies of this object). To resume,
    :meth:`load_state_dict` with ``{"epoch": e, "batches": batches consumed this epoch}``: with
    ``DataLoader(batch_size=None, num_workers=K)`` batches come round-robin from the K workers, so
    each worker's position follows from that count, and the remaining batches come in exactly the
    original order (the workers' bins are rotated to match the restarted round-robin).
    """

    def __init__(self, loader: ShardedLoader):
        self.loader = loader
        self._resume: tuple[int, int] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)
        self._resume = None

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self._resume = (int(state["epoch"]), int(state["batches"]))

    def __len__(self) -> int:
        spw, k = self.loader.samples_per_worker, self.loader.num_workers
        bs = self.loader.batch_size
        return spw * k if not bs else math.ceil(spw / bs) * k

    def __iter__(self) -> Iterator[Any]:
        loader = self.loader
        if self._resume is not None:
            epoch, batches = self._resume
            step = loader.batch_size or 1
            workers = loader.workers()
            k = loader.num_workers
            if len(workers) == 1 and k > 1 and loader.worker is None:
                # DataLoader worker i restarts the round-robin: let it play bin (i + batches) % k,
                # so the remaining batches come in exactly the original order.
                w = (workers[0] + batches) % k
                loader.bind_worker(w)
                mine = max(0, math.ceil((batches - w) / k))
                position = min(mine * step, loader.samples_per_worker)
            else:
                position = min(batches * step, len(loader))
            loader.seek(epoch, position)
        for item in loader:
            yield to_torch(item)


class TorchElasticDataset(IterableDataset):
    """Iterable torch dataset over an :class:`ElasticLoader`:
    ``DataLoader(ds, batch_size=None, num_workers=K)``. Each batch is one step of this rank;
    DataLoader worker ``w`` yields steps ``w, w + K, ...``, the order the DataLoader hands
    batches out in, so any ``K`` gives the same sequence of batches. Call :meth:`set_epoch`
    before each epoch (workers get fresh copies of this object).

    To resume: :meth:`state_dict` with ``steps`` = batches the training loop consumed this run
    (the DataLoader prefetches, so the loader itself cannot know), gather every rank's state
    (:func:`~episodekit.loaders.elastic.all_gather_states`), and :meth:`load_state_dict` the
    list (or its :func:`~episodekit.loaders.elastic.merge_states`) on the new world size, before
    iterating. With torchdata's ``StatefulDataLoader`` the per-worker states are kept by the
    DataLoader itself: same-size resumes need nothing else; for a resize take them out with
    :func:`elastic_states`.
    """

    def __init__(self, loader: ElasticLoader):
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.loader.run.num_units

    def state_dict(self, steps: int | None = None) -> dict[str, Any]:
        """This rank's elastic state after ``steps`` consumed batches (None: what this process
        yielded itself, as a StatefulDataLoader worker reports it)."""
        return self.loader.state_dict() if steps is None else self.loader.state_at(steps)

    def load_state_dict(self, state: Any) -> None:
        self.loader.load_state_dict(state)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield to_torch(batch)


def elastic_states(stateful_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The elastic states inside a ``StatefulDataLoader.state_dict()`` of one rank (one per
    worker, or the main process's). Gather them over ranks, then ``merge_states``."""
    out = []
    snap = stateful_state.get("_snapshot")
    if isinstance(snap, Mapping):
        workers = snap.get("_worker_snapshots") or {}
        for key in sorted(workers, key=lambda k: int(str(k).rsplit("_", 1)[-1])):
            ds_state = workers[key].get("dataset_state")
            if ds_state is not None:
                out.append(ds_state)
    elif stateful_state.get("dataset_state") is not None:
        out.append(stateful_state["dataset_state"])
    if not out:
        raise ValueError("no elastic state in this StatefulDataLoader state")
    return out


def tensors(
    batch: Mapping[str, Any], copy: bool = False, pin_memory: bool = False, device: Any = None
) -> dict[str, Any]:
    """A numpy batch as tensors that view its arrays (``torch.from_numpy``); ``copy`` clones
    them, ``pin_memory`` copies them to pinned memory, ``device`` moves them there."""
    out: dict[str, Any] = {}
    for key, v in batch.items():
        if type(v) is np.ndarray and v.dtype != object:  # (the hot path: no abc checks)
            t = torch.from_numpy(v)
            if pin_memory:
                t = t.pin_memory()
            elif copy:
                t = t.clone()
            out[key] = t if device is None else t.to(device, non_blocking=pin_memory)
        elif isinstance(v, Mapping):
            out[key] = tensors(v, copy, pin_memory, device)
        else:
            out[key] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


def make_loader(
    root_or_plan_dir: Any,
    plan: Any = None,
    batch_size: int = 256,
    num_workers: int = 2,
    *,
    access: str = "stream",
    rank: int | None = None,
    world_size: int | None = None,
    seed: int = 0,
    drop_last: bool = False,
    sampler_kwargs: Mapping[str, Any] | None = None,
    prefetch: int = 2,
    copy: bool = False,
    pin_memory: bool = False,
    device: Any = None,
    ring_mb: float | None = None,
    start_method: str | None = None,
    **kwargs: Any,
) -> BatchLoader:
    """Batches of tensors from ``num_workers`` worker processes through a shared-memory ring
    (0: in-process), the same batches in the same order whatever ``num_workers``.

    What is read (``root_or_plan_dir``: a prepared root or a mixture plan folder):

    - ``access="stream"`` (default): the rank's bins of ``plan`` (None: ``load_plan(root,
      world_size, max(num_workers, 1))``) streamed, taken round-robin (batch ``b`` is batch
      ``b // K`` of bin ``b % K``, K = ``plan.num_workers``, as ``DataLoader`` workers over
      :class:`TorchShardedDataset` give them). Use a plan made for ``num_workers`` workers: each
      worker then reads one bin and decodes each of its row groups once per epoch;
    - ``access="random"``: ``FrameDataset.get_batch`` over ``EpisodeAwareSampler`` order (``plan``
      optional: it splits the ranks; ``sampler_kwargs``: shuffle, drop_n_first_frames, ...);
      ``drop_last`` drops a short last batch;
    - a canonical plan (or ``access="elastic"``): the ``ElasticLoader``'s steps, one batch per
      step (``micro_batch`` sets the step, ``batch_size`` is unused), resumable on any world size.

    ``kwargs`` go to the reader (``delta_timestamps``, ``video_backend``, ``cache_mb``, ``store``
    for random access, ``micro_batch`` / ``pool_rows`` for elastic...). ``rank``/``world_size``
    default to torch.distributed, else RANK/WORLD_SIZE (one ring per rank).

    A batch's tensors view a slot of the ring: **a batch is valid until the next one is asked
    for** (its slot then goes back to a worker). Pass ``copy=True`` to keep batches longer;
    ``pin_memory`` / ``device`` copy them anyway. ``prefetch`` slots per worker; ``ring_mb``
    caps the ring (an error names the need). Use it as a context manager or call ``close()``
    (workers also stop at exit and when the training process dies). Workers are started with
    ``start_method``; by default 'spawn' where it can start them, and 'fork' on Linux (when safe:
    CUDA not initialized here) where 'spawn' would run the script again (a call at the top level
    of a script without ``if __name__ == "__main__":``, a script on stdin), so those work as with
    ``DataLoader``; else one line naming what to add. ``state_dict()`` / ``load_state_dict()`` /
    ``set_epoch()`` as the in-process loaders: resuming gives exactly the remaining batches.
    """
    from episodekit.core.world import fill_rank

    rank, world_size = fill_rank(rank, world_size)
    run = LoaderRun(
        access, int(batch_size), int(rank), int(world_size), int(num_workers), seed, drop_last
    )
    source = batch_source(root_or_plan_dir, plan, run, kwargs, sampler_kwargs)

    def convert(batch: dict[str, Any]) -> dict[str, Any]:
        return tensors(batch, copy, pin_memory, device)

    return BatchLoader(
        source, num_workers, prefetch, run.rank, ring_mb, start_method, convert=convert
    )
