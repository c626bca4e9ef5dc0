"""Issue 28's cluster bar at full size: a 3-node Ray cluster on this machine runs `prepare
--executor ray` on a >= 2M-frame sample, once whole and once with a node killed while it runs a
task; both outputs must be byte-identical to a local run (every file, frame-store arrays too).

    .venv/bin/python scripts/bench_ray_cluster.py [--dir DIR] [--size 2m]

DIR as scripts/bench_data.py ($EPISODEKIT_BENCH, else ./bench-data); the sample is the one
scripts/bench_ray.py writes. Prints the digests' verdict and the times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "app"))
sys.path.insert(0, str(REPO / "scripts"))

from bench_ray import sample  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from test_ray_cluster import _busy_node, _finish, _outputs, _prepare  # noqa: E402

from episodekit.core.atomic import is_temp_name  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dir", default=os.environ.get("EPISODEKIT_BENCH", "bench-data"))
    ap.add_argument("--size", default="2m")
    args = ap.parse_args()
    src = sample(Path(args.dir), args.size).resolve()
    tmp = Path(tempfile.mkdtemp(dir=src.parent))
    try:
        t0 = time.perf_counter()
        _finish(_prepare(src, tmp / "local", tmp / "cache-local"))
        want = _outputs(tmp / "local", tmp / "cache-local")
        print(f"local: {len(want)} files in {time.perf_counter() - t0:.0f} s", flush=True)
        c = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "resources": {"node0": 1}, "include_dashboard": False},
        )
        for i in (1, 2):
            c.add_node(num_cpus=1, resources={f"node{i}": 1})
        c.wait_for_nodes()
        try:
            for kill in (False, True):
                t0 = time.perf_counter()
                out, cache = tmp / f"ray-{kill}", tmp / f"cache-{kill}"
                proc = _prepare(src, out, cache, "--executor", "ray", "--ray-address", c.address)
                killed = None
                while kill and killed is None and proc.poll() is None:
                    node = _busy_node(c)
                    if node is not None:
                        c.remove_node(node)
                        killed = node
                    time.sleep(0.02)
                _finish(proc)
                same = _outputs(out, cache) == want
                left = [p for p in out.rglob("*") if is_temp_name(p.name)]
                print(
                    f"3-node cluster{', a node killed mid-task' if killed else ''}: "
                    f"{'byte-identical' if same else 'DIFFERENT'} to local, {len(left)} "
                    f"temporaries left, {time.perf_counter() - t0:.0f} s",
                    flush=True,
                )
        finally:
            c.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
