"""RLDS / Open X-Embodiment datasets as TFDS stores them, read without TensorFlow.

A TFDS dataset folder (``<name>/<version>/``) holds ``dataset_info.json`` (splits, shard
lengths, the shard file name template), ``features.json`` (the TFDS ``FeaturesDict``: RLDS's
``steps`` Dataset and ``episode_metadata``) and TFRecord shards. Each record is one
``tf.train.Example`` holding one whole EPISODE, its per-step values flattened and stacked under
``steps/<path>`` (``steps/observation/state``: a float list of T*8; ``steps/is_first``: an int64
list of T; ``steps/observation/image``: a bytes list of T PNG/JPEG files;
``steps/language_instruction``: a bytes list of T), episode-level ones under their path
(``episode_metadata/file_path``). Shapes and dtypes come from ``features.json``; floats are
stored as float32 and ints/bools as int64 (TFDS casts them back to the declared dtype, so do we).

TFRecord framing: per record ``uint64 length``, ``uint32 masked CRC32C(length)``, ``data``,
``uint32 masked CRC32C(data)``, little-endian; both CRCs are checked (google-crc32c, the
``[rlds]`` extra: a C CRC32C, as a pure-Python one would run at ~1 MB/s on records that hold a
whole episode's images). ``tf.train.Example`` is parsed by the small protobuf wire-format decoder
below rather than the ``protobuf`` package: the schema is six fixed messages
(Example/Features/Feature/BytesList/FloatList/Int64List), the ``protobuf`` package does not ship
them (we would have to build their descriptors by hand), and numbers decode straight into numpy
(packed floats with one ``frombuffer``, packed varints vectorized).

Per-step keys drop the ``steps/`` prefix (``observation/state``, ``language_instruction``), as
the map names them; episode-level values keep their path in ``meta``
(``episode_metadata/file_path``), with ``split`` (the TFDS split the episode is in).
The map's ``[source]`` table takes ``splits = ["train"]`` (default: every split, in
dataset_info.json's order).
"""

from __future__ import annotations

import functools
import io
import json
import struct
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from episodekit.importers.episode import (
    EncodedImages,
    Key,
    RawEpisode,
    Reader,
    SourceError,
    need,
)

INFO, FEATURES = "dataset_info.json", "features.json"
TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_HEADER = struct.Struct("<QI")
_MASK_DELTA = 0xA282EAD8
_FLOATS = ("float16", "float32", "float64")
_MAGIC = {"png": b"\x89PNG", "jpeg": b"\xff\xd8\xff"}


class EpisodeRef(NamedTuple):
    """Where one episode is: its shard (relative to the dataset folder), the record's byte
    offset and index in the shard, its split and its index over the whole source."""

    shard: str
    offset: int
    record: int
    split: str
    index: int


class Leaf(NamedTuple):
    """One serialized value of features.json: its Example key (``steps/observation/image``),
    its kind (``array``, ``image``, ``text``), the declared dtype and shape (per step under
    ``steps``), an image's encoding, and whether it is per step."""

    path: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    encoding: str | None
    per_step: bool


# --------------------------------------------------------------------------------------------
# TFRecord framing


def _masked(crc: int) -> int:
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def _crc32c() -> Any:
    return need("google_crc32c", "rlds", "rlds").value


def scan_records(path: Path, crc: Any = None) -> list[int]:
    """The byte offset of every record of the TFRecord file ``path``, from one pass over the
    headers (each length's CRC checked, the data skipped). A truncated file or a bad length
    CRC raises :class:`SourceError` naming the file and the record."""
    crc = crc or _crc32c()
    size = path.stat().st_size
    offsets: list[int] = []
    with path.open("rb") as f:
        pos = 0
        while pos < size:
            i = len(offsets)
            head = f.read(12)
            if len(head) < 12:
                raise SourceError(
                    f"truncated TFRecord: record {i} header has {len(head)} of 12 bytes",
                    str(path),
                )
            length, length_crc = _HEADER.unpack(head)
            if _masked(crc(head[:8])) != length_crc:
                raise SourceError(
                    f"TFRecord record {i} at byte {pos}: length CRC mismatch (corrupt file)",
                    str(path),
                )
            end = pos + 12 + length + 4
            if end > size:
                raise SourceError(
                    f"truncated TFRecord: record {i} at byte {pos} needs {end - pos} bytes, "
                    f"the file has {size - pos} left",
                    str(path),
                )
            offsets.append(pos)
            pos = end
            f.seek(pos)
    return offsets


