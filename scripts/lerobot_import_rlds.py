"""RLDS -> LeRobot v3.0 the way users convert today (openx2lerobot, lerobot's
`examples/port_datasets/port_droid.py`): TFDS reads each episode, step by step, in the same
process as LeRobot 0.6.1 writes it with `LeRobotDataset.create` / `add_frame` / `save_episode`,
then `finalize`. The baseline of `scripts/bench_import.py`; run by LeRobot's python, in a venv
with `lerobot[dataset]==0.6.1`, `tensorflow-cpu` and `tensorflow-datasets`:

    LR61/bin/python scripts/lerobot_import_rlds.py DIR/ek_rlds_fixture/1.0.0 OUT [--fps 10]

The features are those `episodekit import` writes from the same source with its default map:
`observation.state`, `action`, each image feature as a video (LeRobot's default encoder), the
reward as `next.reward`, the task from `language_instruction`. LeRobot's defaults otherwise
(`create` with no image-writer threads, as port_droid calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", help="a TFDS dataset folder (NAME/VERSION)")
    ap.add_argument("out", help="the LeRobot root to write (must not exist)")
    ap.add_argument("--fps", type=int, default=10)
    ap.add_argument("--episodes", type=int, default=None, help="only the first N")
    args = ap.parse_args()

    import numpy as np
    import tensorflow as tf
    import tensorflow_datasets as tfds
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    tf.config.set_visible_devices([], "GPU")
    t0 = time.perf_counter()
    builder = tfds.builder_from_directory(args.src)
    obs = builder.info.features["steps"]["observation"]
    cameras = [k for k, f in obs.items() if isinstance(f, tfds.features.Image)]
    features = {
        "observation.state": {"dtype": "float32", "shape": tuple(obs["state"].shape),
                              "names": None},
        "action": {"dtype": "float32",
                   "shape": tuple(builder.info.features["steps"]["action"].shape), "names": None},
        "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
    }  # fmt: skip
    for cam in cameras:
        features[f"observation.images.{cam}"] = {
            "dtype": "video",
            "shape": tuple(obs[cam].shape),
            "names": ["height", "width", "channels"],
        }
    dataset = LeRobotDataset.create(
        repo_id="bench/rlds", fps=args.fps, features=features, root=args.out, use_videos=True
    )
    episodes = frames = 0
    for episode in builder.as_dataset(split="train", shuffle_files=False):
        if args.episodes is not None and episodes >= args.episodes:
            break
        for step in episode["steps"].as_numpy_iterator():
            frame = {
                "observation.state": step["observation"]["state"],
                "action": step["action"],
                "next.reward": np.asarray([step["reward"]], dtype=np.float32),
                "task": step["language_instruction"].decode(),
            }
            for cam in cameras:
                frame[f"observation.images.{cam}"] = step["observation"][cam]
            dataset.add_frame(frame)
            frames += 1
        dataset.save_episode()
        episodes += 1
    dataset.finalize()
    print(json.dumps({"episodes": episodes, "frames": frames,
                      "seconds": round(time.perf_counter() - t0, 2)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
