"""Fake of DCGM's ``dcgm_structs`` (NVIDIA/DCGM testing/python3/dcgm_structs.py): only what gpumon touches.

Return codes, the ``DCGMError`` hierarchy (one generated subclass per ``DCGM_ST_*`` code, picked by
``DCGMError(code)`` itself, looked up with ``dcgmExceptionClass``), ``_dcgmCheckReturn`` and the few structs
the agent hands back. Loading ``libdcgm.so.4`` is replaced by a flag tests can set.
"""

from __future__ import annotations

import string
import sys
from ctypes import (
    Structure,
    Union,
    c_byte,
    c_char,
    c_double,
    c_int,
    c_int64,
    c_short,
    c_uint,
    c_ushort,
    sizeof,
)
from typing import Any

DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_BLOB_LENGTH = 4096

DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_MEMORY = -4
DCGM_ST_NOT_CONFIGURED = -5
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_NVML_ERROR = -8
DCGM_ST_UNINITIALIZED = -10
DCGM_ST_TIMEOUT = -11
DCGM_ST_VER_MISMATCH = -12
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_GPU_IS_LOST = -18
DCGM_ST_FUNCTION_NOT_FOUND = -20
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_GPU_NOT_SUPPORTED = -22
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_GROUP_IS_EMPTY = -35
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_LIBRARY_ERROR = -37
DCGM_ST_PROFILING_MULTI_PASS = -38
DCGM_ST_INSUFFICIENT_DRIVER_VERSION = -44
DCGM_ST_PAUSED = -54

DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1
DCGM_GROUP_ALL_GPUS = 0x7FFFFFFF
DCGM_GROUP_ALL_NVSWITCHES = 0x7FFFFFFE


class DCGMError(Exception):
    """Class to return error values for DCGM"""

    _valClassMapping: dict[int, type[DCGMError]] = {}
    _error_code_to_string = {
        DCGM_ST_OK: "Success",
        DCGM_ST_BADPARAM: "Bad parameter passed to function",
        DCGM_ST_GENERIC_ERROR: "Generic unspecified error",
        DCGM_ST_MEMORY: "Out of memory error",
        DCGM_ST_NOT_CONFIGURED: "Setting not configured",
        DCGM_ST_NOT_SUPPORTED: "Feature not supported",
        DCGM_ST_INIT_ERROR: "DCGM initialization error",
        DCGM_ST_NVML_ERROR: "NVML error",
        DCGM_ST_UNINITIALIZED: "Object is in an undefined state",
        DCGM_ST_TIMEOUT: "Timeout",
        DCGM_ST_VER_MISMATCH: "API version mismatch",
        DCGM_ST_UNKNOWN_FIELD: "Unknown field",
        DCGM_ST_NO_DATA: "No data is available",
        DCGM_ST_NOT_WATCHED: "Field is not being updated",
        DCGM_ST_NO_PERMISSION: "Not permissioned",
        DCGM_ST_GPU_IS_LOST: "GPU is unreachable",
        DCGM_ST_FUNCTION_NOT_FOUND: "Unable to find function",
        DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
        DCGM_ST_GPU_NOT_SUPPORTED: "This GPU is not supported by DCGM",
        DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
        DCGM_ST_REQUIRES_ROOT: "This operation is not supported when the host engine is running as non root",
        DCGM_ST_MODULE_NOT_LOADED: "This request is serviced by a module of DCGM that is not currently "
        "loaded",
        DCGM_ST_GROUP_IS_EMPTY: "The specified group is empty, and this operation is incompatible with an "
        "empty group",
        DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
        DCGM_ST_PROFILING_LIBRARY_ERROR: "The third-party Profiling module returned an unrecoverable error",
        DCGM_ST_PROFILING_MULTI_PASS: "The requested profiling metrics cannot be collected in a single pass",
        DCGM_ST_INSUFFICIENT_DRIVER_VERSION: "The installed driver version is insufficient for this API",
        DCGM_ST_PAUSED: "The hostengine and all modules are paused",
    }
    info: Any
    value: int

    def __new__(cls, value: int) -> DCGMError:
        # the real class picks the code's subclass here, so DCGMError(code) raises e.g. DCGMError_Timeout
        if cls is DCGMError:
            cls = DCGMError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.info = None
        obj.value = value
        return obj

    def __str__(self) -> str:
        msg = DCGMError._error_code_to_string.get(self.value, f"DCGM Error with code {self.value}")
        if self.info is not None:
            msg = msg.rstrip(".") + f": '{self.info}'"
        return msg

    def __eq__(self, other: object) -> bool:
        return self.value == getattr(other, "value", None)

    def __hash__(self) -> int:
        return hash(self.value)

    def SetAdditionalInfo(self, msg: str) -> None:
        self.info = msg


