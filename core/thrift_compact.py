"""Thrift's compact protocol, only as far as parquet's metadata needs it: decode any struct into
Python values and encode it back byte for byte.

Parquet stores its page headers and its footer (``FileMetaData``) as Thrift structs in the
compact protocol; pyarrow reads and writes them but exposes neither the headers nor a way to
write a footer for pages it did not write. :mod:`episodekit.core.parquet_salvage` needs both, for
a handful of structs, so this is a small generic codec (no IDL, no code generation):

- a struct decodes to ``{field_id: (type, value)}`` (:data:`Struct`), in field order; a list to
  ``(element_type, [values])``; a map to ``(key_type, value_type, [(key, value), ...])``;
  binary stays ``bytes``; so any struct decodes and encodes back to the same bytes;
- :func:`i64`, :func:`binary`, :func:`list_of` build values to encode, :class:`Raw` wraps bytes
  already encoded, and ``put_*`` append fields to a bytearray directly (the fast path for
  thousands of column chunks).
"""

from __future__ import annotations

import struct as _struct
from typing import Any

# Compact protocol type codes (as they appear in field headers)
BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)
BOOL = BOOL_TRUE  # the code of a bool inside a list, a set or a map
MAX_DEPTH = 64  # nesting refused beyond this (the bytes may be garbage: a file cut anywhere)

Struct = dict  # {field_id: (type, value)}


class ThriftError(ValueError):
    """The bytes are not a well-formed compact-protocol struct (cut short, or not Thrift)."""


class CutShort(ThriftError):
    """The bytes end inside the struct (more bytes may complete it)."""


class Reader:
    """Decodes values from ``buf`` starting at ``pos`` (advanced as it reads)."""

    def __init__(self, buf: bytes | memoryview, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def byte(self) -> int:
        try:
            b = self.buf[self.pos]
        except IndexError:
            raise CutShort("cut short") from None
        self.pos += 1
        return b

    def varint(self) -> int:
        buf, pos = self.buf, self.pos
        out = shift = 0
        try:
            while True:
                b = buf[pos]
                pos += 1
                out |= (b & 0x7F) << shift
                if b < 0x80:
                    break
                shift += 7
                if shift > 63:
                    raise ThriftError("varint longer than 10 bytes")
        except IndexError:
            raise CutShort("cut short") from None
        self.pos = pos
        return out

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def binary(self) -> bytes:
        n = self.varint()
        end = self.pos + n
        if end > len(self.buf):
            raise CutShort("cut short")
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def value(self, ttype: int, depth: int = 0) -> Any:
        if ttype in (I16, I32, I64):
            return self.zigzag()
        if ttype == BINARY:
            return self.binary()
        if ttype == STRUCT:
            return self.struct(depth + 1)
        if ttype in (LIST, SET):
            return self._list(depth + 1)
        if ttype == BOOL_TRUE:  # in a list, set or map: one byte each
            return self.byte() == BOOL_TRUE
        if ttype == BYTE:
            b = self.byte()
            return b - 256 if b > 127 else b
        if ttype == DOUBLE:
            end = self.pos + 8
            if end > len(self.buf):
                raise CutShort("cut short")
            v = _struct.unpack_from("<d", self.buf, self.pos)[0]
            self.pos = end
            return v
        if ttype == MAP:
            return self._map(depth + 1)
        raise ThriftError(f"unknown type {ttype}")

    def _list(self, depth: int) -> tuple[int, list]:
        head = self.byte()
        n, etype = head >> 4, head & 0x0F
        if n == 15:
            n = self.varint()
        if etype == BOOL_FALSE:  # some writers use 2 for bool elements
            etype = BOOL_TRUE
        if depth > MAX_DEPTH or n > len(self.buf) - self.pos:  # each element takes >= 1 byte
            raise ThriftError("list longer than the bytes left")
        return etype, [self.value(etype, depth) for _ in range(n)]

    def _map(self, depth: int) -> tuple[int, int, list]:
        n = self.varint()
        if n == 0:
            return 0, 0, []
        kv = self.byte()
        kt, vt = kv >> 4, kv & 0x0F
        if depth > MAX_DEPTH or n > len(self.buf) - self.pos:
            raise ThriftError("map longer than the bytes left")
        return kt, vt, [(self.value(kt, depth), self.value(vt, depth)) for _ in range(n)]

    def struct(self, depth: int = 0, expect: dict[int, int] | None = None) -> Struct:
        """One struct (up to and including its stop byte); ``expect`` (field id -> type): a
        field of another type is an error before its value is read."""
        if depth > MAX_DEPTH:
            raise ThriftError("nested too deeply")
        out: Struct = {}
        fid = 0
        while True:
            head = self.byte()
            if head == 0:
                return out
            ttype = head & 0x0F
            delta = head >> 4
            fid = fid + delta if delta else self.zigzag()
            if expect is not None and expect.get(fid, ttype) != ttype:
                raise ThriftError(f"field {fid} has type {ttype}, not {expect[fid]}")
            if ttype == BOOL_TRUE or ttype == BOOL_FALSE:
                out[fid] = (BOOL_TRUE, ttype == BOOL_TRUE)
            else:
                out[fid] = (ttype, self.value(ttype, depth))

    def skip(self, ttype: int, depth: int = 0) -> None:
        """Step over one value of ``ttype`` without building it."""
        if depth > MAX_DEPTH:
            raise ThriftError("nested too deeply")
        if ttype in (I16, I32, I64):
            self.varint()
        elif ttype == BINARY:
            n = self.varint()
            if self.pos + n > len(self.buf):
                raise CutShort("cut short")
            self.pos += n
        elif ttype == STRUCT:
            while True:
                head = self.byte()
                if head == 0:
                    return
                if not head >> 4:
                    self.zigzag()
                if head & 0x0F not in (BOOL_TRUE, BOOL_FALSE):
                    self.skip(head & 0x0F, depth + 1)
        elif ttype in (LIST, SET):
            head = self.byte()
            n = self.varint() if head >> 4 == 15 else head >> 4
            for _ in range(n):
                self.skip(head & 0x0F, depth + 1)
        elif ttype == BOOL_TRUE:  # inside a list
            self.byte()
        elif ttype == BYTE:
            self.byte()
        elif ttype == DOUBLE:
            if self.pos + 8 > len(self.buf):
                raise CutShort("cut short")
            self.pos += 8
        elif ttype == MAP:
            n = self.varint()
            if n:
                kv = self.byte()
                for _ in range(n):
                    self.skip(kv >> 4, depth + 1)
                    self.skip(kv & 0x0F, depth + 1)
        else:
            raise ThriftError(f"unknown type {ttype}")


def decode(
    buf: bytes | memoryview, pos: int = 0, expect: dict[int, int] | None = None
) -> tuple[Struct, int]:
    """The struct at ``buf[pos:]`` and the position after it; :class:`CutShort` if the bytes
    end inside it, :class:`ThriftError` if they are not a struct (or a top-level field is not
    of the type ``expect`` gives it)."""
    r = Reader(buf, pos)
    return r.struct(expect=expect), r.pos


# --------------------------------------------------------------------------------------------
# Encoding


def put_field(out: bytearray, delta: int, ttype: int) -> None:
    """Append the header of a field ``delta`` (1..15) ids after the previous one."""
    out.append(delta << 4 | ttype)


def put_int(out: bytearray, n: int) -> None:
    """Append an i16/i32/i64 value as the compact protocol writes it (zigzag varint)."""
    _varint((n << 1) ^ (n >> 63), out)


def put_binary(out: bytearray, b: bytes) -> None:
    _varint(len(b), out)
    out += b


def put_list(out: bytearray, n: int, etype: int) -> None:
    """Append the header of a list of ``n`` elements of ``etype``."""
    if n < 15:
        out.append(n << 4 | etype)
    else:
        out.append(0xF0 | etype)
        _varint(n, out)


def _varint(n: int, out: bytearray) -> None:
    if n < 0x80:
        out.append(n)
        return
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int, out: bytearray) -> None:
    _varint((n << 1) ^ (n >> 63), out)


