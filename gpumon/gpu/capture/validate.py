"""Checks that a capture's calls have the shapes replay and the NVML backend rely on, so that a damaged or
hand-edited file is refused in one line when it is loaded, instead of failing inside a sweep (a GPU marked
down for a string where NVML gives a number) or at start (an internal error).

The grammar of encoded values is codec.py's; the answer each op must have is NVML's (an int, a string, a
handle, one of nvidia-ml-py's structures).
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import pynvml

from gpumon.gpu import fields as field_codec

U64 = 1 << 64
MAX_GPUS = 256  # nvmlDeviceGetCount: far above any node; a bigger count would make discovery run for hours

_INT_OPS = {
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetIndex",
    "nvmlSystemGetCudaDriverVersion",
}
_LIMITS = {"nvmlDeviceGetCount": MAX_GPUS, "nvmlDeviceGetMaxMigDeviceCount": 64}
_STR_OPS = {
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardPartNumber",
    "nvmlDeviceGetVbiosVersion",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
}
_HANDLE_OPS = {
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlEventSetCreate",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet",
}
# struct-valued answers and the fields the backend reads from them
_STRUCT_OPS = {
    "nvmlDeviceGetUtilizationRates": ("gpu", "memory"),
    "nvmlDeviceGetMemoryInfo": ("total", "used", "free"),
    "nvmlDeviceGetPciInfo": ("busId",),
    "nvmlGpmQueryDeviceSupport": ("isSupportedDevice",),
    "nvmlEventSetWait_v2": ("device", "eventType", "eventData"),
}
# calls without which nothing can be replayed: a capture cannot say the binding lacked them
_CORE = {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID"}


# fields of process entries the backend reads as numbers
_NUMERIC = {"usedGpuMemory", "gpuInstanceId", "computeInstanceId", "smUtil", "memUtil", "timeStamp"}


class Invalid(ValueError):
    pass


def check_call(call: dict[str, Any]) -> None:
    """Raises Invalid saying what is wrong with one recorded call."""
    op = call["op"]
    if call.get("missing"):
        if op in _CORE:
            raise Invalid(f"{op} cannot be missing: nothing can be replayed without it")
        return
    for arg in call["args"]:
        _value(arg)
    if "error" in call:
        if not isinstance(call["error"], str):
            raise Invalid('"error" must be a string')
        code = call.get("code", 0)
        if type(code) is not int or not 0 <= code < 1 << 31:
            raise Invalid(f'"code" must be an NVML return code, got {code!r}')
        if not isinstance(call.get("message", ""), str):
            raise Invalid('"message" must be a string')
        return
    if "value" not in call:
        raise Invalid('a call needs "value", "error" or "missing"')
    _answer(op, call["args"], call["value"])


def _answer(op: str, args: list[Any], value: Any) -> None:
    if op in _INT_OPS or op in _LIMITS:
        _int(value, _LIMITS.get(op, U64))
    elif op in _STR_OPS:
        if not isinstance(value, str):
            raise Invalid(f"expected a string, got {value!r}")
    elif op in _HANDLE_OPS:
        if not (isinstance(value, dict) and isinstance(value.get("ref"), str)):
            raise Invalid(f'expected a handle ({{"ref": NAME}}), got {value!r}')
    elif op in _STRUCT_OPS:
        _fields_of(value, _STRUCT_OPS[op])
    elif op == "nvmlDeviceGetMigMode":
        if not (isinstance(value, list) and len(value) == 2):
            raise Invalid(f"expected [current, pending], got {value!r}")
        for v in value:
            _int(v)
    elif op == "nvmlDeviceGetRemappedRows":
        items = value.get("tuple") if isinstance(value, dict) else None
        if not (isinstance(items, list) and len(items) == 4):
            raise Invalid(f'expected {{"tuple": [4 numbers]}}, got {value!r}')
        for v in items:
            _int(v)
    elif op in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetProcessUtilization"):
        if not isinstance(value, list):
            raise Invalid(f"expected a list, got {value!r}")
        for item in value:
            _fields_of(item, ("pid",))
    elif op == "nvmlDeviceGetFieldValues":
        _field_values(args, value)
    elif op == "nvmlGpmMetricsGet":
        _metrics(value)
    else:
        _value(value)


def _int(value: Any, limit: int = U64) -> None:
    if type(value) is not int or not 0 <= value < limit:
        raise Invalid(f"expected a whole number from 0 to {limit - 1}, got {value!r}")


def _number(value: Any) -> None:
    if type(value) not in (int, float) or (type(value) is float and not math.isfinite(value)):
        raise Invalid(f"expected a finite number, got {value!r}")


def _fields_of(value: Any, needed: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a struct or object value, with ``needed`` present and plain where they are read."""
    _value(value)
    fields = value.get("fields") if isinstance(value, dict) and "struct" in value else None
    if fields is None and isinstance(value, dict):
        fields = value.get("object")
    if not isinstance(fields, dict):
        raise Invalid(f"expected a structure with {', '.join(needed)}, got {value!r}")
    for name in needed:
        if name not in fields:
            raise Invalid(f"the structure lacks {name}")
        v = fields[name]
        if name == "busId":
            if not (isinstance(v, dict) and isinstance(v.get("ascii"), str)):
                raise Invalid(f"busId must be text, got {v!r}")
        elif name == "device":
            if not (isinstance(v, dict) and isinstance(v.get("ref"), str)):
                raise Invalid(f"device must be a handle, got {v!r}")
        elif v is not None or name == "pid":
            _int(v)
    for name in _NUMERIC.intersection(fields):  # read as numbers where present
        if fields[name] is not None:
            _int(fields[name])
    return fields


