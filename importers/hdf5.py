"""HDF5 readers: ALOHA's folders of ``episode_N.hdf5`` and robomimic's one-file datasets.

- ``aloha``: one file per episode, as ALOHA's ``record_episodes.py`` writes it: ``/action``
  ``(T, D)``, ``/observations/qpos``, ``qvel`` (and ``effort`` where recorded), and
  ``/observations/images/<camera>``: raw ``uint8 (T, H, W, 3)``, or JPEG-compressed (the file's
  ``compress`` attribute, a ``/compress_len`` dataset): ``uint8 (T, padded)`` rows holding each
  frame's JPEG bytes followed by zeros. A JPEG ends with ``FF D9``, so each frame's bytes are its
  row up to the last non-zero byte (``compress_len`` lists them per camera in the order the
  recorder created the cameras, which HDF5 does not keep). ALOHA records no rate: its control
  period is ``DT = 0.02`` s, the built-in map's ``fps = 50``.
- ``robomimic``: one file, ``data/demo_N/{actions, obs/*, rewards, dones, states}``; the ``data``
  group's ``env_args`` attribute (JSON) gives the control frequency (``env_kwargs.control_freq``)
  as fps and the environment's name as the task; ``mask/<split>`` lists demo names (bytes):
  each episode's splits become its ``split`` value (comma-joined), and the ``[source]`` option
  ``split = "train"`` imports only that split's demos.

h5py is the optional extra ``hdf5``. Reading is one episode at a time; a file HDF5 cannot read
(truncated, corrupt) is a :class:`~episodekit.importers.episode.SourceError` naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.importers.episode import (
    ArrayImages,
    EncodedImages,
    Key,
    RawEpisode,
    Reader,
    SourceError,
    need,
)

SIGNATURE = b"\x89HDF\r\n\x1a\n"
EXTRA = "hdf5"
ALOHA_FPS = 50  # ALOHA's DT = 0.02 s (its constants.py)
_EPISODE = re.compile(r"^episode_(\d+)\.hdf5$")
_DEMO = re.compile(r"^demo_(\d+)$")


def _is_hdf5(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == SIGNATURE
    except OSError:
        return False


def _h5py(fmt: str) -> Any:
    return need("h5py", fmt, EXTRA)


def _open(path: Path, fmt: str, episode: str | None = None) -> Any:
    """``path`` opened read-only (:class:`SourceError` naming it when HDF5 cannot)."""
    h5py = _h5py(fmt)
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise SourceError(f"not a readable HDF5 file ({_short(exc)})", str(path), episode) from None


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _read(ds: Any, path: Path, episode: str, key: str) -> np.ndarray:
    """A whole dataset as numpy (:class:`SourceError` naming file, episode and key)."""
    try:
        return np.asarray(ds[()])
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise SourceError(f"unreadable ({_short(exc)})", str(path), episode, key) from None


def _decode_jpeg(blob: bytes) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(blob)) as im:
        return np.asarray(im.convert("RGB"))


def _jpeg_blobs(rows: np.ndarray) -> list[bytes]:
    """Each padded row's JPEG bytes (up to its last non-zero byte), vectorized per episode."""
    nonzero = rows != 0
    width = rows.shape[1]
    ends = width - np.argmax(nonzero[:, ::-1], axis=1)
    ends[~nonzero.any(axis=1)] = 0
    return [rows[i, :e].tobytes() for i, e in enumerate(ends.tolist())]


def _image_key(name: str, ds: Any, decoded_shape: tuple[int, ...] | None = None) -> Key:
    if ds.ndim == 4:
        return Key(name, "image", "uint8", tuple(int(x) for x in ds.shape[1:]), "raw")
    return Key(name, "image", "uint8", tuple(decoded_shape or ()), "jpeg")


def _array_key(name: str, ds: Any) -> Key:
    return Key(name, "array", str(ds.dtype), tuple(int(x) for x in ds.shape[1:]))


# --------------------------------------------------------------------------------------------
# ALOHA


