"""Where an RLDS import's CPU goes beside the encoding (issue 46, the encode floor), piece by
piece, in CPU seconds of this process (``time.process_time``: other load changes it less than
wall time):

- per camera: decoding every image (``Images.frames()``, Pillow) and LeRobot's per-episode image
  stats of the decoded frames (``lerobot_image_stats`` of the sampled frames), as a camera
  process does them;
- the import's own process: ``run_import`` in this process (``--jobs 1``), its CPU without its
  camera processes, and the part of it spent in the numeric features' per-episode stats and in
  the episodes' sketch points (``EpisodeParts.add``).

    PY scripts/probe_import_pieces.py DIR/ek_rlds_fixture/1.0.0 [--work W]

Run it with two installs (main's venv python and a branch's) for a before/after: the script
uses whichever ``episodekit`` the python has installed. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("SVT_LOG", "1")


def camera_pieces(src: str) -> dict[str, dict[str, float]]:
    """Per camera: CPU seconds decoding its images, and computing its image stats."""
    from episodekit.importers.rlds import RldsReader
    from episodekit.metadata.lerobot_image_stats import lerobot_image_stats, sample_indices
    from episodekit.writers.camera_encoder import episode_frames

    reader = RldsReader(src)
    episodes = [reader.read(ref) for ref in reader.episodes()]
    out = {}
    for cam in episodes[0].images:
        first = next(episodes[0].images[cam].frames())
        feat = SimpleNamespace(name=cam, shape=first.shape, video="av1")
        t = time.process_time()
        frames = [episode_frames(feat, ep.images[cam], ep.length, ep.source) for ep in episodes]
        decode = time.process_time() - t
        t = time.process_time()
        for f in frames:
            lerobot_image_stats(f[sample_indices(len(f))])
        out[cam] = {
            "decode_cpu_s": round(decode, 2),
            "stats_cpu_s": round(time.process_time() - t, 2),
        }
        del frames
    return out


def own_process(src: str, work: Path) -> dict[str, float]:
    """The import's own process: its CPU seconds, and those of two of its pieces."""
    from episodekit.writers import import_parts, repair_schema
    from episodekit.writers.import_run import ImportOptions, run_import

    spent = {"numeric_stats_cpu_s": 0.0, "parts_add_cpu_s": 0.0}

    def timed(obj: object, name: str, key: str) -> None:
        f = getattr(obj, name)

        @functools.wraps(f)
        def g(*a, **k):
            t = time.process_time()
            try:
                return f(*a, **k)
            finally:
                spent[key] += time.process_time() - t

        setattr(obj, name, g)

    timed(repair_schema, "lerobot_episode_stats", "numeric_stats_cpu_s")
    timed(import_parts.EpisodeParts, "add", "parts_add_cpu_s")
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    t, w = time.process_time(), time.perf_counter()
    run_import(src, out, ImportOptions(fps=10))
    return {
        "import_cpu_s": round(time.process_time() - t, 2),
        "import_wall_s": round(time.perf_counter() - w, 2),
        **{k: round(v, 2) for k, v in spent.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src", help="a TFDS dataset folder (…/NAME/VERSION)")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="probe-import-"))
    work.mkdir(parents=True, exist_ok=True)
    result = {"cameras": camera_pieces(args.src), "own_process": own_process(args.src, work)}
    result["load"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(result))
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
