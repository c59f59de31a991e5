"""Just enough of the protobuf wire format to talk to the kubelet without protobuf or generated code.

https://protobuf.dev/programming-guides/encoding/ ; the reader accepts every wire type, so fields a newer
kubelet adds (or ones we do not care about, like packed cpu_ids) are skipped instead of breaking the parse.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5

_MAX_VARINT_BYTES = 10
_GROUP_DEPTH = 32  # groups are deprecated; the limit only stops a hostile payload recursing forever


class ProtoError(ValueError):
    """The bytes are not a well-formed protobuf message (or not the one we expected)."""


def encode_varint(value: int) -> bytes:
    # negative int64s go on the wire as their 64-bit two's complement: always 10 bytes
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    result = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(buf):
            raise ProtoError("truncated varint")
        byte = buf[pos + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & ((1 << 64) - 1), pos + i + 1
        shift += 7
    raise ProtoError("varint longer than 10 bytes")


def _take(buf: bytes, pos: int, n: int) -> tuple[bytes, int]:
    if pos + n > len(buf):
        raise ProtoError(f"field of {n} bytes runs past the end of the message")
    return buf[pos : pos + n], pos + n


def _read_value(buf: bytes, pos: int, number: int, wtype: int, depth: int) -> tuple[int | bytes | None, int]:
    if wtype == VARINT:
        return decode_varint(buf, pos)
    if wtype == LEN:
        n, pos = decode_varint(buf, pos)
        return _take(buf, pos, n)
    if wtype in (I64, I32):
        raw, pos = _take(buf, pos, 8 if wtype == I64 else 4)
        return int.from_bytes(raw, "little"), pos
    if wtype == SGROUP:
        if depth >= _GROUP_DEPTH:
            raise ProtoError("groups nested too deep")
        while True:
            key, pos = decode_varint(buf, pos)
            inner, inner_type = key >> 3, key & 7
            if inner_type == EGROUP:
                if inner != number:
                    raise ProtoError(f"group {number} closed by end-group {inner}")
                return None, pos
            _, pos = _read_value(buf, pos, inner, inner_type, depth + 1)
    raise ProtoError(f"unexpected wire type {wtype} for field {number}")


def iter_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field; LEN values are raw bytes, groups are skipped."""
    pos = 0
    while pos < len(buf):
        key, pos = decode_varint(buf, pos)
        number, wtype = key >> 3, key & 7
        if number == 0:
            raise ProtoError("field number 0")
        value, pos = _read_value(buf, pos, number, wtype, 0)
        if value is not None:
            yield number, wtype, value


def expect_bytes(number: int, wtype: int, value: int | bytes) -> bytes:
    # a known field arriving with another wire type means the schema changed under us: fail loudly
    # rather than silently reading nothing and reporting an empty node
    if wtype != LEN or not isinstance(value, bytes):
        raise ProtoError(f"field {number}: expected length-delimited, got wire type {wtype}")
    return value


def expect_str(number: int, wtype: int, value: int | bytes) -> str:
    try:
        return expect_bytes(number, wtype, value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtoError(f"field {number}: invalid UTF-8") from exc


def field_bytes(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | LEN) + encode_varint(len(payload)) + payload


def field_str(number: int, text: str) -> bytes:
    return field_bytes(number, text.encode("utf-8"))
