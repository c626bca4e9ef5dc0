"""The benchmarks' baseline for random frame access: the same columns fully in RAM (numpy), with
LeRobot's delta windows (clamped to the episode, ``{key}_is_pad`` where the query left it)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def window_readers(
    cols: dict[str, np.ndarray],
    plain: list[str],
    offs: dict[str, np.ndarray],
    start: np.ndarray,
    end: np.ndarray,
) -> tuple[Callable[[int], dict], Callable[[np.ndarray], dict]]:
    """``(item(i), batch(indices))`` over in-memory columns; ``start``/``end``: each frame's
    episode bounds (global frame indices)."""

    def item(i: int) -> dict:
        out = {c: cols[c][i] for c in plain}
        s, e = start[i], end[i]
        for k, off in offs.items():
            q = off + i
            out[k] = cols[k][np.minimum(np.maximum(q, s), e - 1)]
            out[f"{k}_is_pad"] = (q < s) | (q >= e)
        return out

    def batch(b: np.ndarray) -> dict:
        out = {c: cols[c][b] for c in plain}
        s, e = start[b][:, None], end[b][:, None]
        for k, off in offs.items():
            q = b[:, None] + off
            qc = np.minimum(np.maximum(q, s), e - 1)
            out[k] = cols[k][qc]
            out[f"{k}_is_pad"] = qc != q
        return out

    return item, batch