class AlohaReader(Reader):
    """A folder of ALOHA ``episode_N.hdf5`` files (see the module docstring)."""

    format = "aloha"
    extra = EXTRA

    @classmethod
    def detect(cls, src: Path) -> bool:
        if not src.is_dir():
            return False
        files = [p for p in src.iterdir() if _EPISODE.match(p.name)]
        return bool(files) and _is_hdf5(min(files))

    def episodes(self) -> list[str]:
        found = [
            (int(m.group(1)), p.name) for p in self.src.iterdir() if (m := _EPISODE.match(p.name))
        ]
        return [name for _, name in sorted(found)]

    def keys(self) -> dict[str, Key]:
        eps = self.episodes()
        if not eps:
            raise SourceError("no episode_N.hdf5 files", str(self.src))
        path = self.src / eps[0]
        with _open(path, self.format, eps[0]) as f:
            out: dict[str, Key] = {}
            for name in self._array_names(f):
                out[name] = _array_key(name, f[name])
            for name in self._image_names(f):
                ds = f[name]
                shape = None
                if ds.ndim == 2:
                    blob = _jpeg_blobs(np.asarray(ds[0:1]))[0]
                    shape = _decode_jpeg(blob).shape
                out[name] = _image_key(name, ds, shape)
        return out

    @staticmethod
    def _array_names(f: Any) -> list[str]:
        names = ["action"]
        obs = f.get("observations")
        if obs is not None:
            names += [f"observations/{k}" for k in ("qpos", "qvel", "effort") if k in obs]
        return [n for n in names if n in f]

    @staticmethod
    def _image_names(f: Any) -> list[str]:
        g = f.get("observations/images")
        return [] if g is None else [f"observations/images/{k}" for k in sorted(g)]

    def read(self, ref: str) -> RawEpisode:
        path = self.src / ref
        with _open(path, self.format, ref) as f:
            if "action" not in f:
                raise SourceError("no /action dataset", str(path), ref, "action")
            arrays = {n: _read(f[n], path, ref, n) for n in self._array_names(f)}
            length = len(arrays["action"])
            images: dict[str, Any] = {}
            for name in self._image_names(f):
                data = _read(f[name], path, ref, name)
                if data.ndim == 4:
                    images[name] = ArrayImages(data)
                elif data.ndim == 2:
                    images[name] = EncodedImages(_jpeg_blobs(data), "jpeg", _decode_jpeg)
                else:
                    raise SourceError(f"image dataset of shape {data.shape}", str(path), ref, name)
            meta = {k: _attr(v) for k, v in f.attrs.items()}
        return RawEpisode(source=ref, length=length, arrays=arrays, images=images, meta=meta)

    def default_map(self) -> dict[str, Any]:
        keys = self.keys()
        feats: dict[str, Any] = {
            "observation.state": {"keys": ["observations/qpos"]},
            "action": {"keys": ["action"]},
        }
        for part in ("qvel", "effort"):
            if f"observations/{part}" in keys:
                name = "observation.velocity" if part == "qvel" else "observation.effort"
                feats[name] = {"keys": [f"observations/{part}"]}
        for k, v in keys.items():
            if v.kind == "image":
                feats[f"observation.images.{k.rsplit('/', 1)[1]}"] = {"keys": [k]}
        feats = {k: v for k, v in feats.items() if all(x in keys for x in v["keys"])}
        return {
            "fps": ALOHA_FPS,
            "robot_type": "aloha",
            "task": {"text": self.src.resolve().name},
            "features": feats,
        }


