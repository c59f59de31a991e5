"""NVML values to JSON and back: numbers and strings as they are, pynvml's ctypes structures by name and
field, and handles (GPUs, MIG devices, event sets, GPM sample buffers) as names such as ``gpu0`` or
``gpu0/mig3``.

Encoding never fails: a value it cannot describe is written as its ``repr`` (and cannot be replayed), so a
capture of an unfamiliar driver is still written and still readable.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import pynvml

from gpumon.gpu import fields as field_codec  # the one decoder and encoder of field values

# ops whose answer is a handle, and the name the first handle of each gets
HANDLE_OPS = {
    "nvmlDeviceGetHandleByIndex": "gpu",
    "nvmlDeviceGetHandleByUUID": "gpu",
    "nvmlDeviceGetHandleByPciBusId": "gpu",
    "nvmlDeviceGetMigDeviceHandleByIndex": "mig",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": "gpu",
    "nvmlEventSetCreate": "eventset",
    "nvmlGpmSampleAlloc": "gpm",
}


def address(pointer: Any) -> int:
    """Where a ctypes pointer (a device handle, a GPM sample buffer) points: the same for every copy of it."""
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


def _key(obj: Any) -> tuple[str, int]:
    if isinstance(obj, ctypes._Pointer):
        return ("addr", address(obj))
    return ("obj", id(obj))


class Refs:
    """Names for the opaque objects NVML hands out. The same GPU reached two ways (by index, by UUID) is one
    name, because NVML returns the same handle for it."""

    def __init__(self) -> None:
        self._names: dict[tuple[str, int], str] = {}
        self._alive: list[Any] = []  # id() keys stay unique only while their objects live
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def name(self, obj: Any) -> str | None:
        if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return None
        return self._names.get(_key(obj))

    def add(self, obj: Any, op: str, args: tuple[Any, ...]) -> str:
        """Name a handle that ``op(*args)`` returned."""
        with self._lock:
            known = self._names.get(_key(obj))
            if known is not None:
                return known
            kind = HANDLE_OPS[op]
            if op == "nvmlDeviceGetHandleByIndex":
                name = f"gpu{int(args[0])}"
            elif op == "nvmlDeviceGetMigDeviceHandleByIndex":
                name = f"{self._names.get(_key(args[0]), 'gpu?')}/mig{int(args[1])}"
            else:
                n = self._counts.get(kind, 0)
                self._counts[kind] = n + 1
                name = f"{kind}{n}" if kind != "gpu" else f"gpu-{n}"
            self._names[_key(obj)] = name
            self._alive.append(obj)
            return name


def raw(struct: Any, name: str) -> Any:
    # pynvml's structures decode char arrays on attribute access; the stored bytes are what NVML wrote
    return ctypes.Structure.__getattribute__(struct, name)


def _field_value(struct: Any) -> dict[str, Any]:
    """One ``c_nvmlFieldValue_t`` with its union member chosen by ``valueType``, as a number."""
    ((_, value),) = field_codec.decode((pynvml.c_nvmlFieldValue_t * 1)(struct))
    out = {name: raw(struct, name) for name, _ in struct._fields_ if name != "value"}
    out["value"] = value
    return {"struct": "c_nvmlFieldValue_t", "fields": out}


def encode(value: Any, refs: Refs) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    name = refs.name(value)
    if name is not None:
        return {"ref": name}
    if isinstance(value, bytes):
        text = value.rstrip(b"\0")
        if text.isascii() and text.decode().isprintable():
            return {"ascii": value.decode()}  # bus ids, names: readable in the file
        return {"bytes": value.hex()}
    if isinstance(value, list):
        return [encode(v, refs) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [encode(v, refs) for v in value]}
    if isinstance(value, ctypes._SimpleCData):
        return encode(value.value, refs)
    if isinstance(value, ctypes.Array):
        return {"array": value._type_.__name__, "items": [encode(v, refs) for v in value]}
    if isinstance(value, pynvml.c_nvmlFieldValue_t):
        return _field_value(value)
    if isinstance(value, ctypes.Structure):
        fields = {f[0]: encode(raw(value, f[0]), refs) for f in value._fields_}
        return {"struct": type(value).__name__, "fields": fields}
    if isinstance(value, ctypes.Union):
        return {"union": type(value).__name__, "bytes": bytes(value).hex()}
    if isinstance(value, ctypes._Pointer):
        return {"pointer": type(value).__name__, "null": not value}
    attrs = getattr(value, "__dict__", None)
    if attrs is None and hasattr(type(value), "__slots__"):
        attrs = {s: getattr(value, s) for s in type(value).__slots__ if hasattr(value, s)}
    if attrs is not None:  # pynvml's friendly objects (process lists), the simulator's event data
        return {"object": {k: encode(v, refs) for k, v in attrs.items() if not k.startswith("_")}}
    return {"repr": repr(value)}


class Unreplayable(Exception):
    """A captured value gpumon could not describe when it was recorded."""


def decode(value: Any, handles: dict[str, Any]) -> Any:
    """The recorded value, rebuilt: pynvml's own structure where it was one, so the backend reads it the same
    way; a structure that held a handle becomes a plain object (ctypes cannot hold the replay's handles)."""
    if not isinstance(value, (dict, list)):
        return value
    if isinstance(value, list):
        return [decode(v, handles) for v in value]
    if "ref" in value:
        return handles[value["ref"]]
    if "ascii" in value:
        return value["ascii"].encode()
    if "bytes" in value and len(value) == 1:
        return bytes.fromhex(value["bytes"])
    if "tuple" in value:
        return tuple(decode(v, handles) for v in value["tuple"])
    if "array" in value:
        return _array(value, handles)
    if "struct" in value:
        return _struct(value["struct"], value["fields"], handles)
    if "object" in value:
        return pynvml.nvmlFriendlyObject({k: decode(v, handles) for k, v in value["object"].items()})
    if "union" in value:
        union = getattr(pynvml, value["union"])()
        ctypes.memmove(ctypes.addressof(union), bytes.fromhex(value["bytes"]), ctypes.sizeof(union))
        return union
    if "pointer" in value and value["null"]:
        return None
    raise Unreplayable(f"cannot rebuild {value!r}")


def _element_type(name: str) -> Any:
    return getattr(pynvml, name, None) or getattr(ctypes, name)


def _array(value: dict[str, Any], handles: dict[str, Any]) -> Any:
    items = [decode(v, handles) for v in value["items"]]
    arr = (_element_type(value["array"]) * len(items))()
    for i, item in enumerate(items):
        arr[i] = item
    return arr


def _struct(name: str, fields: dict[str, Any], handles: dict[str, Any]) -> Any:
    if name == "c_nvmlFieldValue_t":
        one = (pynvml.c_nvmlFieldValue_t * 1)()
        f = fields
        field_codec.encode(
            one, 0, f["fieldId"], f["scopeId"], f["timestamp"], f["latencyUsec"], f["valueType"],
            f["nvmlReturn"], f["value"] if f["value"] is not None else 0,
        )  # fmt: skip
        return one[0]
    decoded = {k: decode(v, handles) for k, v in fields.items()}
    cls = getattr(pynvml, name, None)
    if cls is None or any(_holds_handle(v) for v in fields.values()):
        return pynvml.nvmlFriendlyObject(decoded)
    struct = cls()
    for k, v in decoded.items():
        if v is None:
            continue
        target = raw(struct, k)
        if isinstance(target, ctypes.Array) and isinstance(v, (list, ctypes.Array)):
            for i, item in enumerate(v):
                target[i] = item
        else:
            setattr(struct, k, v)
    return struct


def _holds_handle(value: Any) -> bool:
    return isinstance(value, dict) and "ref" in value