class Raw(bytes):
    """A value already encoded (e.g. a struct's bytes, stop byte included): written as is."""


def _value(ttype: int, v: Any, out: bytearray) -> None:
    if isinstance(v, Raw):
        out += v
    elif ttype in (I16, I32, I64):
        _zigzag(int(v), out)
    elif ttype == BINARY:
        b = v.encode() if isinstance(v, str) else bytes(v)
        _varint(len(b), out)
        out += b
    elif ttype == STRUCT:
        _struct_into(v, out)
    elif ttype in (LIST, SET):
        etype, items = v
        n = len(items)
        out.append((n << 4 | etype) if n < 15 else (0xF0 | etype))
        if n >= 15:
            _varint(n, out)
        for item in items:
            _value(etype, item, out)
    elif ttype in (BOOL_TRUE, BOOL_FALSE):
        out.append(BOOL_TRUE if v else BOOL_FALSE)
    elif ttype == BYTE:
        out.append(int(v) & 0xFF)
    elif ttype == DOUBLE:
        out += _struct.pack("<d", v)
    elif ttype == MAP:
        kt, vt, items = v
        _varint(len(items), out)
        if items:
            out.append(kt << 4 | vt)
        for k, x in items:
            _value(kt, k, out)
            _value(vt, x, out)
    else:
        raise ValueError(f"unknown type {ttype}")


def _struct_into(s: Struct, out: bytearray) -> None:
    last = 0
    for fid in sorted(s):
        ttype, v = s[fid]
        code = (BOOL_TRUE if v else BOOL_FALSE) if ttype in (BOOL_TRUE, BOOL_FALSE) else ttype
        delta = fid - last
        if 0 < delta <= 15:
            out.append(delta << 4 | code)
        else:
            out.append(code)
            _zigzag(fid, out)
        if ttype not in (BOOL_TRUE, BOOL_FALSE):
            _value(ttype, v, out)
        last = fid
    out.append(0)


def encode(s: Struct) -> bytes:
    """The compact-protocol bytes of struct ``s`` (fields written in id order)."""
    out = bytearray()
    _struct_into(s, out)
    return bytes(out)


# --------------------------------------------------------------------------------------------
# Building values


def i64(v: int) -> tuple[int, int]:
    return (I64, int(v))


def binary(v: bytes | str) -> tuple[int, bytes]:
    return (BINARY, v.encode() if isinstance(v, str) else bytes(v))


def list_of(etype: int, items: list) -> tuple[int, tuple[int, list]]:
    """A list of ``etype`` elements (structs: the dicts inside :func:`struct`'s pairs)."""
    return (LIST, (etype, list(items)))


def get(s: Struct, fid: int, default: Any = None) -> Any:
    """The value of field ``fid`` of ``s`` (``default`` when absent)."""
    f = s.get(fid)
    return default if f is None else f[1]
