"""The loaders' defaults a new user meets (issue 38): video decoded whenever PyAV is installed
(paths only on request), and their one write, the speed-percentiles file: announced in one line,
kept in memory on request (option or environment variable), and a read-only root (a real
read-only mount) gives the same samples with one warning."""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from episodekit.core.errors import EnvironmentProblem
from episodekit.loaders import ElasticLoader, FrameDataset, ShardedLoader, load_plan
from episodekit.metadata.plans.build import ensure_plans
from episodekit.metadata.plans.canonical import ensure_canonical_plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot"
SPEED = Path("meta") / "speed_percentiles.jsonl"
TOP = "observation.images.top"
HAS_AV = importlib.util.find_spec("av") is not None


def copy(name: str, dst: Path) -> Path:
    out = dst / name
    shutil.copytree(FIXTURES / name, out)
    return out


def wrote(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "wrote meta/speed_percentiles" in r.getMessage()
    ]


@pytest.mark.skipif(not HAS_AV, reason="PyAV (the [video] extra) not installed")
def test_video_is_decoded_by_default_in_every_loader(tmp_path):
    root = copy("vid24", tmp_path)
    ensure_plans(str(root), [1], 1)
    ensure_canonical_plan(str(root), 2)
    ds = FrameDataset(root)
    x = ds[10]
    assert x[TOP].dtype == np.uint8 and x[TOP].shape == (96, 128, 3)
    np.testing.assert_array_equal(x[TOP], FrameDataset(root, video_backend="pyav")[10][TOP])
    assert ds.get_batch([1, 2])[TOP].shape == (2, 96, 128, 3)
    paths = FrameDataset(root, video_backend="paths")[10][TOP]
    assert set(paths) == {"path", "timestamp"}
    assert set(FrameDataset(root, video_backend=None)[10][TOP]) == {"path", "timestamp"}
    batch = next(iter(ShardedLoader(root, load_plan(str(root), 1, 1), batch_size=4)))
    assert batch[TOP].dtype == np.uint8 and batch[TOP].shape == (4, 96, 128, 3)
    step = next(iter(ElasticLoader(root, micro_batch=2)))
    assert step[TOP].dtype == np.uint8
    if importlib.util.find_spec("torch") is not None:
        from episodekit.loaders.torch import make_loader

        with make_loader(root, None, 4, 0, access="random") as loader:
            assert str(next(iter(loader))[TOP].dtype) == "torch.uint8"


def test_without_pyav_video_comes_back_as_paths_with_one_warning(tmp_path, monkeypatch):
    root = copy("vid24", tmp_path)
    import episodekit.loaders.video as video

    def no_av():
        raise EnvironmentProblem("video needs PyAV")

    monkeypatch.setattr(video, "require_av", no_av)
    with pytest.warns(UserWarning, match=r"video features come back as \{path, timestamp\}: PyAV"):
        ds = FrameDataset(root, speed=False)
    assert set(ds[3][TOP]) == {"path", "timestamp"}


def test_the_speed_file_write_is_announced_once_and_can_be_turned_off(
    tmp_path, caplog, monkeypatch
):
    root = copy("rec40", tmp_path)
    with caplog.at_level(logging.WARNING, logger="episodekit.metadata.speed"):
        FrameDataset(root, speed="memory")
        assert not (root / SPEED).exists() and not wrote(caplog)
        monkeypatch.setenv("EPISODEKIT_SPEED_IN_MEMORY", "1")
        FrameDataset(root)
        assert not (root / SPEED).exists() and not wrote(caplog)
        monkeypatch.delenv("EPISODEKIT_SPEED_IN_MEMORY")
        FrameDataset(root)
        assert (root / SPEED).exists()
        FrameDataset(root)  # read, not written again
    (line,) = wrote(caplog)
    assert line.startswith(f"{root}: wrote meta/speed_percentiles.jsonl")
    assert "speed='memory'" in line and "EPISODEKIT_SPEED_IN_MEMORY=1" in line


READ_ONLY = """
import hashlib, json, sys, warnings
import numpy as np
from episodekit.loaders import FrameDataset

ds = FrameDataset(sys.argv[1], delta_timestamps={"action": [0.0, 1 / 30]})
h = hashlib.sha256()
for i in range(0, len(ds), 97):
    x = ds[i]
    h.update(x["action"].tobytes() + np.int64(x["speed"]).tobytes() + x["task"].encode())
print(json.dumps({"digest": h.hexdigest(), "n": len(ds)}))
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    r = subprocess.run(["unshare", "-r", "-m", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs unshare (a user + mount namespace)")
def test_a_read_only_root_gives_the_same_samples_with_one_warning(tmp_path):
    writable, mount = copy("rec40", tmp_path), tmp_path / "ro"
    mount.mkdir()
    script = tmp_path / "read.py"
    script.write_text(textwrap.dedent(READ_ONLY))
    ref = subprocess.run([sys.executable, str(script), str(writable)], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert ref.returncode == 0, ref.stderr
    assert "wrote meta/speed_percentiles.jsonl" in ref.stderr  # writable: written, announced
    (writable / SPEED).unlink()
    sh = (
        f"mount --bind {writable} {mount} && mount -o remount,bind,ro {mount} && "
        f"touch {mount}/probe 2>/dev/null && exit 9; "  # (the mount must really be read-only)
        f"exec {sys.executable} {script} {mount}"
    )
    ro = subprocess.run(["unshare", "-r", "-m", "sh", "-c", sh], capture_output=True, text=True,
                        timeout=300)  # fmt: skip
    assert ro.returncode == 0, ro.stderr
    assert json.loads(ro.stdout) == json.loads(ref.stdout)
    lines = [x for x in ro.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "read-only root" in lines[0] and "not written" in lines[0], lines
    assert not (writable / SPEED).exists()
