"""ROS bag reader: ROS 2 bags (MCAP or sqlite3 storage) and ROS 1 ``.bag`` files, one episode
per bag, every chosen topic resampled onto one frame grid.

SRC is one bag (a ROS 2 bag folder with ``metadata.yaml``, a bare ``.mcap`` / ``.db3`` file, a
ROS 1 ``.bag`` file) or a folder of bags (episodes in name order, ``episode_2`` before
``episode_10``). Topics become keys: ``sensor_msgs/JointState`` ``/t.position``,
``/t.velocity``, ``/t.effort`` (float64, the joint names as the key's ``names``);
``std_msgs/Float64MultiArray`` / ``Float32MultiArray`` ``/t``; ``sensor_msgs/Image`` (rgb8 or
bgr8: the map says ``channels = "bgr"``) and ``sensor_msgs/CompressedImage`` (JPEG or PNG,
decoded with Pillow, bytes kept) as images; ``std_msgs/String`` as text.

The grid (the rule): message times are the bag's receive times (ns). From the latest first
message of the chosen topics to the earliest last message (of those not ``latched``), one tick
every ``1/fps`` s (``fps`` from ``--fps`` or the map, set by ``import`` as
:attr:`Reader.rate`); each tick takes, per topic, the latest message at or before it
(``numpy.searchsorted``).

Options (the map's ``[source]``): ``topics`` (the topics read and bounding the grid; default
every supported topic of the bag); ``latched`` (topics published once or rarely, such as a
task: their last message holds to the end, so they do not end the grid); ``max_staleness``
(seconds: a tick whose latest message is older fails the episode with one line naming bag,
topic and time; default no limit); ``stale`` (``"refuse"``, the default, or ``"skip"`` the
episode); ``split`` (a topic: each of its messages starts an episode, ``bag#i``, holding the
messages from it up to the next one; default one episode per bag).

:attr:`RawEpisode.report` holds per-topic figures: messages, median rate, dropped (messages
missing from gaps over 1.5 median periods), the header-stamp-to-receive latency and
the age of the message taken at each tick (ms), ticks that repeat the previous tick's message.

``rosbags`` (pure Python) is the optional extra ``rosbag``; Pillow decodes compressed images.
"""

from __future__ import annotations

import io
import re
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

EXTRA = "rosbag"
ROS1_MAGIC = b"#ROSBAG V2.0"
MCAP_MAGIC = b"\x89MCAP0\r\n"
SQLITE_MAGIC = b"SQLite format 3\x00"
JOINT_STATE = "sensor_msgs/msg/JointState"
IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
STRING = "std_msgs/msg/String"
MULTI = {"std_msgs/msg/Float64MultiArray": "float64", "std_msgs/msg/Float32MultiArray": "float32"}
SUPPORTED = (JOINT_STATE, IMAGE, COMPRESSED, STRING, *MULTI)
JOINT_FIELDS = ("position", "velocity", "effort")
RAW_ENCODINGS = ("rgb8", "bgr8")
OPTIONS = ("topics", "latched", "max_staleness", "stale", "split")
GAP = 1.5  # an interval over GAP median periods has dropped messages


def _head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def is_bag(path: Path) -> bool:
    """One bag: a ROS 1 ``.bag``, an ``.mcap`` / ``.db3`` file, a ROS 2 bag folder."""
    if path.is_file():
        if path.suffix == ".bag":
            return _head(path, len(ROS1_MAGIC)) == ROS1_MAGIC
        if path.suffix == ".mcap":
            return _head(path, len(MCAP_MAGIC)) == MCAP_MAGIC
        return path.suffix == ".db3" and _head(path, 16) == SQLITE_MAGIC
    if path.is_dir() and (path / "metadata.yaml").is_file():
        return any(p.suffix in (".mcap", ".db3") for p in path.iterdir())
    return False


def _natural(name: str) -> list[Any]:
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def _short(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]


def _stamp_ns(msg: Any) -> int | None:
    hdr = getattr(msg, "header", None)
    if hdr is None:
        return None
    return int(hdr.stamp.sec) * 1_000_000_000 + int(hdr.stamp.nanosec)


