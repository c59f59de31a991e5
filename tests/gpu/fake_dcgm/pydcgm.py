"""Fake of DCGM's ``pydcgm`` (NVIDIA/DCGM testing/python3/pydcgm.py and the classes it re-exports from
DcgmHandle.py, DcgmGroup.py and DcgmFieldGroup.py), cut down to what gpumon calls.

The real module is a thin object layer over ``dcgm_agent``; so is this one, over the fake agent.
"""

from __future__ import annotations

import contextlib
from typing import Any

import dcgm_agent
import dcgm_field_helpers
import dcgm_structs


class DcgmException(Exception):
    pass


class DcgmHandle:
    def __init__(
        self,
        handle: Any = None,
        ipAddress: str | None = None,
        opMode: int = dcgm_structs.DCGM_OPERATION_MODE_AUTO,
        persistAfterDisconnect: bool = False,
        unixSocketPath: str | None = None,
        timeoutMs: int = 0,
    ) -> None:
        self._handleCreated = False
        self._persistAfterDisconnect = persistAfterDisconnect
        if handle is not None:
            self.handle = handle
            return
        self._ipAddress = ipAddress
        if ipAddress is not None and unixSocketPath is not None:
            raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_BADPARAM)
        dcgm_structs._dcgmInit()
        dcgm_agent.dcgmInit()
        # no address: the host engine runs inside this process
        if ipAddress is None and unixSocketPath is None:
            self.handle = dcgm_agent.dcgmStartEmbedded(opMode)
            self.isEmbedded = True
            self._handleCreated = True
            return
        connectParams = dcgm_structs.c_dcgmConnectV2Params_v2()
        connectParams.version = dcgm_structs.c_dcgmConnectV2Params_version
        connectParams.timeoutMs = timeoutMs
        connectParams.persistAfterDisconnect = 1 if persistAfterDisconnect else 0
        connectParams.addressIsUnixSocket = 0 if ipAddress is not None else 1
        self.handle = dcgm_agent.dcgmConnect_v2(ipAddress or unixSocketPath, connectParams)
        self.isEmbedded = False
        self._handleCreated = True

    def __del__(self) -> None:
        if self._handleCreated:
            self.Shutdown()

    def Shutdown(self) -> None:
        if not self._handleCreated:
            return
        if self.isEmbedded:
            dcgm_agent.dcgmStopEmbedded(self.handle)
        else:
            dcgm_agent.dcgmDisconnect(self.handle)
        self._handleCreated = False
        self.handle = None

    def GetIpAddress(self) -> str | None:
        return self._ipAddress


class DcgmFieldGroup:
    def __init__(
        self,
        dcgmHandle: DcgmHandle,
        name: str = "",
        fieldIds: list[int] | None = None,
        fieldGroupId: Any = None,
    ) -> None:
        self.name = name
        self.fieldIds = fieldIds or []
        self._dcgmHandle: DcgmHandle | None = dcgmHandle
        self.wasCreated = False
        # assigned first so that the destructor copes with a failing create, as in the real class
        self.fieldGroupId: Any = None
        self.fieldGroupId = dcgm_agent.dcgmFieldGroupCreate(dcgmHandle.handle, self.fieldIds, name)
        self.wasCreated = True

    def Delete(self) -> None:
        assert self._dcgmHandle is not None
        # like the real one, a second Delete() fails (it reads self.fieldGroupId.value)
        if self.fieldGroupId.value is not None:
            dcgm_agent.dcgmFieldGroupDestroy(self._dcgmHandle.handle, self.fieldGroupId)
        self.fieldGroupId = None
        self._dcgmHandle = None

    def __del__(self) -> None:
        if self._dcgmHandle is not None and self.fieldGroupId is not None:
            with contextlib.suppress(dcgm_structs.DCGMError, AttributeError, TypeError):
                self.Delete()


class DcgmGroupSamples:
    def __init__(self, dcgmHandle: DcgmHandle, groupId: Any, dcgmGroup: DcgmGroup) -> None:
        self._dcgmHandle = dcgmHandle
        self._groupId = groupId
        self._dcgmGroup = dcgmGroup

    def WatchFields(
        self, fieldGroup: DcgmFieldGroup, updateFreq: int, maxKeepAge: float, maxKeepSamples: int
    ) -> None:
        ret = dcgm_agent.dcgmWatchFields(
            self._dcgmHandle.handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            updateFreq,
            maxKeepAge,
            maxKeepSamples,
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def UnwatchFields(self, fieldGroup: DcgmFieldGroup) -> None:
        ret = dcgm_agent.dcgmUnwatchFields(self._dcgmHandle.handle, self._groupId, fieldGroup.fieldGroupId)
        dcgm_structs._dcgmCheckReturn(ret)

    def GetLatest_v2(self, fieldGroup: DcgmFieldGroup) -> dcgm_field_helpers.DcgmFieldValueEntityCollection:
        dfvec = dcgm_field_helpers.DcgmFieldValueEntityCollection(self._dcgmHandle.handle, self._groupId)
        dfvec.GetLatestValues(fieldGroup)
        return dfvec


class DcgmGroup:
    def __init__(
        self,
        dcgmHandle: DcgmHandle,
        groupId: Any = None,
        groupName: str | None = None,
        groupType: int = dcgm_structs.DCGM_GROUP_EMPTY,
    ) -> None:
        self._dcgmHandle = dcgmHandle
        if groupId is None and groupName is None:
            raise DcgmException("Either groupId or groupName is required")
        if groupId is not None:
            self._groupId = groupId
        else:
            self._groupId = dcgm_agent.dcgmGroupCreate(self._dcgmHandle.handle, groupType, groupName)
        self.name = groupName
        self.samples: DcgmGroupSamples | None = DcgmGroupSamples(self._dcgmHandle, self._groupId, self)

    def _IsGroupIdStatic(self) -> bool:
        return self._groupId in (dcgm_structs.DCGM_GROUP_ALL_GPUS, dcgm_structs.DCGM_GROUP_ALL_NVSWITCHES)

    def Delete(self) -> None:
        del self.samples
        self.samples = None
        if self._groupId is not None and not self._IsGroupIdStatic():
            ret = dcgm_agent.dcgmGroupDestroy(self._dcgmHandle.handle, self._groupId)
            dcgm_structs._dcgmCheckReturn(ret)
        self._groupId = None

    def AddGpu(self, gpuId: int) -> None:
        if self._IsGroupIdStatic():
            raise DcgmException("Can't add a GPU to a static group")
        ret = dcgm_agent.dcgmGroupAddDevice(self._dcgmHandle.handle, self._groupId, gpuId)
        dcgm_structs._dcgmCheckReturn(ret)

    def GetId(self) -> Any:
        return self._groupId
