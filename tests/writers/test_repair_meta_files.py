"""``repair_meta.meta_files`` (column operations) against the recorder's rule written as the
loop it replaced: a found row stays in its file; a row never written goes after the last found
one, to the next file when that one was closed (the recorder had rolled over)."""

from __future__ import annotations

import random
from types import SimpleNamespace as NS

import numpy as np

from episodekit.writers.repair_meta import meta_files, next_file


def _by_loop(plan) -> list[tuple[int, int]]:
    inv = plan.inventory
    chunks_size = int(inv.info.get("chunks_size") or 1000)
    out: list[tuple[int, int]] = []
    prev: tuple[int, int] | None = None
    closed = False
    for e in plan.kept:
        if e.source_row is not None:
            m = inv.episodes[int(plan.recovered.file_of[e.source_row])]
            prev, closed = (m.chunk, m.file), m.intact
        elif prev is None:
            prev, closed = (0, 0), False
        elif closed:
            prev, closed = next_file(*prev, chunks_size), False
        out.append(prev)
    return out


def test_meta_files_follow_the_recorders_rule():
    for seed in range(500):
        r = random.Random(seed)
        size = r.choice([1, 2, 3, 1000])
        files = [
            NS(chunk=r.randint(0, 2), file=r.randrange(size), intact=r.random() < 0.5)
            for _ in range(r.randint(1, 4))
        ]
        n = r.randint(0, 12)
        file_of = np.sort(np.array([r.randrange(len(files)) for _ in range(n)], np.int32))
        rows = list(range(n))
        kept = [
            NS(source_row=rows.pop(0) if rows and r.random() < 0.6 else None)
            for _ in range(r.randint(0, 15))
        ]
        plan = NS(
            inventory=NS(episodes=files, info={"chunks_size": size}),
            recovered=NS(file_of=file_of) if n else None,
            kept=kept,
        )
        got = [tuple(p) for p in meta_files(plan).tolist()]
        assert got == _by_loop(plan), seed
