"""zarr reader: diffusion policy's and UMI's ``ReplayBuffer`` layout.

A zarr group (zarr format 2 or 3; a folder, or a ``.zarr.zip`` ZipStore as UMI ships it)
holding ``data/<key>``: every step of every episode concatenated on the leading axis, and
``meta/episode_ends``: int64 cumulative ends (episode ``i`` is steps ``ends[i-1]:ends[i]``).
Arrays of ``uint8 (T, H, W, 3)`` are cameras (``img``, UMI's ``camera0_rgb``); UMI compresses
them with imagecodecs' JPEG-XL numcodecs codec (``imagecodecs_jpegxl``, reported as encoding
``jxl``; its codecs are registered only when a store names one). Everything else is an array
key (``state``, ``action``, UMI's ``robot0_eef_pos``...). The layout records no rate: the map's
``fps`` or ``--fps`` says.

Read with the ``zarr`` library (3.x reads formats 2 and 3) and ``imagecodecs``: the optional
extra ``zarr``. One episode's slice is read at a time (the chunks it touches); a chunk that
does not decode (or a Blosc chunk whose length is not its header's: c-blosc would read past
it) is a :class:`~episodekit.importers.episode.SourceError` naming the store, the episode and
the key, as are episode ends that decrease and arrays shorter or longer than the last end. A
chunk that is not stored reads as zarr's fill value (zarr 3 does not write all-fill chunks).
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from episodekit.importers.episode import (
    ArrayImages,
    Key,
    MissingExtra,
    RawEpisode,
    Reader,
    SourceError,
    need,
)

EXTRA = "zarr"
ENDS = "meta/episode_ends"
JXL = "imagecodecs_jpegxl"
_META_NAMES = (".zarray", "zarr.json", ".zmetadata")
_UMI_STATE = re.compile(r"^data/robot(\d+)_(eef_pos|eef_rot_axis_angle|gripper_width)$")
_UMI_ORDER = ("eef_pos", "eef_rot_axis_angle", "gripper_width")


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:200]


def _is_zip(src: Path) -> bool:
    return src.is_file() and zipfile.is_zipfile(src)


def _zip_names(src: Path) -> list[str]:
    try:
        with zipfile.ZipFile(src) as z:
            return z.namelist()
    except (OSError, zipfile.BadZipFile):
        return []


def _metadata_texts(src: Path) -> list[bytes]:
    """The store's array and consolidated metadata documents (small JSON files), read
    without zarr: which codecs the store names, before zarr parses them."""
    if _is_zip(src):
        with zipfile.ZipFile(src) as z:
            return [z.read(n) for n in z.namelist() if n.rsplit("/", 1)[-1] in _META_NAMES]
    return [p.read_bytes() for p in src.rglob("*") if p.name in _META_NAMES and p.is_file()]


class ZarrReader(Reader):
    """A ``ReplayBuffer`` zarr store (see the module docstring)."""

    format = "zarr"
    extra = EXTRA

    def __init__(self, src: str | Path, options: dict[str, Any] | None = None) -> None:
        super().__init__(src, options)
        self._root: Any = None
        self._store: Any = None
        self._ends: np.ndarray | None = None
        self._zip: zipfile.ZipFile | None = None
        self._data: dict[str, Any] | None = None
        self._keys: dict[str, Key] | None = None

    def __getstate__(self) -> dict[str, Any]:  # a worker reopens the store
        return {**self.__dict__, "_root": None, "_store": None, "_zip": None, "_data": None}

    @classmethod
    def detect(cls, src: Path) -> bool:
        if src.is_dir():
            group = (src / ".zgroup").is_file() or (src / "zarr.json").is_file()
            ends = src / ENDS
            return group and ((ends / ".zarray").is_file() or (ends / "zarr.json").is_file())
        if src.name.endswith(".zip") and _is_zip(src):
            names = set(_zip_names(src))
            return any(f"{ENDS}/{n}" in names for n in (".zarray", "zarr.json"))
        return False

    # ----------------------------------------------------------------------------------------

    def _group(self) -> Any:
        """The root group, opened once per process (codecs registered first when needed)."""
        if self._root is not None:
            return self._root
        zarr = need("zarr", self.format, EXTRA)
        if int(zarr.__version__.split(".")[0]) < 3:
            raise MissingExtra(self.format, "zarr>=3", EXTRA)
        if any(JXL.encode() in t for t in _metadata_texts(self.src)):
            need("imagecodecs.numcodecs", self.format, EXTRA).register_codecs()
        try:
            if _is_zip(self.src):
                self._store = zarr.storage.ZipStore(self.src, mode="r")
                self._root = zarr.open_group(store=self._store, mode="r")
            else:
                self._root = zarr.open_group(str(self.src), mode="r")
            self._root["data"]
        except Exception as exc:  # zarr raises many kinds for a store it cannot read
            raise SourceError(f"not a readable zarr group ({_short(exc)})", str(self.src)) from None
        return self._root

    def _arrays(self) -> dict[str, Any]:
        """``data/<key>`` -> zarr array, by name (listed once per process: zarr reads every
        array's metadata to list them)."""
        if self._data is not None:
            return self._data
        root = self._group()
        try:
            self._data = {f"data/{k}": a for k, a in sorted(root["data"].arrays())}
            return self._data
        except Exception as exc:
            raise SourceError(f"unreadable metadata ({_short(exc)})", str(self.src), None,
                              "data") from None  # fmt: skip

    def episode_ends(self) -> np.ndarray:
        """``meta/episode_ends``, checked: integers, never decreasing, the arrays' length."""
        if self._ends is not None:
            return self._ends
        src = str(self.src)
        root = self._group()
        try:
            ends = np.asarray(root[ENDS][:])
        except Exception as exc:
            raise SourceError(f"unreadable ({_short(exc)})", src, None, ENDS) from None
        if ends.ndim != 1 or ends.dtype.kind not in "iu":
            raise SourceError(f"expected 1-D integers, got {ends.dtype} {ends.shape}", src,
                              None, ENDS)  # fmt: skip
        steps = np.diff(ends, prepend=0)
        if len(ends) and (steps < 0).any():
            i = int(np.argmax(steps < 0))
            before = int(ends[i - 1]) if i else 0
            raise SourceError(f"decreases at episode {i} ({before}, then {int(ends[i])})", src,
                              None, ENDS)  # fmt: skip
        total = int(ends[-1]) if len(ends) else 0
        for name, arr in self._arrays().items():
            if arr.ndim == 0 or arr.shape[0] != total:
                got = arr.shape[0] if arr.ndim else "no"
                raise SourceError(f"{got} steps, {ENDS} ends at {total}", src, None, name)
        self._ends = ends.astype(np.int64)
        return self._ends

    # ----------------------------------------------------------------------------------------

    def keys(self) -> dict[str, Key]:
        if self._keys is not None:
            return dict(self._keys)
        out: dict[str, Key] = {}
        for name, arr in self._arrays().items():
            shape = tuple(int(x) for x in arr.shape[1:])
            if arr.dtype == np.uint8 and arr.ndim == 4 and shape[-1] == 3:
                meta = json.dumps(arr.metadata.to_dict(), default=str)
                enc = "jxl" if JXL in meta else "raw"
                out[name] = Key(name, "image", "uint8", shape, enc)
            else:
                out[name] = Key(name, "array", str(arr.dtype), shape)
        if not out:
            raise SourceError("no arrays under data/", str(self.src), None, "data")
        self._keys = out
        return dict(out)

    def episodes(self) -> list[int]:
        return list(range(len(self.episode_ends())))

    def file(self, ref: Any) -> str:
        return str(self.src)

    def read(self, ref: int) -> RawEpisode:
        ends = self.episode_ends()
        if not 0 <= ref < len(ends):
            raise SourceError("no such episode", str(self.src), str(ref))
        start, stop = (int(ends[ref - 1]) if ref else 0), int(ends[ref])
        keys = self.keys()
        arrays: dict[str, np.ndarray] = {}
        images: dict[str, Any] = {}
        for name, arr in self._arrays().items():
            self._check_blosc(name, arr, start, stop, str(ref))
            try:
                value = np.asarray(arr[start:stop])
            except Exception as exc:  # a codec's own error type (Blosc, zstd, JPEG-XL...)
                raise SourceError(
                    f"steps {start}:{stop} do not decode ({_short(exc)})", str(self.src),
                    str(ref), name,
                ) from None  # fmt: skip
            if keys[name].kind == "image":
                images[name] = ArrayImages(value)
            else:
                arrays[name] = value
        return RawEpisode(source=str(ref), length=stop - start, arrays=arrays, images=images)

    def _chunk_bytes(self, key: str) -> bytes | None:
        """One stored chunk's bytes (None: not stored, zarr's fill value)."""
        if _is_zip(self.src):
            if self._zip is None:
                self._zip = zipfile.ZipFile(self.src)
            try:
                return self._zip.read(key)
            except KeyError:
                return None
        try:
            return (self.src / key).read_bytes()
        except FileNotFoundError:
            return None

    def _check_blosc(self, name: str, arr: Any, start: int, stop: int, ep: str) -> None:
        """Blosc chunks (diffusion policy's default compressor) checked whole before zarr
        decodes them: c-blosc's decompress takes no input length, so a truncated chunk decodes
        to bytes read past its end (measured: garbage floats, no error). Its 16-byte header
        records the compressed size; a chunk of another length is refused."""
        meta = arr.metadata
        if meta.zarr_format == 2:
            blosc = getattr(meta.compressor, "codec_id", None) == "blosc"
        else:
            blosc = type(meta.codecs[-1]).__name__ == "BloscCodec"
        if not blosc or stop <= start:
            return
        size = arr.chunks[0]
        rest = [range(n) for n in arr.cdata_shape[1:]]
        for first in range(start // size, (stop - 1) // size + 1):
            for coords in np.ndindex(*(len(r) for r in rest)) if rest else [()]:
                key = meta.encode_chunk_key((first, *coords))
                raw = self._chunk_bytes(f"{arr.path}/{key}")
                if raw is None:
                    continue
                want = int.from_bytes(raw[12:16], "little") if len(raw) >= 16 else -1
                if want != len(raw):
                    raise SourceError(
                        f"chunk {key} holds {len(raw)} bytes, its Blosc header says {want} "
                        "(truncated or corrupt)", str(self.src), ep, name,
                    )  # fmt: skip

    def default_map(self) -> dict[str, Any]:
        keys = self.keys()
        arrays = {k: v for k, v in keys.items() if v.kind == "array" and len(v.shape) <= 1}
        feats: dict[str, Any] = {}
        if "data/state" in arrays:
            feats["observation.state"] = {"keys": ["data/state"]}
        else:  # UMI: per robot, end-effector position, rotation, gripper width
            umi = [(int(m.group(1)), _UMI_ORDER.index(m.group(2)), k)
                   for k in arrays if (m := _UMI_STATE.match(k))]  # fmt: skip
            if umi:
                feats["observation.state"] = {"keys": [k for *_, k in sorted(umi)]}
        if "data/action" in arrays:
            feats["action"] = {"keys": ["data/action"]}
        for k, v in keys.items():
            if v.kind == "image":
                feats[f"observation.images.{k.split('/', 1)[1]}"] = {"keys": [k]}
        if not feats:  # no known names: every low-dimensional array, one feature each
            feats = {f"observation.{k.split('/', 1)[1]}": {"keys": [k]} for k in arrays}
        name = self.src.name.removesuffix(".zip").removesuffix(".zarr") or self.src.name
        return {"format": "zarr", "task": {"text": name}, "features": feats}
