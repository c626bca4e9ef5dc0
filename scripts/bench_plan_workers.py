"""``make_loader`` streaming with a plan made for another worker count (issue 38): in-process vs
2 workers over a plan for 1 worker vs 2 workers over a plan for 2, measured in the same run.

    .venv/bin/python scripts/bench_plan_workers.py [--episodes 400] [--repeat 2] [--dir DIR]

A sample root (``episodekit sample``'s writer, 30-frame windows on ``action``) is written to a
temporary folder (or ``--dir``), with shard plans for 1 and 2 workers. Each figure is frames/s
over one epoch after the first batch (worker start-up excluded); rounds alternate the cases and
ratios compare figures of the same round. The machine is shared: repeat.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

FPS = 30
DELTAS = {"action": [k / FPS for k in range(30)]}


def epoch_rate(root: str, plan, workers: int, batch: int) -> float:
    from episodekit.loaders.torch import make_loader

    with make_loader(root, plan, batch, workers, delta_timestamps=DELTAS) as loader:
        it = iter(loader)
        next(it)  # start-up and the first batch are not timed
        t0, frames = time.perf_counter(), 0
        for b in it:
            frames += len(b["index"])
        return frames / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=400)
    ap.add_argument("--length", type=int, default=300, help="mean episode length")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    from episodekit.loaders import load_plan
    from episodekit.metadata.plans.build import ensure_plans
    from episodekit.sample import write_sample

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = str(Path(tmp) / "root")
        write_sample(root, episodes=args.episodes, seed=7, mean_length=args.length)
        for k in (1, 2):
            ensure_plans(root, [1], k)
        plans = {k: load_plan(root, 1, k) for k in (1, 2)}
        print(f"{root}: {args.episodes} episodes, batches of {args.batch}")
        for r in range(args.repeat):
            base = epoch_rate(root, plans[1], 0, args.batch)
            one = epoch_rate(root, plans[1], 2, args.batch)
            two = epoch_rate(root, plans[2], 2, args.batch)
            print(
                f"round {r + 1}: in-process (plan for 1) {base:,.0f} frames/s; 2 workers, plan "
                f"for 1: {one:,.0f} ({one / base:.2f}x); 2 workers, plan for 2: {two:,.0f} "
                f"({two / base:.2f}x)",
                flush=True,
            )


if __name__ == "__main__":
    main()