def _attr(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


# --------------------------------------------------------------------------------------------
# robomimic


class RobomimicReader(Reader):
    """A robomimic HDF5 file (see the module docstring); option ``split``: import one mask."""

    format = "robomimic"
    extra = EXTRA

    @classmethod
    def detect(cls, src: Path) -> bool:
        if not src.is_file() or not _is_hdf5(src):
            return False
        with open(src, "rb") as f:
            head = f.read(1 << 20)
        return b"env_args" in head or b"demo_" in head

    def _file(self) -> Any:
        return _open(self.src, self.format)

    def _env_args(self, f: Any) -> dict[str, Any]:
        raw = f["data"].attrs.get("env_args") if "data" in f else None
        if raw is None:
            return {}
        try:
            doc = json.loads(_attr(raw))
        except ValueError:
            raise SourceError(
                "data attribute env_args is not JSON", str(self.src), None, "env_args"
            ) from None
        return doc if isinstance(doc, dict) else {}

    def _masks(self, f: Any) -> dict[str, set[str]]:
        if "mask" not in f:
            return {}
        return {k: {_attr(x) for x in np.asarray(f["mask"][k][()]).tolist()} for k in f["mask"]}

    def fps(self) -> float | None:
        with self._file() as f:
            freq = (self._env_args(f).get("env_kwargs") or {}).get("control_freq")
        return float(freq) if isinstance(freq, (int, float)) and freq > 0 else None

    def episodes(self) -> list[str]:
        with self._file() as f:
            if "data" not in f:
                raise SourceError("no data group (not a robomimic file)", str(self.src))
            demos = sorted((int(m.group(1)), k) for k in f["data"] if (m := _DEMO.match(k)))
            names = [k for _, k in demos]
            split = self.options.get("split")
            if split is not None:
                masks = self._masks(f)
                if split not in masks:
                    have = ", ".join(sorted(masks)) or "none"
                    raise SourceError(f"no mask/{split} (splits: {have})", str(self.src))
                names = [k for k in names if k in masks[split]]
        return names

    def keys(self) -> dict[str, Key]:
        names = self.episodes()
        if not names:
            raise SourceError("no data/demo_N groups", str(self.src))
        with self._file() as f:
            g = f["data"][names[0]]
            return dict(self._keys_of(g))

    @staticmethod
    def _keys_of(g: Any) -> Iterator[tuple[str, Key]]:
        for name in ("actions", "rewards", "dones", "states"):
            if name in g:
                yield name, _array_key(name, g[name])
        for k in sorted(g.get("obs", {})):
            ds = g["obs"][k]
            name = f"obs/{k}"
            if ds.dtype == np.uint8 and ds.ndim == 4 and ds.shape[-1] in (1, 3):
                yield name, _image_key(name, ds)
            else:
                yield name, _array_key(name, ds)

    def read(self, ref: str) -> RawEpisode:
        with self._file() as f:
            try:
                g = f["data"][ref]
            except KeyError:
                raise SourceError("no such demo", str(self.src), ref) from None
            arrays: dict[str, np.ndarray] = {}
            images: dict[str, Any] = {}
            for name, key in self._keys_of(g):
                data = _read(g[name], self.src, ref, name)
                if key.kind == "image":
                    images[name] = ArrayImages(data)
                else:
                    arrays[name] = data
            length = int(g.attrs.get("num_samples", len(arrays.get("actions", ()))))
            splits = sorted(k for k, v in self._masks(f).items() if ref in v)
        meta = {"split": ",".join(splits)}
        return RawEpisode(source=ref, length=length, arrays=arrays, images=images, meta=meta)

    def default_map(self) -> dict[str, Any]:
        keys = self.keys()
        with self._file() as f:
            env = self._env_args(f)
            has_masks = bool(self._masks(f))
        fps = self.fps()
        low_dim = [
            k
            for k, v in keys.items()
            if k.startswith("obs/") and v.kind == "array" and len(v.shape) <= 1
        ]
        feats: dict[str, Any] = {}
        if low_dim:
            feats["observation.state"] = {"keys": low_dim}
        if "states" in keys:
            feats["observation.environment_state"] = {"keys": ["states"]}
        feats["action"] = {"keys": ["actions"]}
        if "rewards" in keys:
            feats["next.reward"] = {"keys": ["rewards"]}
        if "dones" in keys:
            feats["next.done"] = {"keys": ["dones"]}
        for k, v in keys.items():
            if v.kind == "image":
                cam = k.split("/", 1)[1].removesuffix("_image")
                feats[f"observation.images.{cam}"] = {"keys": [k]}
        doc: dict[str, Any] = {}
        if fps is not None:
            doc["fps"] = fps
        doc["task"] = {"text": str(env.get("env_name") or self.src.stem)}
        doc["features"] = feats
        if has_masks:
            doc["episodes"] = {"meta": ["split"]}
        return doc
