"""One import camera process's memory against the frames in its current mp4, alone.

    .venv/bin/python scripts/bench_camera_memory.py [--frames 100000 265000] [--size 24x32]

For each N, a fresh process encodes N frames in episodes of 100 as an import's camera process
does (:func:`episodekit.writers.camera_encoder.encode_episode`: AV1, LeRobot's settings, the
frames of ``make_aloha_source.py``'s pattern without its noise) into one mp4, and prints its
VmRSS / VmHWM (``/proc/self/status``, the peak reset between phases) at start, after encoding
(the muxer's index in memory, the file not closed), after closing it and reading its frame count
back as the camera process does (:func:`~episodekit.writers.camera_encoder._close`), and after
the former read-back (PyAV's ``probe``) of the same file, for comparison.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

MIB = 1024.0  # /proc figures are in kB


def _status() -> str:
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, val = line.split(":", 1)
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(val.split()[0]) / MIB
    return f"rss {got['VmRSS']:6.1f} MiB  hwm {got['VmHWM']:6.1f} MiB"


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # VmHWM := VmRSS (Linux >= 4.0)
        f.write("5")


def _episode(h: int, w: int, steps: int, shift: int) -> np.ndarray:
    y, x = (np.mgrid[0:h, 0:w] // 4 * 4).astype(np.int32)
    s = np.arange(steps, dtype=np.int32)[:, None, None] + shift
    return np.stack([(x * 6 + s * 3), (y * 8 + s * 2), ((x + y) * 4 + s)], -1).astype(np.uint8)


def child(frames: int, h: int, w: int, out: str) -> None:
    """Encode ``frames`` frames into one mp4 under ``out``, printing memory per phase."""
    from episodekit.core.video import probe
    from episodekit.writers import camera_encoder as ce

    ce.MAX_FILE_FRAMES = frames + 1  # one file, whatever the bound
    cam = ce.Camera(SimpleNamespace(name="observation.images.cam", shape=(h, w, 3), video="av1"))
    eps = [_episode(h, w, 100, 100 * i) for i in range(4)]
    print(f"  start          {_status()}", flush=True)
    _reset_peak()
    for e in range(frames // 100):
        ce.encode_episode(cam, eps[e % 4], Path(out), 50, float("inf"))
    print(f"  encoded        {_status()}  ({cam.writer.bytes} bytes muxed)", flush=True)
    rel = cam.rel()
    _reset_peak()
    got = ce._close(cam, Path(out))
    print(f"  closed, read   {_status()}  ({got[1]} frames read back)", flush=True)
    _reset_peak()
    n = probe(str(Path(out) / rel)).num_frames
    print(f"  PyAV probe     {_status()}  ({n} frames)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, nargs="+", default=[100_000, 265_000])
    ap.add_argument("--size", default="24x32", help="HxW")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    h, w = (int(v) for v in a.size.split("x"))
    if a.child:
        return child(a.frames[0], h, w, a.out)
    for n in a.frames:
        print(f"{n} frames of {h}x{w}:", flush=True)
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, __file__, "--child", "--frames", str(n), "--size", a.size]
            subprocess.run([*cmd, "--out", out], check=True)


if __name__ == "__main__":
    main()
