"""A PyAV decoder left as cyclic garbage must not hang a forked child (a DataLoader worker)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("av")

CHILD = textwrap.dedent(
    """
    import gc, os, sys, time
    import numpy as np
    from episodekit.core.video import require_av

    av = require_av()
    path = sys.argv[1]
    with av.open(path, "w") as out:
        s = out.add_stream("libsvtav1", rate=30)
        s.width, s.height, s.pix_fmt = 64, 64, "yuv420p"
        for i in range(10):
            img = np.full((64, 64, 3), i * 20, np.uint8)
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(p)
        for p in s.encode():
            out.mux(p)
    gc.disable()  # the decoder stays garbage until someone collects it
    c = av.open(path)
    s = c.streams.video[0]
    s.thread_type = "AUTO"  # dav1d's threads: they exist in this process only
    next(c.decode(s))
    cycle = [c]
    cycle.append(cycle)
    del c, s, cycle
    pid = os.fork()
    if pid == 0:  # a forked worker that collects: frees the decoder here without its threads
        gc.collect()
        os._exit(0)
    start = time.time()
    while time.time() - start < 20:
        if os.waitpid(pid, os.WNOHANG)[0]:
            print("exited")
            sys.exit(0)
        time.sleep(0.05)
    os.kill(pid, 9)
    print("hung")
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")
def test_forked_child_does_not_hang_freeing_an_inherited_decoder(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "a.mp4")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "exited"
