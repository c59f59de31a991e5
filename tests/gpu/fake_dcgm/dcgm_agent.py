"""Fake of DCGM's ``dcgm_agent`` (NVIDIA/DCGM testing/python3/dcgm_agent.py): the calls gpumon makes.

Names, arguments and return shapes follow the real wrappers: handles, group ids and field-group ids are
``c_void_p``, every failure is a non-OK return code turned into a ``DCGMError`` subclass by
``dcgm_structs._dcgmCheckReturn``. Behind them sits ``engine``, a stand-in for the host engine that
tests drive: which GPUs exist, what each field reads, which call fails with which code, and what is still
registered (handles, groups, field groups, watches).
"""

from __future__ import annotations

from collections.abc import Callable
from ctypes import c_void_p
from dataclasses import dataclass, field
from typing import Any

import dcgm_fields
import dcgm_structs
import dcgmvalue


@dataclass
class FakeEngine:
    gpus: dict[int, str] = field(default_factory=dict)  # DCGM gpu id -> UUID
    values: dict[tuple[int, int], int | float] = field(default_factory=dict)  # (gpu id, field id) -> value
    statuses: dict[tuple[int, int], int] = field(default_factory=dict)  # (gpu id, field id) -> DCGM_ST_*
    fail: dict[str, int] = field(default_factory=dict)  # dcgm_agent function name -> DCGM_ST_* it returns
    handles: dict[int, str | None] = field(default_factory=dict)  # live handle -> address (None: embedded)
    groups: dict[int, tuple[int, str, list[int]]] = field(default_factory=dict)  # id -> handle, name, gpus
    field_groups: dict[int, tuple[int, str, list[int]]] = field(default_factory=dict)  # id -> handle, ...
    watches: dict[tuple[int, int], tuple[int, float, int]] = field(default_factory=dict)
    leaked: list[str] = field(default_factory=list)  # what a handle still owned when it was closed
    calls: list[str] = field(default_factory=list)
    next_id: int = 1

    def make_unreachable(self) -> None:
        self.fail["dcgmConnect_v2"] = dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID
        self.fail["dcgmStartEmbedded"] = dcgm_structs.DCGM_ST_INIT_ERROR

    def make_profiling_unsupported(self, code: int = dcgm_structs.DCGM_ST_PROFILING_NOT_SUPPORTED) -> None:
        self.fail["dcgmWatchFields"] = code

    def set_value(self, gpu_id: int, field_id: int, value: float) -> None:
        self.values[gpu_id, field_id] = value

    def registered(self) -> list[str]:
        return [
            *(f"handle {h}" for h in self.handles),
            *(f"group {g[1]}" for g in self.groups.values()),
            *(f"field group {fg[1]}" for fg in self.field_groups.values()),
            *(f"watch {w}" for w in self.watches),
        ]

    # -- used by the fake calls -------------------------------------------------------------------------
    def call(self, name: str, handle: Any = None) -> None:
        self.calls.append(name)
        if name in self.fail:
            dcgm_structs._dcgmCheckReturn(self.fail[name])
        if handle is not None and _id(handle) not in self.handles:
            dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def close_handle(self, handle: int) -> None:
        del self.handles[handle]
        # a real host engine drops a closed connection's objects; remember them so tests can see a leak
        for gid, (owner, name, _) in list(self.groups.items()):
            if owner == handle:
                self.leaked.append(f"group {name}")
                del self.groups[gid]
                for key in [k for k in self.watches if k[0] == gid]:
                    self.leaked.append(f"watch {key}")
                    del self.watches[key]
        for fgid, (owner, name, _) in list(self.field_groups.items()):
            if owner == handle:
                self.leaked.append(f"field group {name}")
                del self.field_groups[fgid]


engine = FakeEngine()


def _id(ptr: Any) -> int:
    return int(ptr.value if isinstance(ptr, c_void_p) else ptr)


def dcgmInit() -> int:
    engine.call("dcgmInit")
    return dcgm_structs.DCGM_ST_OK


def dcgmShutdown() -> int:
    engine.call("dcgmShutdown")
    return dcgm_structs.DCGM_ST_OK


def dcgmStartEmbedded(opMode: int) -> c_void_p:
    engine.call("dcgmStartEmbedded")
    if opMode not in (dcgm_structs.DCGM_OPERATION_MODE_AUTO, dcgm_structs.DCGM_OPERATION_MODE_MANUAL):
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    handle = engine.new_id()
    engine.handles[handle] = None
    return c_void_p(handle)


def dcgmStopEmbedded(dcgm_handle: c_void_p) -> int:
    engine.call("dcgmStopEmbedded", dcgm_handle)
    engine.close_handle(_id(dcgm_handle))
    return dcgm_structs.DCGM_ST_OK


def dcgmConnect_v2(
    ip_address: str, connectParams: Any, version: int = dcgm_structs.c_dcgmConnectV2Params_version
) -> c_void_p:
    engine.call("dcgmConnect_v2")
    connectParams.version = version
    handle = engine.new_id()
    engine.handles[handle] = ip_address
    return c_void_p(handle)


def dcgmDisconnect(dcgm_handle: c_void_p) -> int:
    engine.call("dcgmDisconnect", dcgm_handle)
    engine.close_handle(_id(dcgm_handle))
    return dcgm_structs.DCGM_ST_OK


def dcgmGetAllSupportedDevices(dcgm_handle: c_void_p) -> list[int]:
    engine.call("dcgmGetAllSupportedDevices", dcgm_handle)
    return sorted(engine.gpus)


