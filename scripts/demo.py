"""The demo behind `make demo`: write a sample dataset, then run the main job on it."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path


def run(*args: str) -> None:
    print(f"\n$ episodekit {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "episodekit.cli", *args], check=True)
    print(f"({time.perf_counter() - t0:.1f}s)", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--root", required=True, help="Where to write the sample dataset.")
    p.add_argument("--episodes", type=int, default=2500)
    p.add_argument("--keep", action="store_true", help="Keep the sample afterwards.")
    a = p.parse_args()
    root = Path(a.root)
    try:
        run("sample", str(root), "--episodes", str(a.episodes), "--style", "edited")
        run("info", str(root), "--max-files", "5")
    finally:
        if not a.keep:
            shutil.rmtree(
                root.parent if root.parent.name.startswith("episodekit-demo") else root,
                ignore_errors=True,
            )


if __name__ == "__main__":
    main()