def read_record(path: Path, offset: int, record: int, crc: Any = None) -> bytes:
    """The data of the record at ``offset`` of ``path``, both CRCs checked."""
    crc = crc or _crc32c()
    with path.open("rb") as f:
        f.seek(offset)
        head = f.read(12)
        if len(head) < 12:
            raise SourceError(f"truncated TFRecord: record {record} header", str(path))
        length, length_crc = _HEADER.unpack(head)
        if _masked(crc(head[:8])) != length_crc:
            raise SourceError(f"TFRecord record {record}: length CRC mismatch", str(path))
        data = f.read(length)
        tail = f.read(4)
    if len(data) < length or len(tail) < 4:
        raise SourceError(f"truncated TFRecord: record {record} at byte {offset}", str(path))
    if _masked(crc(data)) != struct.unpack("<I", tail)[0]:
        raise SourceError(
            f"TFRecord record {record} at byte {offset}: data CRC mismatch (corrupt file)",
            str(path),
        )
    return data


# --------------------------------------------------------------------------------------------
# tf.train.Example (protobuf wire format)


class WireError(ValueError):
    """Bytes that are not a valid tf.train.Example."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    try:
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift >= 70:
                raise WireError("varint longer than 10 bytes")
    except IndexError:
        raise WireError("truncated varint") from None


def _fields(buf: bytes, start: int, end: int):
    """(field number, wire type, value or start, end) of each field in ``buf[start:end]``:
    varints give their value, length-delimited and fixed fields their span."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield field, wire, value, pos
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > end:
                raise WireError("length-delimited field runs past its message")
            yield field, wire, pos, pos + n
            pos += n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if pos + n > end:
                raise WireError("fixed field runs past its message")
            yield field, wire, pos, pos + n
            pos += n
        else:
            raise WireError(f"unsupported wire type {wire}")


def _packed_varints(raw: np.ndarray) -> np.ndarray:
    """The int64 values of a packed varint buffer (uint8 array), vectorized."""
    if raw.size == 0:
        return np.zeros(0, np.int64)
    if raw[-1] >= 0x80:
        raise WireError("truncated packed varint")
    ends = np.flatnonzero(raw < 0x80)
    if ends.size == raw.size:  # every value < 128 (bools, small ints): one byte each
        return raw.astype(np.int64)
    starts = np.concatenate(([0], ends[:-1] + 1))
    if int((ends - starts).max()) >= 10:
        raise WireError("varint longer than 10 bytes")
    group = np.repeat(np.arange(ends.size), ends - starts + 1)
    shift = (np.arange(raw.size) - starts[group]).astype(np.uint64) * np.uint64(7)
    parts = (raw & 0x7F).astype(np.uint64) << shift
    return np.add.reduceat(parts, starts).view(np.int64)


