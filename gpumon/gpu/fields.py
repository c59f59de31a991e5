"""NVML field-value arrays (``c_nvmlFieldValue_t``) decoded and encoded in one pass.

Reading ``v.nvmlReturn`` and ``v.value.ullVal`` through pynvml's structure wrappers costs about a
microsecond per attribute; a node with 8 GPUs and 18 NVLinks each reads ~370 fields a second. Unpacking the
array's memory with ``struct`` does the same work in one C call. The layout is checked against the installed
pynvml at import; if a binding ever lays the structure out differently, the attribute path is used.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

import pynvml

_T = pynvml.c_nvmlFieldValue_t
_LAYOUT = struct.Struct("=IIqqII8s")  # fieldId scopeId timestamp latencyUsec valueType nvmlReturn value
_OFFSETS = [0, 4, 8, 16, 24, 28, 32]
FAST = ctypes.sizeof(_T) == _LAYOUT.size and [getattr(_T, n).offset for n, _ in _T._fields_] == _OFFSETS

_VALUE = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: struct.Struct("=d"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("=I"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("=Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "=I"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("=Q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("=q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("=i"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("=H"),
}
_UNION_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}
_ULL = _VALUE[pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG]


def decode(values: Any) -> list[tuple[int, float | None]]:
    """``(nvmlReturn, value)`` per entry; the value is None unless the entry succeeded."""
    if FAST and isinstance(values, ctypes.Array) and values._type_ is _T:
        return [
            (ret, _VALUE.get(vtype, _ULL).unpack_from(raw)[0] if ret == pynvml.NVML_SUCCESS else None)
            for _, _, _, _, vtype, ret, raw in _LAYOUT.iter_unpack(bytes(values))
        ]
    out: list[tuple[int, float | None]] = []
    for v in values:
        ret = v.nvmlReturn
        if ret != pynvml.NVML_SUCCESS:
            out.append((ret, None))
            continue
        out.append((ret, getattr(v.value, _UNION_MEMBER.get(v.valueType, "ullVal"))))
    return out


def request(field_ids: Sequence[int | tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``(fieldId, scopeId)`` pairs of a request as nvmlDeviceGetFieldValues accepts it."""
    return [(f, 0) if isinstance(f, int) else (f[0], f[1]) for f in field_ids]


def encode(
    values: Any,
    index: int,
    field_id: int,
    scope_id: int,
    timestamp: int,
    latency_us: int,
    value_type: int,
    ret: int,
    value: float,
) -> None:
    """Write one entry in place (what the NVML library does; used by the simulator)."""
    raw = _VALUE[value_type].pack(value).ljust(8, b"\0") if ret == pynvml.NVML_SUCCESS else bytes(8)
    _LAYOUT.pack_into(
        values, index * _LAYOUT.size, field_id, scope_id, timestamp, latency_us, value_type, ret, raw
    )