def dcgmGetDeviceAttributes(
    dcgm_handle: c_void_p, gpuId: int, version: int = dcgm_structs.dcgmDeviceAttributes_version3
) -> Any:
    engine.call("dcgmGetDeviceAttributes", dcgm_handle)
    if gpuId not in engine.gpus:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    attrs = dcgm_structs.c_dcgmDeviceAttributes_v3()
    attrs.version = version
    attrs.identifiers.uuid = engine.gpus[gpuId].encode()
    return attrs


def dcgmGroupCreate(dcgm_handle: c_void_p, type: int, groupName: str) -> c_void_p:
    engine.call("dcgmGroupCreate", dcgm_handle)
    gid = engine.new_id()
    gpus = sorted(engine.gpus) if type == dcgm_structs.DCGM_GROUP_DEFAULT else []
    engine.groups[gid] = (_id(dcgm_handle), groupName, gpus)
    return c_void_p(gid)


def dcgmGroupDestroy(dcgm_handle: c_void_p, group_id: c_void_p) -> int:
    engine.call("dcgmGroupDestroy", dcgm_handle)
    if engine.groups.pop(_id(group_id), None) is None:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_NOT_CONFIGURED)
    return dcgm_structs.DCGM_ST_OK


def dcgmGroupAddDevice(dcgm_handle: c_void_p, group_id: c_void_p, gpu_id: int) -> int:
    engine.call("dcgmGroupAddDevice", dcgm_handle)
    if gpu_id not in engine.gpus or _id(group_id) not in engine.groups:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    engine.groups[_id(group_id)][2].append(gpu_id)
    return dcgm_structs.DCGM_ST_OK


def dcgmFieldGroupCreate(dcgm_handle: c_void_p, fieldIds: list[int], fieldGroupName: str) -> c_void_p:
    engine.call("dcgmFieldGroupCreate", dcgm_handle)
    if any(f not in dcgm_fields.FAKE_FIELD_TYPES for f in fieldIds):
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_UNKNOWN_FIELD)
    fgid = engine.new_id()
    engine.field_groups[fgid] = (_id(dcgm_handle), fieldGroupName, list(fieldIds))
    return c_void_p(fgid)


def dcgmFieldGroupDestroy(dcgm_handle: c_void_p, fieldGroupId: c_void_p) -> int:
    engine.call("dcgmFieldGroupDestroy", dcgm_handle)
    if engine.field_groups.pop(_id(fieldGroupId), None) is None:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_NO_DATA)
    return dcgm_structs.DCGM_ST_OK


def dcgmWatchFields(
    dcgm_handle: c_void_p,
    groupId: c_void_p,
    fieldGroupId: c_void_p,
    updateFreq: int,
    maxKeepAge: float,
    maxKeepSamples: int,
) -> int:
    engine.call("dcgmWatchFields", dcgm_handle)
    if _id(groupId) not in engine.groups or _id(fieldGroupId) not in engine.field_groups:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
    if not engine.groups[_id(groupId)][2]:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_GROUP_IS_EMPTY)
    engine.watches[_id(groupId), _id(fieldGroupId)] = (
        int(updateFreq),
        float(maxKeepAge),
        int(maxKeepSamples),
    )
    return dcgm_structs.DCGM_ST_OK


def dcgmUnwatchFields(dcgm_handle: c_void_p, groupId: c_void_p, fieldGroupId: c_void_p) -> int:
    engine.call("dcgmUnwatchFields", dcgm_handle)
    engine.watches.pop((_id(groupId), _id(fieldGroupId)), None)
    return dcgm_structs.DCGM_ST_OK


def dcgmUpdateAllFields(dcgm_handle: c_void_p, waitForUpdate: int) -> int:
    engine.call("dcgmUpdateAllFields", dcgm_handle)
    return dcgm_structs.DCGM_ST_OK


def _raw_value(gpu_id: int, field_id: int, watched: bool) -> Any:
    fv = dcgm_structs.c_dcgmFieldValue_v1()
    fv.version = dcgm_structs.dcgmFieldValue_version1
    fv.fieldId = field_id
    field_type = dcgm_fields.FAKE_FIELD_TYPES[field_id]
    fv.fieldType = ord(field_type)
    fv.ts = 1_700_000_000_000_000  # usec since 1970
    fv.status = engine.statuses.get((gpu_id, field_id), dcgm_structs.DCGM_ST_OK)
    if not watched:
        fv.status = dcgm_structs.DCGM_ST_NOT_WATCHED
    # a watched field with no sample yet reads as a blank, as the real cache manager reports it
    if field_type == dcgm_fields.DCGM_FT_DOUBLE:
        fv.value.dbl = engine.values.get((gpu_id, field_id), dcgmvalue.DCGM_FP64_BLANK)
    else:
        fv.value.i64 = int(engine.values.get((gpu_id, field_id), dcgmvalue.DCGM_INT64_BLANK))
    return fv


def dcgmGetLatestValues_v2(
    dcgm_handle: c_void_p,
    groupId: c_void_p,
    fieldGroupId: c_void_p,
    enumCB: Callable[[int, int, list[Any], int, Any], int],
    userData: Any,
) -> int:
    engine.call("dcgmGetLatestValues_v2", dcgm_handle)
    group = engine.groups.get(_id(groupId))
    field_group = engine.field_groups.get(_id(fieldGroupId))
    if group is None or field_group is None:
        dcgm_structs._dcgmCheckReturn(dcgm_structs.DCGM_ST_BADPARAM)
        return dcgm_structs.DCGM_ST_BADPARAM
    watched = (_id(groupId), _id(fieldGroupId)) in engine.watches
    for gpu_id in group[2]:
        values = [_raw_value(gpu_id, f, watched) for f in field_group[2]]
        enumCB(dcgm_fields.DCGM_FE_GPU, gpu_id, values, len(values), userData)
    return dcgm_structs.DCGM_ST_OK