def _field_values(args: list[Any], value: Any) -> None:
    if not (args and isinstance(args[0], dict) and isinstance(args[0].get("ref"), str)):
        raise Invalid("nvmlDeviceGetFieldValues needs a GPU handle as its first argument")
    is_array = isinstance(value, dict) and value.get("array") == "c_nvmlFieldValue_t"
    items = value.get("items") if is_array else None
    if not isinstance(items, list):
        raise Invalid(f'expected {{"array": "c_nvmlFieldValue_t", "items": [...]}}, got {value!r}')
    for item in items:
        is_field = isinstance(item, dict) and item.get("struct") == "c_nvmlFieldValue_t"
        f = item.get("fields") if is_field else None
        if not isinstance(f, dict):
            raise Invalid(f"expected a c_nvmlFieldValue_t, got {item!r}")
        for key in ("fieldId", "scopeId", "timestamp", "latencyUsec", "valueType", "nvmlReturn"):
            if type(f.get(key)) is not int:
                raise Invalid(f"field value {key} must be a whole number, got {f.get(key)!r}")
        if f["valueType"] not in field_codec._VALUE:
            raise Invalid(f"field value type {f['valueType']} is not one NVML has")
        if f["nvmlReturn"] == pynvml.NVML_SUCCESS:
            _number(f.get("value"))


def _metrics(value: Any) -> None:
    if not isinstance(value, list):
        raise Invalid(f"expected the list of GPM metrics, got {value!r}")
    for m in value:
        ids = (m.get("metricId"), m.get("nvmlReturn")) if isinstance(m, dict) else (None, None)
        if not all(type(x) is int for x in ids):
            raise Invalid(f"expected {{metricId, nvmlReturn, value}}, got {m!r}")
        _number(m.get("value"))


def _ctypes_type(name: Any, base: type | tuple[type, ...]) -> type:
    cls = getattr(pynvml, name, None) if isinstance(name, str) else None
    if cls is None and isinstance(name, str):
        cls = getattr(ctypes, name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise Invalid(f"{name!r} is not one of nvidia-ml-py's types")
    return cls


def _value(value: Any) -> None:
    """Any encoded value: JSON where JSON fits, else one of codec.py's tagged forms (format.py has already
    bounded how deep it nests)."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise Invalid(f"{value!r} is not a number NVML gives")
        return
    if isinstance(value, list):
        for v in value:
            _value(v)
        return
    if not isinstance(value, dict):
        raise Invalid(f"cannot read {value!r}")
    tags = set(value)
    if tags == {"ref"} and isinstance(value["ref"], str):
        return
    if tags == {"ascii"} and isinstance(value["ascii"], str):
        return
    if tags == {"bytes"} and isinstance(value["bytes"], str):
        try:
            bytes.fromhex(value["bytes"])
        except ValueError:
            raise Invalid(f"{value['bytes']!r} is not hex") from None
        return
    if tags == {"tuple"} and isinstance(value["tuple"], list):
        _value(value["tuple"])
        return
    if tags == {"array", "items"} and isinstance(value["items"], list):
        _ctypes_type(value["array"], (ctypes.Structure, ctypes.Union, ctypes._SimpleCData))
        _value(value["items"])
        return
    if tags == {"struct", "fields"} and isinstance(value["fields"], dict):
        cls = _ctypes_type(value["struct"], ctypes.Structure)
        known = {f[0] for f in getattr(cls, "_fields_", ())}
        unknown = set(value["fields"]) - known
        if unknown:
            raise Invalid(f"{value['struct']} has no field {sorted(unknown)[0]!r}")
        _value(list(value["fields"].values()))
        return
    if tags == {"object"} and isinstance(value["object"], dict):
        _value(list(value["object"].values()))
        return
    if tags == {"union", "bytes"} and isinstance(value["bytes"], str):
        _ctypes_type(value["union"], ctypes.Union)
        return
    if tags == {"pointer", "null"} or tags == {"repr"} or tags == {"gpm_source"}:
        return
    raise Invalid(f"cannot read {value!r}")
