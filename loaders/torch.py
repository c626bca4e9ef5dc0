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
- :func:`collate` / :func:`to_torch`: numpy -> tensors (strings, paths and bytes stay lists).
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