def _feature(buf: bytes, start: int, end: int) -> tuple[str, Any]:
    """One ``Feature``: ("bytes", [bytes]), ("float", float32 array) or ("int64", int64)."""
    kind, span = "", (start, start)
    for field, wire, a, b in _fields(buf, start, end):
        if wire == 2 and field in (1, 2, 3):  # the oneof: the last one given wins
            kind, span = ("bytes", "float", "int64")[field - 1], (a, b)
    if not kind:
        raise WireError("a Feature without a value list")
    if kind == "bytes":
        return kind, [buf[a:b] for f, w, a, b in _fields(buf, *span) if f == 1 and w == 2]
    chunks = []
    for f, w, a, b in _fields(buf, *span):
        if f != 1:
            continue
        if kind == "float":
            if w not in (2, 5) or (b - a) % 4:
                raise WireError("a float list with a bad wire type or length")
            chunks.append(np.frombuffer(buf, "<f4", (b - a) // 4, a))
        elif w == 2:
            chunks.append(_packed_varints(np.frombuffer(buf, np.uint8, b - a, a)))
        elif w == 0:
            chunks.append(np.array([a], np.uint64).view(np.int64))
        else:
            raise WireError("an int64 list with a bad wire type")
    dtype = np.float32 if kind == "float" else np.int64
    if not chunks:
        return kind, np.zeros(0, dtype)
    return kind, chunks[0] if len(chunks) == 1 else np.concatenate(chunks)


def parse_example(buf: bytes) -> dict[str, tuple[str, Any]]:
    """A serialized ``tf.train.Example`` as {key: (kind, values)} (see :func:`_feature`)."""
    out: dict[str, tuple[str, Any]] = {}
    for field, wire, a, b in _fields(buf, 0, len(buf)):
        if field != 1 or wire != 2:  # Example.features
            continue
        for f, w, c, d in _fields(buf, a, b):
            if f != 1 or w != 2:  # Features.feature (map entries)
                continue
            key, value = None, None
            for g, x, e, h in _fields(buf, c, d):
                if g == 1 and x == 2:
                    key = buf[e:h].decode("utf-8")
                elif g == 2 and x == 2:
                    value = (e, h)
            if key is None:
                raise WireError("a feature map entry without a key")
            out[key] = _feature(buf, *value) if value else ("bytes", [])
    return out


# --------------------------------------------------------------------------------------------
# features.json


def _leaves(node: dict, path: str, per_step: bool, out: list[Leaf], where: str) -> None:
    """The serialized values under one features.json node, appended to ``out``."""
    cls = str(node.get("pythonClassName", ""))
    short = cls.rsplit(".", 1)[-1]
    if "featuresDict" in node:
        for name, child in node["featuresDict"].get("features", {}).items():
            _leaves(child, f"{path}/{name}" if path else name, per_step, out, where)
    elif "sequence" in node:  # RLDS's ``steps`` (tfds Dataset) or a Sequence
        if per_step:
            raise SourceError(f"a sequence inside a sequence ({cls}) is not read", where,
                              key=path)  # fmt: skip
        _leaves(node["sequence"]["feature"], path, True, out, where)
    elif "image" in node:
        spec = node["image"]
        dims = tuple(int(d) for d in spec.get("shape", {}).get("dimensions", []))
        dtype = str(spec.get("dtype", "uint8"))
        enc = str(spec.get("encodingFormat") or "png")
        if dtype != "uint8" or enc not in ("png", "jpeg") or len(dims) != 3:
            raise SourceError(
                f"image of dtype {dtype}, encoding {enc}, shape {dims} is not read "
                "(uint8 PNG/JPEG (H, W, C) images are)", where, key=path,
            )  # fmt: skip
        out.append(Leaf(path, "image", "uint8", dims, "jpeg" if enc == "jpeg" else enc,
                        per_step))  # fmt: skip
    elif "text" in node:
        out.append(Leaf(path, "text", "str", (), None, per_step))
    elif "tensor" in node:
        spec = node["tensor"]
        dims = tuple(int(d) for d in spec.get("shape", {}).get("dimensions", []))
        dtype = str(spec.get("dtype", "float32"))
        enc = str(spec.get("encoding", "none")).lower()
        if enc not in ("none", "encoding_none"):
            raise SourceError(f"tensor encoding {enc!r} is not read", where, key=path)
        if any(d < 0 for d in dims):
            raise SourceError(f"a tensor of variable shape {dims} is not read", where, key=path)
        if dtype != "string" and (dtype == "bfloat16" or not _numpy_dtype(dtype)):
            raise SourceError(f"tensor dtype {dtype!r} is not read", where, key=path)
        kind = "text" if dtype == "string" else "array"
        out.append(Leaf(path, kind, "str" if kind == "text" else dtype, dims, None, per_step))
    elif "classLabel" in node:
        out.append(Leaf(path, "array", "int64", (), None, per_step))
    else:
        raise SourceError(f"feature type {short or node!r} is not read", where, key=path)


def _numpy_dtype(name: str) -> bool:
    try:
        return np.dtype(name).kind in "biuf"
    except TypeError:
        return False


def read_features(root: Path) -> list[Leaf]:
    """Every serialized value of the dataset at ``root``, from its features.json."""
    path = root / FEATURES
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SourceError("missing: a TFDS dataset folder has features.json", str(path)) from None
    except (OSError, ValueError) as exc:
        raise SourceError(f"not readable as JSON ({exc})", str(path)) from exc
    out: list[Leaf] = []
    try:
        _leaves(doc, "", False, out, str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise SourceError(f"not a TFDS FeaturesDict ({exc!r})", str(path)) from exc
    if not any(leaf.per_step for leaf in out):
        raise SourceError("no per-step values (RLDS keeps them in a 'steps' Dataset)", str(path))
    return out


def read_shards(root: Path) -> list[tuple[str, str, int]]:
    """(split, shard file name, episodes in it) of every shard, from dataset_info.json."""
    path = root / INFO
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        name = doc["name"]
        fmt = doc.get("fileFormat", "tfrecord")
        out = []
        for split in doc["splits"]:
            lengths = [int(n) for n in split.get("shardLengths", [])]
            template = split.get("filepathTemplate") or TEMPLATE
            for i, n in enumerate(lengths):
                file = template.format(
                    DATASET=name, SPLIT=split["name"], FILEFORMAT=fmt,
                    SHARD_X_OF_Y=f"{i:05d}-of-{len(lengths):05d}", SHARD_INDEX=i,
                    NUM_SHARDS=len(lengths),
                )  # fmt: skip
                out.append((str(split["name"]), file, n))
    except FileNotFoundError:
        raise SourceError("missing: a TFDS dataset folder has dataset_info.json",
                          str(path)) from None  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise SourceError(f"not a TFDS dataset_info.json ({exc!r})", str(path)) from exc
    if fmt != "tfrecord":
        raise SourceError(f"file format {fmt!r} is not read (tfrecord is)", str(path))
    return out


def find_root(src: Path) -> Path | None:
    """The TFDS dataset folder at ``src``: ``src`` itself, or its only version folder."""
    if (src / INFO).is_file() and (src / FEATURES).is_file():
        return src
    if src.is_dir():
        subs = [p for p in src.iterdir() if (p / INFO).is_file() and (p / FEATURES).is_file()]
        if len(subs) == 1:
            return subs[0]
    return None


# --------------------------------------------------------------------------------------------
# Images


@functools.cache
def _pil() -> Any:
    return need("PIL.Image", "rlds", "rlds")


def decode_image(blob: bytes, channels: int, where: str = "", encoding: str = "") -> np.ndarray:
    """A PNG/JPEG file's pixels as uint8 (H, W, channels) (Pillow; ``encoding``, when given,
    spares Pillow probing every format)."""
    mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(channels)
    magic = _MAGIC.get(encoding)
    formats = (encoding.upper(),) if magic and blob.startswith(magic) else None
    try:
        with _pil().open(io.BytesIO(blob), formats=formats) as img:
            if mode and img.mode != mode:
                img = img.convert(mode)
            arr = np.asarray(img)
    except (OSError, ValueError, SyntaxError) as exc:
        raise SourceError(f"an image does not decode ({exc})", where or None) from exc
    return arr.reshape(*arr.shape[:2], -1)


def _texts(values: list[bytes], file: str, ep: str, key: str) -> list[str]:
    try:
        return [v.decode("utf-8") for v in values]
    except UnicodeDecodeError as exc:
        raise SourceError(f"text that is not UTF-8 ({exc})", file, ep, key) from None


# --------------------------------------------------------------------------------------------
# The reader


class RldsReader(Reader):
    """An RLDS dataset in TFDS's layout (see the module docstring)."""

    format = "rlds"
    extra = "rlds"

    def __init__(self, src: str | Path, options: dict[str, Any] | None = None) -> None:
        super().__init__(src, options)
        root = find_root(self.src)
        if root is None:
            raise SourceError(f"not a TFDS dataset folder (no {INFO} and {FEATURES})",
                              str(self.src))  # fmt: skip
        self.root = root
        self.leaves = read_features(root)
        self.shards = read_shards(root)
        splits = self.options.get("splits")
        if splits is not None:
            have = sorted({s for s, _, _ in self.shards})
            bad = [s for s in splits if s not in have]
            if bad:
                raise SourceError(f"[source] splits: no split {bad[0]!r} (it has: "
                                  f"{', '.join(have)})", str(root / INFO))  # fmt: skip
            self.shards = [s for s in self.shards if s[0] in splits]

    @classmethod
    def detect(cls, src: Path) -> bool:
        return find_root(Path(src)) is not None

    def keys(self) -> dict[str, Key]:
        """Per-step keys from features.json; an image declared with a free size (-1) takes
        the first episode's first image's."""
        out = {}
        first: RawEpisode | None = None
        for leaf in self.leaves:
            if not leaf.per_step:
                continue
            name = leaf.path.removeprefix("steps/")
            shape = leaf.shape
            if leaf.kind == "image" and min(shape) < 0:
                if first is None:
                    refs = self.episodes()
                    first = self.read(refs[0]) if refs else None
                images = first.images.get(name) if first is not None else None
                if images is not None and len(images):
                    shape = tuple(next(images.frames()).shape)
            out[name] = Key(name, leaf.kind, leaf.dtype, shape, leaf.encoding)
        return out

    def episodes(self) -> list[EpisodeRef]:
        crc = _crc32c()
        refs: list[EpisodeRef] = []
        for split, file, n in self.shards:
            path = self.root / file
            if not path.is_file():
                raise SourceError(f"missing: {INFO} lists this shard", str(path))
            offsets = scan_records(path, crc)
            if len(offsets) != n:
                raise SourceError(f"{len(offsets)} records, {INFO} says {n}", str(path))
            refs += [EpisodeRef(file, off, i, split, len(refs) + i)
                     for i, off in enumerate(offsets)]  # fmt: skip
        return refs

    def describe(self, ref: EpisodeRef) -> str:
        return f"{ref.shard}#record {ref.record}"

    def file(self, ref: EpisodeRef) -> str:
        return str(self.root / ref.shard)

    def read(self, ref: EpisodeRef) -> RawEpisode:
        path = self.root / ref.shard
        file = str(path)
        ep = f"{ref.index} (record {ref.record})"
        data = read_record(path, ref.offset, ref.record)
        try:
            example = parse_example(data)
        except (WireError, UnicodeDecodeError) as exc:
            raise SourceError(f"not a tf.train.Example ({exc})", file, ep) from exc
        raw = RawEpisode(source=self.describe(ref), length=0, meta={"split": ref.split})
        length: int | None = None
        for leaf in self.leaves:
            got = example.get(leaf.path)
            if got is None:
                raise SourceError("missing from the record (features.json declares it)",
                                  file, ep, leaf.path)  # fmt: skip
            kind, values = got
            want = "bytes" if leaf.kind in ("image", "text") else (
                "float" if leaf.dtype in _FLOATS else "int64")  # fmt: skip
            if kind != want:
                raise SourceError(f"stored as {kind} values, features.json declares {leaf.dtype}",
                                  file, ep, leaf.path)  # fmt: skip
            per = int(np.prod(leaf.shape)) if leaf.kind == "array" else 1
            if not leaf.per_step:
                raw.meta[leaf.path] = self._episode_value(leaf, values, file, ep)
                continue
            n, rest = divmod(len(values), per) if per else (0, 0)
            if rest or (length is not None and n != length):
                raise SourceError(
                    f"{len(values)} values do not make {length if length is not None else 'whole'}"
                    f" steps of shape {leaf.shape} (ragged)", file, ep, leaf.path,
                )  # fmt: skip
            length = n
            name = leaf.path.removeprefix("steps/")
            if leaf.kind == "image":
                where = f"{file}: episode {ep}, key {leaf.path!r}"
                # the bytes' own codec: TFDS stores files given as paths/bytes as they are
                head = values[0] if values else b""
                enc = next((k for k, v in _MAGIC.items() if head.startswith(v)), None)
                enc = enc or leaf.encoding or "png"
                decode = functools.partial(
                    decode_image, channels=leaf.shape[2], where=where, encoding=enc
                )
                raw.images[name] = EncodedImages(values, enc, decode)
            elif leaf.kind == "text":
                raw.texts[name] = _texts(values, file, ep, leaf.path)
            else:
                raw.arrays[name] = np.array(values, dtype=leaf.dtype).reshape(n, *leaf.shape)
        raw.length = length or 0
        return raw

    @staticmethod
    def _episode_value(leaf: Leaf, values: Any, file: str, ep: str) -> Any:
        if leaf.kind == "text":
            if len(values) != 1:
                raise SourceError(f"{len(values)} values, one expected", file, ep, leaf.path)
            return _texts(values, file, ep, leaf.path)[0]
        if leaf.kind == "image":
            return values[0] if len(values) == 1 else list(values)
        arr = np.array(values, dtype=leaf.dtype)
        if arr.size != int(np.prod(leaf.shape)):
            raise SourceError(f"{arr.size} values for shape {leaf.shape}", file, ep, leaf.path)
        return arr.reshape(leaf.shape).item() if leaf.shape == () else arr.reshape(leaf.shape)

    def default_map(self) -> dict[str, Any]:
        keys = self.keys()

        def numeric(prefix: str) -> list[str]:
            return [k for k, v in keys.items() if v.kind == "array" and len(v.shape) <= 1
                    and (k == prefix or k.startswith(prefix + "/"))]  # fmt: skip

        features: dict[str, Any] = {}
        for feat, prefix in (("observation.state", "observation/state"), ("action", "action")):
            found = numeric(prefix)
            if not found and prefix == "observation/state":
                found = [k for k in numeric("observation") if keys[k].dtype in _FLOATS]
            if found:
                features[feat] = {"keys": found}
        images = [k for k, v in keys.items() if v.kind == "image"]
        last = [k.rsplit("/", 1)[-1] for k in images]
        for k, short in zip(images, last):
            cam = short if last.count(short) == 1 else k.replace("/", "_")
            features[f"observation.images.{cam}"] = {"keys": [k], "channels": "rgb"}
        if "reward" in keys and keys["reward"].kind == "array" and keys["reward"].shape == ():
            features["next.reward"] = {"keys": ["reward"]}
        doc: dict[str, Any] = {"format": "rlds", "features": features}
        texts = [k for k, v in keys.items() if v.kind == "text"]
        lang = [k for k in texts if "instruction" in k or "language" in k]
        if lang:
            doc["task"] = {"key": lang[0]}
        meta = [leaf.path for leaf in self.leaves if not leaf.per_step
                and leaf.kind in ("array", "text")]  # fmt: skip
        if meta:
            doc["episodes"] = {"meta": meta}
        return doc
