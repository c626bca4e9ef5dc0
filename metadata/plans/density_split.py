"""Equal frames *and* equal cost per bin: the two-ended density split of one source.

A mixture bin draws a fixed number of samples from each source per epoch (``bin_draws``), so
for every frame to be drawn as often as its source's quota says, each bin needs its equal share
of the source's frames; for the bins' work per epoch to be equal, each share also needs the
source's mean cost per frame. LPT by cost gives the second only (a bin of cheap frames holds
more of them, and draws each one less often). When the cost per frame varies (``bytes``,
``compute``, ``decode`` models), this split gives both:

1. Sort the episodes by cost per frame (stable; ties by episode index) and view them as one
   line of frames, each frame carrying its episode's density (a piece of an episode costs its
   frames' share of the episode's cost).
2. For each bin in turn, with ``F`` its frames: take ``x`` frames from the low-density end of
   what remains and ``F - x`` from the high-density end. Taking more from the low end lowers
   the cost monotonically, so the ``x`` that brings the bin's cost nearest its target is found
   on the cumulative costs (``np.searchsorted``, then linear inside one segment), at frame
   granularity. The target is ``F x`` the global mean density minus the error carried from the
   bins before (cost taken so far minus frames taken so far x the mean), so errors do not
   accumulate: a bin is off the mean by at most its own and its predecessor's rounding, about
   one frame's cost (more only when what remains cannot reach the target, e.g. the remainder
   is one episode of a single density; the carry then goes to the last bin).
3. Each bin gets two intervals of the line, so a source is cut at most twice per bin.

The line's order, not the file's, decides which episodes share a bin: locality is given up
(``--locality rowgroup`` keeps contiguous row groups and cannot also give every bin equal
frames and equal cost; mixtures keep LPT/row-group cuts there).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import numpy as np

from episodekit.metadata.plans.build import _check_args, relabel_bins
from episodekit.metadata.plans.document import plan_document
from episodekit.metadata.plans.options import BuildParams
from episodekit.metadata.plans.plan_file import PlanHeader

ALGO = "density"


def constant_density(costs: np.ndarray, lengths: np.ndarray, rtol: float = 1e-9) -> bool:
    """True when every (non-empty) episode has the same cost per frame, within ``rtol``: the
    ``frames`` model, where balancing cost already balances frames."""
    lengths = np.asarray(lengths, dtype=np.int64)
    keep = lengths > 0
    if keep.sum() < 2:
        return True
    d = np.asarray(costs, dtype=np.float64)[keep] / lengths[keep]
    return bool(d.max() - d.min() <= rtol * max(abs(d.max()), abs(d.min())))


def equal_shares(frames: int, bins: int, first: np.ndarray | None = None) -> np.ndarray:
    """``floor`` or ``ceil`` of ``frames / bins`` per bin, summing to ``frames``; the ``ceil``
    ones go to the bins listed first in ``first`` (a permutation of the bins; default 0, 1...)."""
    out = np.full(bins, frames // bins, dtype=np.int64)
    order = np.arange(bins) if first is None else np.asarray(first, dtype=np.int64)
    out[order[: frames % bins]] += 1
    return out


def density_split(
    lengths: np.ndarray, costs: np.ndarray, bin_frames: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Split episodes (``lengths``, ``costs``, given in any order) into ``len(bin_frames)``
    bins holding exactly ``bin_frames[b]`` frames each, at near-equal cost (see the module
    docstring). Returns ``(items, bin_of)``: items (m, 3) int64 rows (episode position in the
    input, start, end), one per (bin, episode) run, and each item's bin. Episodes of length 0
    go to bin 0 as an empty item."""
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = np.asarray(costs, dtype=np.float64)
    bin_frames = np.asarray(bin_frames, dtype=np.int64)
    B = len(bin_frames)
    live = np.flatnonzero(lengths > 0)
    N = int(lengths.sum())
    if int(bin_frames.sum()) != N or (bin_frames < 1).any():
        raise ValueError(f"bin frames must be >= 1 each and sum to the {N} frames")
    density = costs[live] / lengths[live]
    order = live[np.lexsort((live, density))]  # by density, ties by position (episode index)
    ln, dens = lengths[order], costs[order] / lengths[order]
    cf = np.concatenate([[0], np.cumsum(ln)])  # frame where each sorted episode starts
    cc = np.concatenate([[0.0], np.cumsum(ln * dens)])  # cost before it
    mean = float(cc[-1]) / N
    # One pass per bin, on Python scalars: a search over x costs a few lookups, far fewer
    # than numpy calls on the bin's breakpoints would. A sentinel (density 0 past the end)
    # makes at(N) need no clamp.
    cfl, ccl, dl = cf.tolist(), cc.tolist(), dens.tolist() + [0.0]

    def at(p: int) -> float:  # cost of the first p frames of the line
        j = bisect_right(cfl, p) - 1
        return ccl[j] + (p - cfl[j]) * dl[j]

    def take(lo: int, hi: int, F: int, target: float) -> tuple[int, float]:
        """x (frames from the low end; F - x from the high end) whose cost is nearest
        ``target``, and that cost. The cost does not increase with x and is linear between
        episode boundaries: interpolation search (exact in two steps once the bracket lies in
        one linear piece), halving instead when a step shrinks the bracket less than half."""
        mid, const = hi - F, at(hi) - at(lo)
        a, z = 0, F
        fa, fz = const + at(lo) - at(mid), const + at(lo + F) - at(hi)
        if target >= fa:
            return 0, fa
        if target <= fz:
            return F, fz
        halve = False
        while z - a > 1:  # cost(a) > target >= cost(z)
            width = z - a
            if halve:
                m = (a + z) // 2
            else:
                m = a + int((fa - target) / (fa - fz) * width)
                m = min(max(m, a + 1), z - 1)
            fm = const + at(lo + m) - at(mid + m)
            if fm <= target:
                z, fz = m, fm
            else:
                a, fa = m, fm
            halve = not halve and 2 * (z - a) > width
        return (a, fa) if fa - target < target - fz else (z, fz)

    lo_cut = np.zeros(B, np.int64)  # bin b takes [lo_b, lo_b + x_b) and [hi_b - y_b, hi_b)
    x_of = np.zeros(B, np.int64)
    hi_cut = np.zeros(B, np.int64)
    lo, hi, carry = 0, N, 0.0
    for b, F in enumerate(bin_frames.tolist()):
        x, taken = take(lo, hi, F, F * mean - carry)
        carry += taken - F * mean
        lo_cut[b], x_of[b], hi_cut[b] = lo, x, hi
        lo += x
        hi -= F - x

    # intervals of the line -> (episode, start, end) runs, vectorized
    a = np.concatenate([lo_cut, hi_cut - (bin_frames - x_of)])
    z = np.concatenate([lo_cut + x_of, hi_cut])
    ib = np.concatenate([np.arange(B), np.arange(B)])
    keep = z > a
    a, z, ib = a[keep], z[keep], ib[keep]
    first = np.searchsorted(cf, a, side="right") - 1
    final = np.searchsorted(cf, z, side="left") - 1
    count = final - first + 1
    rep = np.repeat(np.arange(len(a)), count)
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    e = first[rep] + within
    start = np.maximum(a[rep], cf[e]) - cf[e]
    end = np.minimum(z[rep], cf[e + 1]) - cf[e]
    bin_of = ib[rep]
    # a bin's two runs of one episode join when they touch (the last bin takes the rest)
    o = np.lexsort((start, e, bin_of))
    e, start, end, bin_of = e[o], start[o], end[o], bin_of[o]
    joins = np.r_[False, (bin_of[1:] == bin_of[:-1]) & (e[1:] == e[:-1]) & (start[1:] == end[:-1])]
    head = np.flatnonzero(~joins)
    tail = np.r_[head[1:], len(e)] - 1
    items = np.stack([order[e[head]], start[head], end[tail]], axis=1)
    bin_of = bin_of[head]
    empty = np.flatnonzero(lengths == 0)
    if len(empty):
        items = np.concatenate([items, np.stack([empty, 0 * empty, 0 * empty], axis=1)])
        bin_of = np.concatenate([bin_of, np.zeros(len(empty), np.int64)])
    return items.astype(np.int64), bin_of.astype(np.int64)


