"""LeRobot's delta-window rules, written once: offsets of ``delta_timestamps`` (with its
checks), clamping to the episode with ``_is_pad``, and index validation. Pure numpy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from episodekit.loaders.options import DEFAULT_TOLERANCE_S


def delta_offsets(
    delta_timestamps: Mapping[str, Sequence[float]] | None,
    features: Mapping[str, Any],
    fps: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> dict[str, np.ndarray]:
    """Frame offsets ``round(delta * fps)`` per key, after LeRobot's checks (clear ValueErrors)."""
    out: dict[str, np.ndarray] = {}
    for key, deltas in (delta_timestamps or {}).items():
        if key not in features:
            raise ValueError(
                f"delta_timestamps key {key!r} is not a feature of this dataset "
                f"(features: {sorted(features)})"
            )
        if (features[key] or {}).get("dtype") == "language":
            raise ValueError(
                f"delta_timestamps key {key!r} is a language column: it is never windowed (each "
                "frame has its own list, as in LeRobot); remove it from delta_timestamps"
            )
        try:
            d = np.asarray(deltas, dtype=np.float64).ravel()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"delta_timestamps[{key!r}] must be numbers ({exc})") from exc
        if d.size == 0:
            raise ValueError(f"delta_timestamps[{key!r}] is empty")
        if not np.isfinite(d).all():
            raise ValueError(f"delta_timestamps[{key!r}] has {d[~np.isfinite(d)][0]!r}: not finite")
        x = d * fps
        off = np.round(x)
        bad = np.abs(x - off) / fps > tolerance_s
        if bad.any():
            raise ValueError(
                f"delta_timestamps[{key!r}] has {float(d[bad][0]):g} s, not a multiple of 1/fps "
                f"(fps={fps:g}) within tolerance_s={tolerance_s:g}"
            )
        out[key] = off.astype(np.int64)
    return out


def int_indices(indices: Any, what: str = "frame indices") -> np.ndarray:
    """``indices`` as int64, refusing floats/bools/objects the way ``ds[1.5]`` does (TypeError)
    instead of truncating them; numpy integer arrays pass unchanged."""
    arr = np.asarray(indices)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be integers, got dtype {arr.dtype} ({arr.ravel()[0]!r})")
    return arr.astype(np.int64, copy=False)


def clamp_to_episode(q: Any, s: Any, e: Any) -> tuple[np.ndarray, np.ndarray]:
    """LeRobot's padding rule, the one place it is written: frames ``q`` clamped to their
    episode ``[s, e)`` (a padded slot repeats the edge frame), and ``is_pad``: True exactly where
    ``q`` left the episode."""
    q = np.asarray(q)
    return np.minimum(np.maximum(q, s), e - 1), (q < s) | (q >= e)


def consecutive(off: np.ndarray) -> bool:
    """Offsets a, a+1, ..., b (a window of consecutive frames)."""
    return len(off) > 0 and bool(np.all(np.diff(off) == 1))


def clamped_window(
    g: np.ndarray, off: np.ndarray, s: np.ndarray, e: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Frames ``g + off`` clamped to each episode [s, e) and where they were clamped (is_pad).

    Only rows whose window leaves the episode are clamped (most windows lie inside).
    """
    q = g[:, None] + off[None, :]
    pad = np.zeros(q.shape, dtype=bool)
    rows = np.flatnonzero((g + off.min() < s[:, 0]) | (g + off.max() >= e[:, 0]))
    if rows.size:
        q[rows], pad[rows] = clamp_to_episode(q[rows], s[rows], e[rows])
    return q, pad
