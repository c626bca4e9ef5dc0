"""Reading an RLDS dataset: episodekit's TensorFlow-free reader against TFDS, in one run.

Both read every episode of the same TFDS folder; the ratio is episodes/s (ours / TFDS's). Two
cases: ``decode`` (every image decoded to pixels: TFDS's default ``as_dataset``, our
``Images.frames()`` with Pillow) and ``bytes`` (images kept encoded: TFDS with
``tfds.decode.SkipDecoding()``, our ``read`` as the import uses it for lossless copies). TFDS is
read two ways: per step as converters do (``for step in episode["steps"]``, the openx2lerobot /
port_droid way) and batched (``steps`` turned into whole-episode tensors inside tf.data, TFDS's
fastest form). TFDS runs in its own venv (``--tfds-python``), each case in a fresh process; the
timings exclude importing TensorFlow but include opening the builder, as ours include listing
the shards. Each side runs once unmeasured first (page cache). Ours runs in one thread; tf.data
uses every core, hence the CPU-second ratio too.

    make the data (once, in a venv with tensorflow-cpu + tensorflow-datasets):
        TFDS_PY/bin/python tests/fixtures/import/rlds/make_rlds_fixture.py \
            --episodes 300 --size 64 --shards 4 --out DIR --no-expected
    measure:
        .venv/bin/python scripts/bench_rlds_read.py DIR/ek_rlds_fixture/1.0.0 \
            --tfds-python TFDS_PY/bin/python [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
import tensorflow as tf
import tensorflow_datasets as tfds
root, mode, decode = sys.argv[1], sys.argv[2], sys.argv[3] == "decode"
t0, c0 = time.perf_counter(), time.process_time()
builder = tfds.builder_from_directory(root)
decoders = None
if not decode:
    cams = {k: tfds.decode.SkipDecoding() for k, f in
            builder.info.features["steps"]["observation"].items()
            if isinstance(f, tfds.features.Image)}
    decoders = {"steps": {"observation": cams}}
ds = builder.as_dataset(split="train", shuffle_files=False, decoders=decoders)
episodes = steps = 0
if mode == "steps":
    for ep in ds:
        for step in ep["steps"].as_numpy_iterator():
            steps += 1
        episodes += 1
else:
    ds = ds.map(lambda ep: {**ep, "steps": ep["steps"].batch(1 << 20).get_single_element()})
    for ep in tfds.as_numpy(ds):
        steps += len(ep["steps"]["is_first"])
        episodes += 1
print(json.dumps({"episodes": episodes, "steps": steps, "seconds": time.perf_counter() - t0,
                  "cpu": time.process_time() - c0}))
"""


def tfds_read(python: str, root: str, mode: str, decode: bool) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    out = subprocess.run(
        [python, "-c", CHILD, root, mode, "decode" if decode else "bytes"],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def ours_read(root: str, decode: bool) -> dict:
    from episodekit.importers.rlds import RldsReader

    t0, c0 = time.perf_counter(), time.process_time()
    reader = RldsReader(root)
    episodes = steps = 0
    for ref in reader.episodes():
        ep = reader.read(ref)
        if decode:
            for images in ep.images.values():
                for _ in images.frames():
                    pass
        steps += ep.length
        episodes += 1
    return {
        "episodes": episodes,
        "steps": steps,
        "seconds": time.perf_counter() - t0,
        "cpu": time.process_time() - c0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", help="a TFDS dataset folder (<name>/<version>)")
    ap.add_argument("--tfds-python", required=True, help="python of a venv with TFDS")
    ap.add_argument("--rounds", type=int, default=3, help="median of this many runs per case")
    args = ap.parse_args()
    rows = []
    for decode in (False, True):
        case = "decode" if decode else "bytes"
        ours_read(args.root, decode)  # warm the page cache
        ours = [ours_read(args.root, decode) for _ in range(args.rounds)]
        eps = ours[0]["episodes"]
        ours_s = statistics.median(r["seconds"] for r in ours)
        ours_c = statistics.median(r["cpu"] for r in ours)
        for mode in ("steps", "batched"):
            tfds_read(args.tfds_python, args.root, mode, decode)
            theirs = [tfds_read(args.tfds_python, args.root, mode, decode)
                      for _ in range(args.rounds)]  # fmt: skip
            if any(r["episodes"] != eps or r["steps"] != ours[0]["steps"] for r in theirs):
                sys.exit(f"TFDS read {theirs[0]['episodes']} episodes / {theirs[0]['steps']} "
                         f"steps, ours {eps} / {ours[0]['steps']}")  # fmt: skip
            tfds_s = statistics.median(r["seconds"] for r in theirs)
            tfds_c = statistics.median(r["cpu"] for r in theirs)
            rows.append((case, mode, eps, ours_s, tfds_s, tfds_c / ours_c))
    print(f"{'images':<8}{'TFDS as':<9}{'episodes':>9}{'ours ep/s':>11}{'TFDS ep/s':>11}"
          f"{'ratio':>8}{'per CPU-s':>11}")  # fmt: skip
    for case, mode, eps, ours_s, tfds_s, cpu in rows:
        print(f"{case:<8}{mode:<9}{eps:>9}{eps / ours_s:>11.1f}{eps / tfds_s:>11.1f}"
              f"{tfds_s / ours_s:>7.2f}x{cpu:>10.2f}x")  # fmt: skip
    print(
        f"(load average {os.getloadavg()[0]:.1f}; ratio: episodes/s ours / TFDS's, wall; "
        "per CPU-s: TFDS's CPU seconds / ours, TF's threads included)"
    )


if __name__ == "__main__":
    main()
