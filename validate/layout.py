"""Layout-quality checks (warnings; ``--strict`` makes them fail): row-group sizes, episodes
split across row groups, missing page index. Footers only, no data pages."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from episodekit.core import interrupt
from episodekit.core.band import read_marker, row_group_band
from episodekit.core.footer import FileLayout, file_layout
from episodekit.core.paths import DEFAULT_TARGET_MB, MIB
from episodekit.core.words import plural
from episodekit.validate.raw import WARNING, Finding, RawRoot

TARGET_BYTES = int(DEFAULT_TARGET_MB * MIB)


def groups_outside_band(lay: FileLayout, lo: int, hi: int) -> np.ndarray:
    """Indices of row groups outside [lo, hi]; exempt: the file's last group (it holds the rest)
    and a too-big group that holds one episode only (an episode is never split)."""
    b = lay.row_group_bytes
    n = len(b)
    small = b < lo
    big = b > hi
    if lay.episode_min is not None:
        single = lay.episode_min == lay.episode_max
        big &= ~single
        # A group just before an oversized one-episode group may stay small (prep's rule).
        small &= ~np.append((b[1:] > hi) & single[1:], False)
    out = small | big
    if n:
        out[n - 1] = big[n - 1]
    return np.flatnonzero(out)


def file_target(lay: FileLayout, default: int) -> int:
    """The target a file was rewritten for (prep's marker in the footer), else ``default``."""
    marker = read_marker(lay) or {}
    mb = marker.get("target_mb")
    return int(float(mb) * MIB) if isinstance(mb, (int, float)) and mb > 0 else default


def check_layout(
    raw: RawRoot, rels: Sequence[str], target_bytes: int = TARGET_BYTES
) -> list[Finding]:
    """``layout.row_groups``, ``layout.split_episode``, ``layout.page_index``, one per file."""
    out = []
    for rel in rels:
        try:
            lay = file_layout(raw.join(rel), raw.fs)
        except Exception:  # noqa: BLE001 - unreadable files are reported by data.read
            interrupt.check()  # Ctrl-C that a library turned into an error: not the file's fault
            continue
        lo, hi = row_group_band(file_target(lay, target_bytes))
        n = lay.num_row_groups
        bad = groups_outside_band(lay, lo, hi)
        if len(bad):
            b = lay.row_group_bytes / MIB
            out.append(
                Finding(
                    "layout.row_groups",
                    WARNING,
                    f"{len(bad)} of {plural(n, 'row group')} outside "
                    f"[{lo / MIB:.0f}, {hi / MIB:.0f}] MiB "
                    f"(min {b.min():.2f}, median {np.median(b):.2f}, max {b.max():.2f} MiB); "
                    f"run `episodekit prep rowgroups {raw.root}`",
                    rel,
                )
            )
        if lay.episode_min is None:
            if n > 1:
                out.append(
                    Finding(
                        "layout.split_episode",
                        WARNING,
                        "no episode_index statistics: readers cannot prune row groups",
                        rel,
                    )
                )
        else:
            split = np.flatnonzero(lay.episode_max[:-1] == lay.episode_min[1:])
            if len(split):
                eps = lay.episode_max[split]
                out.append(
                    Finding(
                        "layout.split_episode",
                        WARNING,
                        f"{plural(len(split), 'episode')} split across row groups: "
                        f"{eps[:10].tolist()}",
                        rel,
                        int(eps[0]),
                    )
                )
        if not lay.has_page_index:
            out.append(
                Finding("layout.page_index", WARNING, "no page index (column/offset index)", rel)
            )
    return out