def build_density_plan(
    costs: np.ndarray,
    lengths: np.ndarray,
    world_size: int,
    num_workers: int,
    params: BuildParams | None = None,
    bin_frames: np.ndarray | None = None,
    **overrides: Any,
) -> dict:
    """A shard plan (the dict :func:`plans.build_plan` returns, ``algo_used`` ``density``) from
    :func:`density_split`: every bin ``bin_frames[b]`` frames (default the equal shares) at
    near-equal cost. ``params`` (keyword arguments override its fields): the ``seed``,
    ``episode_index``, ``policy``, ``cost_model`` and ``fingerprint`` of
    :class:`~episodekit.metadata.plans.options.BuildParams` (its algorithm, locality and
    ``split_long`` do not apply). ``relabel=False`` keeps the split's bin numbers (a mixture's
    stacking places them); else ranks and workers get seeded labels as in
    :func:`plans.build_plan`."""
    p = BuildParams.of(params, overrides)
    seed, policy, episode_index = p.seed, p.policy, p.episode_index
    costs = np.asarray(costs, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.int64)
    _check_args(costs, lengths, world_size, num_workers, "auto", policy)
    W, K = int(world_size), int(num_workers)
    B, n = W * K, len(costs)
    ep = np.arange(n, dtype=np.int64) if episode_index is None else np.asarray(episode_index)
    ep = ep.astype(np.int64)
    shares = equal_shares(int(lengths.sum()), B) if bin_frames is None else bin_frames
    rows, bin_of = density_split(lengths, costs, shares)
    if p.relabel:
        bin_of = relabel_bins(bin_of, seed, W, K)
    pos = rows[:, 0]
    o = np.lexsort((rows[:, 1], ep[pos], bin_of))
    pos, bin_of = pos[o], bin_of[o]
    items = np.stack([ep[pos], rows[o, 1], rows[o, 2]], axis=1)
    frames = items[:, 2] - items[:, 1]
    item_cost = costs[pos] * frames / np.maximum(lengths[pos], 1)  # pro rata, as verify_plan
    header = PlanHeader(W, K, "auto", p.cost_model, seed, True, policy, "none", p.fingerprint)
    return plan_document(
        items,
        bin_of,
        item_cost,
        (costs, lengths),
        header,
        algo_used={"ranks": ALGO, "workers": {ALGO: W}},
        split_episodes=int((np.bincount(pos, minlength=n) > 1).sum()),
    )