def _codec(blob: bytes) -> str | None:
    if blob[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if blob[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    return None


def _decode(blob: bytes) -> np.ndarray:
    from PIL import Image

    with Image.open(io.BytesIO(blob)) as im:
        return np.asarray(im.convert("RGB"))


def _raw_image(msg: Any) -> np.ndarray:
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    data = np.asarray(msg.data, np.uint8)
    return data[: h * step].reshape(h, step)[:, : w * 3].reshape(h, w, 3)


class _Picked:
    """``stack[index]`` without the copy (a message taken by several ticks is stored once):
    what :class:`ArrayImages` slices one step at a time."""

    def __init__(self, stack: np.ndarray, index: np.ndarray) -> None:
        self.stack, self.index = stack, index
        self.shape = (len(index), *stack.shape[1:])

    def __getitem__(self, i: int) -> np.ndarray:
        return self.stack[self.index[i]]


def _slug(topic: str) -> str:
    t = re.sub(r"(/image_raw|/image_rect_color|/image)?(/compressed)?$", "", topic)
    return re.sub(r"[^A-Za-z0-9_]+", "_", t).strip("_") or "camera"


class RosbagReader(Reader):
    """ROS 1 / ROS 2 bags, one episode per bag (see the module docstring)."""

    format = "rosbag"
    extra = EXTRA

    @classmethod
    def detect(cls, src: Path) -> bool:
        if is_bag(src):
            return True
        return src.is_dir() and any(is_bag(p) for p in src.iterdir())

    # ---------------------------------------------------------------------------------------
    def _bag(self, ref: str) -> str:
        """The bag of ``ref`` (``bag#i``, the i-th part, when ``split`` is set)."""
        return ref.rpartition("#")[0] if self.options.get("split") and "#" in ref else ref

    def _path(self, ref: str) -> Path:
        return self.src if is_bag(self.src) else self.src / self._bag(ref)

    def file(self, ref: Any) -> str:
        return str(self._path(str(ref)))

    def _bags(self) -> list[str]:
        if is_bag(self.src):
            return [self.src.name]
        return sorted((p.name for p in self.src.iterdir() if is_bag(p)), key=_natural)

    def episodes(self) -> list[str]:
        split = self._option("split")
        if not split:
            return self._bags()
        out = []
        for bag in self._bags():
            reader = self._open(bag)
            try:
                n = len(self._marks(reader, bag, split))
            finally:
                reader.close()
            out += [f"{bag}#{i}" for i in range(n)]
        return out

    def _marks(self, reader: Any, ref: str, split: str) -> list[int]:
        """The receive times of the ``split`` topic's messages (each starts an episode)."""
        conns = [c for c in reader.connections if c.topic == split]
        if not conns:
            raise SourceError(f"no split topic {split!r} in the bag", self.file(ref), ref, split)
        try:
            return sorted(t for _, t, _ in reader.messages(connections=conns))
        except Exception as exc:
            raise SourceError(f"unreadable ({_short(exc)})", self.file(ref), ref) from None

    def _option(self, name: str) -> Any:
        from episodekit.importers.mapping import MapError

        extra = [k for k in self.options if k not in OPTIONS]
        if extra:
            raise MapError(f"[source]: unknown key {extra[0]!r} (known: {', '.join(OPTIONS)})")
        value = self.options.get(name)
        if value is None:
            return None
        ok = {
            "topics": isinstance(value, list) and all(isinstance(t, str) for t in value),
            "latched": isinstance(value, list) and all(isinstance(t, str) for t in value),
            "max_staleness": isinstance(value, (int, float)) and not isinstance(value, bool)
            and value > 0,
            "stale": value in ("refuse", "skip"),
            "split": isinstance(value, str) and value.startswith("/"),
        }[name]  # fmt: skip
        if not ok:
            want = {
                "topics": "a list of topic names",
                "latched": "a list of topic names",
                "max_staleness": "a positive number of seconds",
                "stale": '"refuse" or "skip"',
                "split": "a topic name",
            }[name]
            raise MapError(f"[source].{name}: must be {want}, got {value!r}")
        return value

    def _open(self, ref: str) -> Any:
        """The bag of ``ref`` opened with rosbags (:class:`SourceError` naming it if not)."""
        rb = need("rosbags.highlevel", self.format, EXTRA)
        typesys = need("rosbags.typesys", self.format, EXTRA)
        path = self._path(ref)
        store = typesys.get_typestore(typesys.Stores.ROS2_HUMBLE)
        try:
            reader = rb.AnyReader([path], default_typestore=store)
            reader.open()
        except Exception as exc:  # rosbags' ReaderError, sqlite, struct, yaml errors
            raise SourceError(f"not a readable bag ({_short(exc)})", str(path), ref) from None
        return reader

    def _topics(self, reader: Any, ref: str) -> dict[str, list[Any]]:
        """Chosen topic -> its connections (supported types only)."""
        by_topic: dict[str, list[Any]] = {}
        for c in reader.connections:
            if c.msgtype in SUPPORTED:
                by_topic.setdefault(c.topic, []).append(c)
        for topic, conns in by_topic.items():
            if len({c.msgtype for c in conns}) > 1:
                raise SourceError("connections of different types", self.file(ref), ref, topic)
        chosen = self._option("topics")
        if chosen is None:  # every supported topic but the split marker
            by_topic.pop(self.options.get("split") or "", None)
            return dict(sorted(by_topic.items()))
        return {t: by_topic[t] for t in chosen if t in by_topic}

    def _first(self, reader: Any, conns: list[Any], ref: str) -> Any:
        for c, _, raw in reader.messages(connections=conns):
            return self._deserialize(reader, raw, c, ref)
        return None

    def _deserialize(self, reader: Any, raw: bytes, conn: Any, ref: str) -> Any:
        try:
            return reader.deserialize(raw, conn.msgtype)
        except Exception as exc:
            raise SourceError(
                f"a message does not deserialize ({_short(exc)})", self.file(ref), ref, conn.topic
            ) from None

    def keys(self) -> dict[str, Key]:
        eps = self.episodes()
        if not eps:
            raise SourceError("no bags", str(self.src))
        reader = self._open(eps[0])
        try:
            out: dict[str, Key] = {}
            for topic, conns in self._topics(reader, eps[0]).items():
                msg = self._first(reader, conns, eps[0])
                if msg is not None:
                    out.update(self._keys_of(topic, conns[0].msgtype, msg))
            return out
        finally:
            reader.close()

    def _keys_of(self, topic: str, typ: str, msg: Any) -> dict[str, Key]:
        if typ == JOINT_STATE:
            names = tuple(str(n) for n in msg.name)
            return {
                f"{topic}.{f}": Key(
                    f"{topic}.{f}", "array", "float64", (len(names),), names=names
                )  # fmt: skip
                for f in JOINT_FIELDS
                if len(getattr(msg, f)) == len(names) > 0
            }
        if typ in MULTI:
            return {topic: Key(topic, "array", MULTI[typ], (len(msg.data),))}
        if typ == IMAGE and msg.encoding in RAW_ENCODINGS:
            shape = (int(msg.height), int(msg.width), 3)
            return {topic: Key(topic, "image", "uint8", shape, "raw")}
        if typ == COMPRESSED:
            blob = bytes(msg.data)
            codec = _codec(blob)
            if codec is None:
                return {}
            return {topic: Key(topic, "image", "uint8", _decode(blob).shape, codec)}
        if typ == STRING:
            return {topic: Key(topic, "text", "str", ())}
        return {}

    def image_encodings(self) -> dict[str, str]:
        """Raw image topic -> its ROS encoding (``rgb8``/``bgr8``) in the first bag."""
        eps = self.episodes()
        reader = self._open(eps[0])
        try:
            out = {}
            for topic, conns in self._topics(reader, eps[0]).items():
                if conns[0].msgtype == IMAGE:
                    msg = self._first(reader, conns, eps[0])
                    if msg is not None:
                        out[topic] = str(msg.encoding)
            return out
        finally:
            reader.close()

    # ---------------------------------------------------------------------------------------
    def read(self, ref: str) -> RawEpisode:
        for name in OPTIONS:  # a bad [source] option fails before any bag is read
            self._option(name)
        if not self.rate:
            raise SourceError("no frame rate to resample onto (give --fps)", self.file(ref), ref)
        path = self.file(ref)
        reader = self._open(ref)
        try:
            topics = self._topics(reader, ref)
            if not topics:
                raise SourceError("none of the chosen topics is in the bag", path, ref)
            typ = {t: c[0].msgtype for t, c in topics.items()}
            msgs: dict[str, list[Any]] = {t: [] for t in topics}
            stamps: dict[str, list[int]] = {t: [] for t in topics}
            conns = [c for cs in topics.values() for c in cs]
            start = stop = None
            split = self._option("split")
            if split:
                marks = self._marks(reader, ref, split)
                part = int(ref.rpartition("#")[2])
                if part >= len(marks):
                    raise SourceError(f"no part {part} (the bag has {len(marks)})", path, ref)
                start = marks[part]
                stop = marks[part + 1] if part + 1 < len(marks) else None
            try:
                for c, t, raw in reader.messages(connections=conns, start=start, stop=stop):
                    msgs[c.topic].append(self._deserialize(reader, raw, c, ref))
                    stamps[c.topic].append(t)
            except SourceError:
                raise
            except Exception as exc:  # a truncated chunk, a bad record, sqlite errors
                raise SourceError(f"unreadable ({_short(exc)})", path, ref) from None
        finally:
            reader.close()
        return self._resample(ref, typ, msgs, stamps)

    def _resample(
        self, ref: str, typ: dict[str, str], msgs: dict[str, list[Any]],
        stamps: dict[str, list[int]],
    ) -> RawEpisode:  # fmt: skip
        path = self.file(ref)
        present = {t: np.asarray(s, np.int64) for t, s in stamps.items() if s}
        report: dict[str, Any] = {"bag": path, "missing": sorted(set(stamps) - set(present))}
        if not present:
            return RawEpisode(source=ref, length=0, report=report)
        start = max(int(s[0]) for s in present.values())
        latched = {*(self._option("latched") or ()), self._option("split")}
        bounding = [s for t, s in present.items() if t not in latched] or list(present.values())
        end = min(int(s[-1]) for s in bounding)
        period = 1e9 / float(self.rate)
        n = int(np.floor((end - start) / period)) + 1 if end >= start else 0
        ticks = start + np.round(np.arange(n) * period).astype(np.int64)
        report["grid"] = {"start_ns": start, "end_ns": end, "frames": n, "fps": self.rate}
        arrays: dict[str, np.ndarray] = {}
        images: dict[str, Any] = {}
        texts: dict[str, list[str]] = {}
        topics_report: dict[str, Any] = {}
        limit = self._option("max_staleness")
        for topic, times in present.items():
            if np.any(np.diff(times) < 0):
                order = np.argsort(times, kind="stable")
                times = times[order]
                msgs[topic] = [msgs[topic][i] for i in order.tolist()]
            idx = np.searchsorted(times, ticks, side="right") - 1
            age = ticks - times[idx]
            topics_report[topic] = self._figures(times, idx, age, msgs[topic])
            if limit is not None and n and age.max() > limit * 1e9:
                k = int(np.argmax(age > limit * 1e9))
                self._stale(ref, topic, k, int(ticks[k]), start, int(age[k]), float(limit))
            self._take(ref, topic, typ[topic], msgs.pop(topic), idx, arrays, images, texts)
        report["topics"] = topics_report
        return RawEpisode(
            source=ref,
            length=n,
            arrays=arrays,
            images=images,
            texts=texts,
            meta={"ros_start_ns": start},
            timestamps=(ticks - start) / 1e9,
            report=report,
        )

    def _stale(
        self, ref: str, topic: str, k: int, tick: int, start: int, age: int, limit: float
    ) -> None:
        from episodekit.importers.mapping import Skip

        what = (
            f"frame {k} (t = {(tick - start) / 1e9:.3f} s, bag time {tick / 1e9:.3f} s) takes a "
            f"message {age / 1e9:.3f} s old, over max_staleness {limit:g} s"
        )
        if self._option("stale") == "skip":
            raise Skip(f"{ref}: topic {topic!r}: {what}")
        raise SourceError(
            f'{what} ([source] stale = "skip" skips such bags)', self.file(ref), ref, topic
        )

    @staticmethod
    def _figures(times: np.ndarray, idx: np.ndarray, age: np.ndarray, msgs: list) -> dict:
        """Per-topic figures for the report (see the module docstring)."""
        d = np.diff(times)
        median = float(np.median(d)) if len(d) else 0.0
        dropped = int(np.sum(np.round(d[d > GAP * median] / median) - 1)) if median > 0 else 0
        header = [_stamp_ns(m) for m in msgs]
        lat = None
        if header and all(h is not None for h in header):
            ms = (times - np.asarray(header, np.int64)) / 1e6
            lat = {"mean": round(float(ms.mean()), 3), "max": round(float(ms.max()), 3)}
        return {
            "messages": len(times),
            "rate_hz": round(1e9 / median, 3) if median > 0 else None,
            "dropped": dropped,
            "latency_ms": lat,
            "staleness_ms": {
                "mean": round(float(age.mean()) / 1e6, 3) if len(age) else None,
                "max": round(float(age.max()) / 1e6, 3) if len(age) else None,
            },
            "repeated": int(np.sum(idx[1:] == idx[:-1])),
        }

    def _take(
        self, ref: str, topic: str, typ: str, msgs: list, idx: np.ndarray,
        arrays: dict, images: dict, texts: dict,
    ) -> None:  # fmt: skip
        """The values of ``topic`` at the ticks (message ``idx[k]`` for tick ``k``)."""
        path = self.file(ref)
        if typ == JOINT_STATE:
            names = [tuple(m.name) for m in msgs]
            if len(set(names)) > 1:
                raise SourceError("the joint names change within the bag", path, ref, topic)
            for f in JOINT_FIELDS:
                rows = [np.asarray(getattr(m, f), np.float64) for m in msgs]
                if not rows or len(rows[0]) != len(names[0]) or not len(names[0]):
                    continue
                if len({len(r) for r in rows}) > 1:
                    raise SourceError("ragged values", path, ref, f"{topic}.{f}")
                arrays[f"{topic}.{f}"] = np.stack(rows)[idx]
        elif typ in MULTI:
            rows = [np.asarray(m.data, MULTI[typ]) for m in msgs]
            if len({len(r) for r in rows}) > 1:
                raise SourceError("ragged values", path, ref, topic)
            arrays[topic] = np.stack(rows)[idx]
        elif typ == STRING:
            texts[topic] = np.asarray([str(m.data) for m in msgs], dtype=object)[idx].tolist()
        elif typ == IMAGE:
            used, inverse = np.unique(idx, return_inverse=True)
            frames = []
            for i in used.tolist():
                if msgs[i].encoding not in RAW_ENCODINGS:
                    raise SourceError(
                        f"image encoding {msgs[i].encoding!r} (read: {', '.join(RAW_ENCODINGS)})",
                        path, ref, topic,
                    )  # fmt: skip
                frames.append(_raw_image(msgs[i]))
            if len({f.shape for f in frames}) > 1:
                raise SourceError("images of different sizes", path, ref, topic)
            stack = np.stack(frames) if frames else np.zeros((0, 0, 0, 3), np.uint8)
            images[topic] = ArrayImages(_Picked(stack, inverse.reshape(-1)))
        elif typ == COMPRESSED:
            blobs = [bytes(msgs[i].data) for i in idx.tolist()]
            codecs = {_codec(b) for b in blobs}
            if len(codecs) > 1 or None in codecs:
                raise SourceError("compressed images that are not all JPEG or all PNG",
                                  path, ref, topic)  # fmt: skip
            images[topic] = EncodedImages(blobs, codecs.pop() if codecs else "jpeg", _decode)

    # ---------------------------------------------------------------------------------------
    def default_map(self) -> dict[str, Any]:
        keys = self.keys()
        enc = self.image_encodings()
        feats: dict[str, Any] = {}
        joints = [k for k, v in keys.items() if v.kind == "array" and v.names]
        for k in joints:
            field = k.rsplit(".", 1)[1]
            name = {"position": "observation.state", "velocity": "observation.velocity",
                    "effort": "observation.effort"}[field]  # fmt: skip
            if name not in feats:
                feats[name] = {"keys": [k], "names": list(keys[k].names or ())}
        multi = [k for k, v in keys.items() if v.kind == "array" and not v.names]
        for k in multi:
            name = "action" if re.search(r"action|cmd|command", k) and "action" not in feats \
                else f"observation.{_slug(k)}"  # fmt: skip
            feats.setdefault(name, {"keys": [k]})
        for k, v in keys.items():
            if v.kind == "image":
                spec: dict[str, Any] = {"keys": [k]}
                if enc.get(k) == "bgr8":
                    spec["channels"] = "bgr"
                feats.setdefault(f"observation.images.{_slug(k)}", spec)
        texts = [k for k, v in keys.items() if v.kind == "text"]
        task_key = next((k for k in texts if re.search(r"task|instruction", k)), None)
        task = {"key": task_key} if task_key else {"text": self.src.resolve().stem}
        used = {k.rsplit(".", 1)[0] if k in joints else k for f in feats.values()
                for k in f["keys"]}  # fmt: skip
        if task_key:
            used.add(task_key)
        source: dict[str, Any] = {"topics": sorted(used)}
        if task_key:
            source["latched"] = [task_key]  # a task is published once or rarely
        return {
            "robot_type": "ros",
            "source": source,
            "task": task,
            "features": feats,
        }