def dcgmExceptionClass(error_code: int) -> type[DCGMError] | None:
    return DCGMError._valClassMapping.get(error_code)


def _extractDCGMErrorsAsClasses() -> None:
    # same naming as the real module: DCGM_ST_PROFILING_NOT_SUPPORTED -> DCGMError_ProfilingNotSupported
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("DCGM_ST_")]:
        class_name = "DCGMError_" + string.capwords(err_name.replace("DCGM_ST_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val: int) -> Any:
            def new(typ: type[DCGMError]) -> DCGMError:
                return DCGMError.__new__(typ, val)

            return new

        new_error_class = type(class_name, (DCGMError,), {"__new__": gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        DCGMError._valClassMapping[err_val] = new_error_class


_extractDCGMErrorsAsClasses()


# Stands in for "libdcgm.so.4 was found": tests set it False to see DCGM_ST_LIBRARY_NOT_FOUND.
fake_library_present = True
_dcgmLib_refcount = 0


def _dcgmInit(libDcgmPath: str | None = None) -> None:
    global _dcgmLib_refcount
    if not fake_library_present:
        _dcgmCheckReturn(DCGM_ST_LIBRARY_NOT_FOUND)
    _dcgmLib_refcount += 1


def _dcgmCheckReturn(ret: int) -> int:
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def make_dcgm_version(struct: Any, ver: int) -> int:
    return sizeof(struct) | (ver << 24)


class c_dcgmConnectV2Params_v2(Structure):
    _fields_ = [
        ("version", c_uint),
        ("persistAfterDisconnect", c_uint),
        ("timeoutMs", c_uint),
        ("addressIsUnixSocket", c_uint),
    ]


c_dcgmConnectV2Params_version2 = make_dcgm_version(c_dcgmConnectV2Params_v2, 2)
c_dcgmConnectV2Params_version = c_dcgmConnectV2Params_version2


class c_dcgmDeviceIdentifiers_v1(Structure):
    _fields_ = [
        ("version", c_uint),
        ("brandName", c_char * DCGM_MAX_STR_LENGTH),
        ("deviceName", c_char * DCGM_MAX_STR_LENGTH),
        ("pciBusId", c_char * DCGM_MAX_STR_LENGTH),
        ("serial", c_char * DCGM_MAX_STR_LENGTH),
        ("uuid", c_char * DCGM_MAX_STR_LENGTH),
        ("vbios", c_char * DCGM_MAX_STR_LENGTH),
        ("inforomImageVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("pciDeviceId", c_uint),
        ("pciSubSystemId", c_uint),
        ("driverVersion", c_char * DCGM_MAX_STR_LENGTH),
        ("virtualizationMode", c_uint),
    ]

    def __getattribute__(self, key: str) -> Any:
        # the real _PrintableStructure hands strings back decoded
        value = super().__getattribute__(key)
        return value.decode("utf-8") if isinstance(value, bytes) else value


class c_dcgmDeviceAttributes_v3(Structure):
    # the real struct also carries clockSets, thermalSettings, powerLimits and memoryUsage
    _fields_ = [("version", c_uint), ("identifiers", c_dcgmDeviceIdentifiers_v1)]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


class c_dcgmFieldValue_v1_value(Union):
    _fields_ = [
        ("i64", c_int64),
        ("dbl", c_double),
        ("str", c_char * DCGM_MAX_STR_LENGTH),
        ("blob", c_byte * DCGM_MAX_BLOB_LENGTH),
    ]


class c_dcgmFieldValue_v1(Structure):
    _fields_ = [
        ("version", c_uint),
        ("fieldId", c_ushort),
        ("fieldType", c_short),
        ("status", c_int),
        ("ts", c_int64),
        ("value", c_dcgmFieldValue_v1_value),
    ]


dcgmFieldValue_version1 = make_dcgm_version(c_dcgmFieldValue_v1, 1)
