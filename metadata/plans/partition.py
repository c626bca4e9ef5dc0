"""Number partitioning for shard plans: items with costs into ``k`` bins of near-equal totals.

Items are (episode_index, start_frame, end_frame, cost) rows. All algorithms take items in a fixed
order (cost descending, ties by episode_index then start_frame), so their output is a pure
function of the input: no randomness, no dependence on the machine.

- ``lpt``: largest cost first, each to the least-loaded bin (ties: lowest bin). A heap, O(n log k).
- ``kk``: multi-way Karmarkar-Karp largest differencing: every item starts as a k-tuple
  (cost, 0, ..., 0); the two tuples with the largest spread are merged, largest sum paired with
  smallest; k-vectors are numpy arrays and bins are linked lists, so a merge is O(k).
- ``split_long``: when whole items cannot reach the mean (an item costs more than the mean bin
  cost, or too few items per bin), the largest items are taken out, the rest partitioned, and the
  large ones poured, laid end to end as contiguous frame ranges, into the bins' deficits to the
  mean (least-loaded bin first). Items above the mean are always cut; others at most one per bin
  boundary.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

ALGOS = ("auto", "lpt", "kk")
KK_AUTO_MAX_ITEMS = 50_000  # "auto" also tries KK below this many items (KK costs O(n k))


@dataclass
class Items:
    """Columns of a set of items (episode ranges with costs); ``cost`` is float64."""

    episode: np.ndarray
    start: np.ndarray
    end: np.ndarray
    cost: np.ndarray

    def __len__(self) -> int:
        return len(self.cost)

    def take(self, idx: np.ndarray) -> Items:
        return Items(self.episode[idx], self.start[idx], self.end[idx], self.cost[idx])

    @staticmethod
    def concat(parts: list[Items]) -> Items:
        return Items(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))


_FIELDS = ("episode", "start", "end", "cost")


def decreasing_order(items: Items) -> np.ndarray:
    """Positions of items by cost descending, ties by episode_index then start frame."""
    return np.lexsort((items.start, items.episode, -items.cost))


def lpt(costs: np.ndarray, k: int) -> np.ndarray:
    """Bin per item (items given in processing order): largest first to the least-loaded bin."""
    n = len(costs)
    if n <= k:
        return np.arange(n, dtype=np.int64)
    values = costs.tolist()
    heap = [(c, b) for b, c in enumerate(values[:k])]
    heapq.heapify(heap)
    out = list(range(k))
    append, replace = out.append, heapq.heapreplace
    for c in values[k:]:
        load, b = heap[0]
        replace(heap, (load + c, b))
        append(b)
    return np.asarray(out, dtype=np.int64)


def kk(costs: np.ndarray, k: int) -> np.ndarray:
    """Bin per item by multi-way Karmarkar-Karp (largest differencing method)."""
    n = len(costs)
    if n <= k:
        return np.arange(n, dtype=np.int64)
    nxt = np.full(n, -1, dtype=np.int64)  # linked lists: one per bin of a partial solution
    sums: dict[int, np.ndarray] = {}
    heads: dict[int, np.ndarray] = {}
    tails: dict[int, np.ndarray] = {}
    # Heap key: (-spread, sequence number): deterministic ties. Singletons are built lazily.
    heap = [(-float(c), i) for i, c in enumerate(costs.tolist())]
    heapq.heapify(heap)
    seq = n

    def tuple_of(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if i < n:  # a singleton: (cost, 0, ..., 0)
            s = np.zeros(k)
            s[0] = costs[i]
            h = np.full(k, -1, dtype=np.int64)
            h[0] = i
            return s, h, h.copy()
        return sums.pop(i), heads.pop(i), tails.pop(i)

    while len(heap) > 1:
        _, a = heapq.heappop(heap)
        _, b = heapq.heappop(heap)
        sa, ha, ta = tuple_of(a)  # each kept sorted by sum, descending
        sb, hb, tb = tuple_of(b)
        sb, hb, tb = sb[::-1], hb[::-1], tb[::-1]  # ascending: largest meets smallest
        s = sa + sb
        both = (ta >= 0) & (hb >= 0)
        nxt[ta[both]] = hb[both]
        h = np.where(ha >= 0, ha, hb)
        t = np.where(tb >= 0, tb, ta)
        order = np.argsort(-s, kind="stable")
        s = s[order] - s[order][-1]
        sums[seq], heads[seq], tails[seq] = s, h[order], t[order]
        heapq.heappush(heap, (-(float(s[0]) - float(s[-1])), seq))
        seq += 1
    _, last = heap[0]
    _, h, _ = tuple_of(last)
    out = np.full(n, -1, dtype=np.int64)
    for b, i in enumerate(h.tolist()):
        while i >= 0:
            out[i] = b
            i = int(nxt[i])
    return out


def assign(items: Items, k: int, algo: str) -> tuple[np.ndarray, str]:
    """Bin per item (in ``items`` order) by ``algo``; returns (bins, algorithm actually used).

    ``auto`` runs LPT, and also KK when there are at most KK_AUTO_MAX_ITEMS items, keeping the one
    with the smaller maximum bin (LPT on a tie).
    """
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r} (choose from {', '.join(ALGOS)})")
    order = decreasing_order(items)
    costs = items.cost[order]
    candidates = []
    if algo in ("auto", "lpt"):
        candidates.append(("lpt", lpt(costs, k)))
    if algo == "kk" or (algo == "auto" and len(items) <= KK_AUTO_MAX_ITEMS):
        candidates.append(("kk", kk(costs, k)))
    best_name, best, best_max = "", None, np.inf
    for name, bins in candidates:
        peak = np.bincount(bins, costs, minlength=k).max() if len(bins) else 0.0
        if peak < best_max or best is None:
            best_name, best, best_max = name, bins, peak
    out = np.empty(len(items), dtype=np.int64)
    out[order] = best
    return out, best_name


def pour(
    items: Items, loads: np.ndarray, target: float, order: np.ndarray | None = None
) -> tuple[Items, np.ndarray]:
    """Cut ``items`` into contiguous frame ranges that fill each bin up to ``target``.

    Bins are filled least-loaded first (ties: lower bin); the items are laid end to end in
    ``order`` (default: (episode, start) order) and cut where a bin's deficit is used up (rounded
    to whole frames). Returns the pieces and the bin of each. The cost of a piece is its frames'
    share of its item.
    """
    if order is None:
        order = np.lexsort((items.start, items.episode))
    items = items.take(order)
    frames = (items.end - items.start).astype(np.int64)
    fbound = np.concatenate([[0], np.cumsum(frames)])  # item boundaries on the frame axis
    cbound = np.concatenate([[0.0], np.cumsum(items.cost)])
    total = cbound[-1]
    fill = np.lexsort((np.arange(len(loads)), loads))
    deficit = np.clip(target - loads[fill], 0.0, None)
    cum = np.cumsum(deficit)[:-1]  # the last bin in fill order takes any rounding remainder
    # A bin's span ends at the frame where the cumulative cost reaches its cumulative deficit.
    cuts = cum[cum < total]
    cut_frames = np.rint(np.interp(cuts, cbound, fbound)).astype(np.int64)
    points = np.unique(np.concatenate([fbound, cut_frames]))
    lo, hi = points[:-1], points[1:]
    item = np.searchsorted(fbound, lo, side="right") - 1
    slot = np.searchsorted(cut_frames, lo, side="right")
    pieces_frames = hi - lo
    cost = items.cost[item] * pieces_frames / np.maximum(frames[item], 1)
    start = items.start[item] + (lo - fbound[item])
    pieces = Items(items.episode[item], start, start + pieces_frames, cost)
    return pieces, fill[slot]


def short_prefix(items: Items, k: int, target: float) -> np.ndarray:
    """Mask of the items kept whole by ``split_long``: the cheapest ones (cost ascending, ties by
    episode and start) while their total / k + the item's cost stays <= target. Largest-first
    placement of these never exceeds ``target`` (a bin receiving an item holds at most the
    average), so pouring the rest into the deficits leaves every bin within a frame of it."""
    order = decreasing_order(items)[::-1]
    c = items.cost[order]
    ok = np.cumsum(c) / k + c <= target * (1 + 1e-12)
    keep = int(np.argmin(ok)) if not ok.all() else len(c)
    mask = np.zeros(len(items), dtype=bool)
    mask[order[:keep]] = True
    return mask


def partition(
    items: Items, k: int, algo: str = "auto", split_long: bool = False, tolerance: float = 1e-3
) -> tuple[Items, np.ndarray, str]:
    """Items (possibly cut, with ``split_long``) and the bin of each, plus the algorithm used.

    With ``split_long``, a partition of whole items is kept when its largest bin is within
    ``tolerance`` of the mean; otherwise the largest items are poured as contiguous frame ranges
    into the deficits left by the others (see :func:`short_prefix` and :func:`pour`): every item
    costing more than the mean is cut, plus at most one item per bin boundary.
    """
    if k == 1:
        return items, np.zeros(len(items), dtype=np.int64), "none"
    target = float(items.cost.sum()) / k
    if not split_long or items.cost.max(initial=0.0) <= target:
        bins, used = assign(items, k, algo)
        peak = np.bincount(bins, items.cost, minlength=k).max() if len(items) else 0.0
        if not split_long or peak <= target * (1 + tolerance):
            return items, bins, used
    keep = short_prefix(items, k, target)
    short = items.take(np.flatnonzero(keep))
    bins, used = assign(short, k, algo) if len(short) else (np.zeros(0, np.int64), algo)
    loads = np.bincount(bins, short.cost, minlength=k).astype(np.float64)
    pieces, piece_bins = pour(items.take(np.flatnonzero(~keep)), loads, target)
    return Items.concat([short, pieces]), np.concatenate([bins, piece_bins]), used


LOCALITIES = ("none", "rowgroup")
MERGE_BELOW = 4  # row groups with fewer episodes than this are joined ...
MERGE_ITEMS = 32  # ... into units of about this many episodes


def _fill_shares(costs: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """Slot (into ``shares``) per item: largest item first to the slot with the most of its
    share left (ties: lowest slot), so every slot ends within about one small item of its share."""
    heap = [(-float(s), j) for j, s in enumerate(shares.tolist())]
    heapq.heapify(heap)
    out = np.empty(len(costs), dtype=np.int64)
    order = np.argsort(-costs, kind="stable")
    replace = heapq.heapreplace
    for i, c in zip(order.tolist(), costs[order].tolist()):
        left, j = heap[0]
        out[i] = j
        replace(heap, (left + c, j))
    return out


CUT_WINDOW = 32  # items on each side of a cut inside a row group that may change sides
CUT_SLACK = 0.002  # runs when every bin of the row group ends this close to its share


def _cut_shares(costs: np.ndarray, shares: np.ndarray, window: int = CUT_WINDOW) -> np.ndarray:
    """Slot (into ``shares``) per item, items in file order: each slot a run of consecutive
    items, balanced to about one small item.

    The items are cut where their running cost crosses the shares' running sums; then, cut by
    cut from the left, the items within ``window`` of a cut are divided between its two slots:
    largest first to the left one while it stays within its share (then the smallest left over
    if that brings it closer), the rest to the right one. A slot's rows then span its run plus
    at most ``window`` items at each end: a reader that decodes only the row range its slot
    needs (``RowGroupReader.hold``) decodes ~its share of the row group, not all of it."""
    n, m = len(costs), len(shares)
    if m == 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    cum = np.cumsum(costs)
    cuts = np.searchsorted(cum - costs / 2, np.cumsum(shares)[:-1])  # first item of slot j+1
    cuts = np.maximum.accumulate(np.clip(cuts, 0, n))
    out = np.searchsorted(cuts, np.arange(n), side="right").astype(np.int64)
    bounds = np.r_[0, cuts, n]
    reach = 0  # where the previous cut's window started: slot j's items lie from there on
    for j in range(m - 1):  # the cut between slots j and j + 1
        c = int(bounds[j + 1])
        a = max(c - window, (int(bounds[j]) + c) // 2)
        b = min(c + window, (c + int(bounds[j + 2])) // 2)
        if b <= a:
            continue
        win = np.arange(a, b)
        near = slice(min(reach, int(bounds[j])), max(b, c))  # every item of slot j, in order
        have = float(costs[near][out[near] == j].sum()) - float(costs[win][out[win] == j].sum())
        reach = a
        left = float(shares[j]) - have
        w = costs[win]
        side = np.ones(len(win), dtype=np.int64)
        order = np.argsort(-w, kind="stable").tolist()
        for i in order:  # largest first, never past the share
            if w[i] <= left:
                side[i] = 0
                left -= float(w[i])
        rest = [i for i in order if side[i]]
        if rest and left > 0 and float(w[rest[-1]]) < 2 * left:  # the smallest brings it closer
            side[rest[-1]] = 0
        out[win] = j + side
    return out


def contiguous(items: Items, unit: np.ndarray, k: int, merge: int = MERGE_ITEMS) -> np.ndarray:
    """Bin per item for a locality-aware plan: bins are consecutive runs of *units* (row groups).

    ``items`` are in file/row-group order and ``unit`` (non-decreasing) is each item's unit: the
    row group it is read from (row groups joined by an episode that spans them form one unit).
    Bin ``b`` takes the units whose cost lies in ``[b, b + 1) x total / k`` along that order. A unit
    that straddles a cut is divided among the bins on both sides into runs of consecutive items
    (see :func:`_cut_shares`): bins stay balanced to about one small item while each reads only a
    contiguous run of row groups, and in a shared one about its own rows.

    Runs of units holding fewer than MERGE_BELOW items are first joined into units of ``merge``
    items: with one episode per row group (LeRobot's recorder) cuts would otherwise round whole
    episodes, 2-8% above the mean at 16-80 episodes per bin even when cut optimally, and such
    row groups cost no extra reads when shared. Prepared row groups (~32 MiB) hold hundreds of
    episodes and are never joined.
    """
    n = len(items)
    out = np.zeros(n, dtype=np.int64)
    if k == 1 or n == 0:
        return out
    unit = np.asarray(unit, dtype=np.int64)
    _, unit = np.unique(unit, return_inverse=True)
    unit = unit.ravel()
    cost = items.cost
    target = float(cost.sum()) / k
    if target <= 0:  # all costs zero: count frames instead
        return contiguous(
            Items(
                items.episode, items.start, items.end, (items.end - items.start).astype(np.float64)
            ),
            unit,
            k,
        )
    unit_cost = np.bincount(unit, cost)
    count = np.bincount(unit)
    small = count < MERGE_BELOW
    if merge > 1 and small.any():  # join runs of near-single-episode units, merge items each
        new_run = ~small | np.r_[True, ~small[:-1]]
        run = np.cumsum(new_run)
        end = np.cumsum(count)
        run_start = (end - count)[new_run][run - 1]
        sub = np.where(small, (end - count - run_start) // merge, 0)
        key = np.stack([run, sub], axis=1)
        group = np.unique(key, axis=0, return_inverse=True)[1].ravel()
        unit = group[unit]
        unit_cost = np.bincount(unit, cost)
    hi = np.cumsum(unit_cost)
    lo = hi - unit_cost
    first = np.clip(np.floor(lo / target), 0, k - 1).astype(np.int64)
    last = np.clip(np.ceil(hi / target) - 1, 0, k - 1).astype(np.int64)
    last = np.maximum(last, first)
    out = first[unit]
    starts = np.searchsorted(unit, np.arange(len(unit_cost)))
    ends = np.searchsorted(unit, np.arange(len(unit_cost)), side="right")
    for u in np.flatnonzero(last > first).tolist():  # units shared by several bins
        b = np.arange(first[u], last[u] + 1)
        shares = np.minimum(hi[u], (b + 1) * target) - np.maximum(lo[u], b * target)
        shares[-1] = unit_cost[u] - shares[:-1].sum()  # absorb rounding in the open bin
        sel = slice(starts[u], ends[u])
        shares = np.clip(shares, 0.0, None)
        # runs of consecutive items unless that leaves a bin further off its share
        cut = _cut_shares(cost[sel], shares)
        off = np.abs(np.bincount(cut, cost[sel], len(b)) - shares).max()
        if off > CUT_SLACK * target:
            fill = _fill_shares(cost[sel], shares)
            if off > np.abs(np.bincount(fill, cost[sel], len(b)) - shares).max():
                cut = fill
        out[sel] = b[cut]
    return out


def partition_contiguous(
    items: Items, unit: np.ndarray, k: int, split_long: bool = False, tolerance: float = 1e-3
) -> tuple[Items, np.ndarray, str]:
    """Locality-aware partition (items in file/row-group order; see :func:`contiguous`).

    With ``split_long``, when whole items leave the largest bin more than ``tolerance`` above the
    mean, all items are laid end to end in file order and cut into ``k`` contiguous frame ranges
    of equal cost instead (each cut splits at most one episode; longer ones are cut more).
    """
    bins = contiguous(items, unit, k)
    if not split_long or len(items) == 0 or k == 1:
        return items, bins, "contiguous"
    target = float(items.cost.sum()) / k
    if np.bincount(bins, items.cost, minlength=k).max() <= target * (1 + tolerance):
        return items, bins, "contiguous"
    pieces, piece_bins = pour(items, np.zeros(k), target, order=np.arange(len(items)))
    return pieces, piece_bins, "contiguous-split"
