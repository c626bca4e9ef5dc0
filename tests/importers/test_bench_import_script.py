"""``scripts/bench_import.py``'s pieces on the committed RLDS fixture (the bench itself is not run
here): the encode floor gets every frame the import decodes, and encodes one packet per frame."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
RLDS = REPO / "tests/fixtures/import/rlds/ek_rlds_fixture"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_import", REPO / "scripts/bench_import.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_decode_then_encode_every_frame(tmp_path: Path) -> None:
    pytest.importorskip("google_crc32c")
    av = pytest.importorskip("av")
    bench = _bench()
    raws = bench.decode_frames(str(RLDS / "1.0.0"), tmp_path)
    expected = json.loads((RLDS / "expected.json").read_text())["episodes"]
    steps = sum(e["length"] for e in expected)
    assert sorted(raws) == ["observation/image", "observation/wrist_image"]
    for raw, frames, shape in raws.values():
        assert (frames, shape) == (steps, (32, 32, 3))
        assert raw.stat().st_size == steps * 32 * 32 * 3
    raw, frames, (h, w, _) = raws["observation/wrist_image"]
    out = tmp_path / "wrist.mp4"
    bench.encode_raw(str(raw), str(out), h, w, 10)
    with av.open(str(out)) as c:
        stream = c.streams.video[0]
        assert stream.codec_context.name == "libsvtav1" or "av1" in stream.codec_context.name
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(stream)]
    assert len(decoded) == steps
    source = np.fromfile(raw, np.uint8).reshape(-1, h, w, 3)
    mse = np.mean((np.stack(decoded).astype(float) - source) ** 2)
    assert 10 * np.log10(255**2 / mse) > 25  # the same frames, lossy at crf 30


def test_table_ratios() -> None:
    bench = _bench()
    ours = {"tool": "ours", "seconds": 10.0, "cpu_s": 15.0, "tree_mib": 100.0}
    theirs = {"tool": "theirs", "seconds": 80.0, "cpu_s": 160.0, "tree_mib": 800.0}
    text = bench.table([ours, theirs], ours)
    assert "| theirs | 80.0 | 160.0 | 800 | 8.00x | 0.125 |" in text
    assert bench.ratio(1.0, 0.0) == 0.0
