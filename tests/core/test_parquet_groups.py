"""The packed row groups of a salvage (core/parquet_groups.py): every group reads back as it
was appended, across compressed blocks, as a prefix, pickled, and without its structs."""

from __future__ import annotations

import pickle

import numpy as np

from episodekit.core.parquet_groups import BLOCK, Group, Groups


def _made(n: int) -> list[Group]:
    rng = np.random.default_rng(7)
    out, at = [], 4
    for i in range(n):
        size = int(rng.integers(0, 900))
        meta = bytes(rng.integers(0, 4, size, dtype=np.uint8)) + i.to_bytes(4, "little")
        rows = int(rng.integers(1, 20))
        out.append(Group(at, at + 100 + size, rows, meta))
        at += 100 + size
    return out


def test_groups_read_back_as_appended_across_blocks():
    made = _made(2 * BLOCK + 37)
    g = Groups(made)
    assert len(g) == len(made) and g == made and list(g) == made
    for i in (0, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, len(made) - 1, -1):
        assert g[i] == made[i], i
    assert list(g.structs()) == [m.meta for m in made]
    assert g.structs()[BLOCK + 3] == made[BLOCK + 3].meta
    assert g.rows().tolist() == [m.num_rows for m in made]
    assert g.last_end() == made[-1].end
    for n in (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, len(made)):
        assert list(g[:n]) == made[:n], n
        assert list(g[:n].structs()) == [m.meta for m in made[:n]], n
    assert list(g[3 : 2 * BLOCK : 5]) == made[3 : 2 * BLOCK : 5]
    assert pickle.loads(pickle.dumps(g)) == made
    bare = g.places()
    assert [(x.start, x.end, x.num_rows) for x in bare] == [m[:3] for m in made]
    assert all(x.meta == b"" for x in bare)
    assert g != made[:-1] and Groups() == []


def test_groups_compress_the_structs():
    """Structs that repeat but for a few bytes (a footer's) are held compressed."""
    head = bytes(range(256)) * 3
    made = [Group(i, i + 1, 1, head + i.to_bytes(4, "little")) for i in range(4 * BLOCK)]
    g = Groups(made)
    held = g.spilled_bytes() + g.held_bytes()
    assert held < sum(len(m.meta) for m in made) / 5
    assert g == made


def test_groups_spill_full_blocks_to_disk():
    """Only the last, partial block's structs stay in memory (issue 49: the structs of a
    100,000-episode recording, even compressed, were ~30 MB held): the full blocks are read
    back from a temporary file, also through a prefix and a pickle."""
    made = _made(3 * BLOCK + 5)
    g = Groups(made)
    assert g.held_bytes() == sum(len(m.meta) for m in made[3 * BLOCK :])
    assert g.spilled_bytes() > 0 and g == made
    assert list(g[: 2 * BLOCK + 1]) == made[: 2 * BLOCK + 1]
    again = pickle.loads(pickle.dumps(g))
    assert again == made and again.held_bytes() == g.held_bytes()


def test_groups_hold_values_past_uint32():
    """A group's length or rows past 2**32 (held as uint32 while they fit) read back."""
    big = 1 << 33
    made = [Group(4, 10, 3, b"a"), Group(10, 10 + big, big, b"bc"), Group(big, big + 1, 1, b"")]
    made += _made(BLOCK + 1)
    g = Groups(made)
    assert list(g) == made and g.rows().tolist() == [m.num_rows for m in made]
    assert pickle.loads(pickle.dumps(g)) == made and list(g[:2]) == made[:2]
