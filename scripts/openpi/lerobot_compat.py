"""Run openpi's ``convert_aloha_data_to_lerobot.py`` (next to this file, unchanged) under LeRobot
0.6.1: three module aliases for the LeRobot 0cf8648 names it imports (README.md here lists
them), then the script as ``__main__`` with this command's arguments.

    HF_LEROBOT_HOME=DIR LEROBOT_PY scripts/openpi/lerobot_compat.py --raw-dir SRC \
        --repo-id local/aloha --no-push-to-hub [--mode video]
"""

from __future__ import annotations

import runpy
import sys
import types
from pathlib import Path

import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset as LeRobotDataset061
from lerobot.utils.constants import HF_LEROBOT_HOME

SCRIPT = Path(__file__).resolve().parent / "convert_aloha_data_to_lerobot.py"
PENDING_TASK = "__task_set_by_save_episode__"


class LeRobotDataset(LeRobotDataset061):
    """0.6.1's dataset with 0cf8648's ``add_frame(frame)``, ``save_episode(task=)`` and
    ``consolidate()``."""

    def add_frame(self, frame: dict) -> None:
        feats = self.meta.features
        for k, v in frame.items():
            if isinstance(v, torch.Tensor) and feats[k]["dtype"] not in ("image", "video"):
                frame[k] = v.numpy().astype(feats[k]["dtype"])  # 0cf8648 cast when writing
        super().add_frame({**frame, "task": PENDING_TASK})

    def save_episode(self, task: str | None = None, **kw) -> None:
        buf = self.writer.episode_buffer
        buf["task"] = [task if t == PENDING_TASK else t for t in buf["task"]]
        super().save_episode(**kw)

    def consolidate(self, *_, **__) -> None:
        self.finalize()


def _module(name: str, **attrs) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod


def _no_download(*_, **__) -> None:
    sys.exit("lerobot_compat: --raw-dir does not exist (downloading raw data is not shimmed)")


_module("lerobot.common.datasets")
_module(
    "lerobot.common.datasets.lerobot_dataset",
    LEROBOT_HOME=HF_LEROBOT_HOME,
    LeRobotDataset=LeRobotDataset,
)
_module("lerobot.common.datasets.push_dataset_to_hub")
_module("lerobot.common.datasets.push_dataset_to_hub._download_raw", download_raw=_no_download)

if __name__ == "__main__":
    sys.argv[0] = str(SCRIPT)
    runpy.run_path(str(SCRIPT), run_name="__main__")
