"""Fake of DCGM's ``dcgm_field_helpers`` (NVIDIA/DCGM testing/python3/dcgm_field_helpers.py).

Turns the raw ``c_dcgmFieldValue_v1`` records that ``dcgmGetLatestValues_v2`` enumerates into
python-friendly values: ``.value``, ``.ts``, ``.fieldId``, ``.fieldType`` and ``.isBlank``, kept in
``.values[entityGroupId][entityId][fieldId]`` as a time series (``[-1]`` is the newest).
"""

from __future__ import annotations

from typing import Any

import dcgm_agent
import dcgm_fields
import dcgm_structs
import dcgmvalue


class DcgmFieldValue:
    def __init__(self, rawValue: Any) -> None:
        if type(rawValue) is not dcgm_structs.c_dcgmFieldValue_v1:
            raise Exception(f"Unexpected rawValue type {type(rawValue)}")
        self.ts = rawValue.ts
        self.fieldId = rawValue.fieldId
        self.fieldType = chr(rawValue.fieldType)
        self.isBlank = False
        self.value: Any = None
        # a non-OK status means "no value", whatever the value slot holds
        if rawValue.status != dcgm_structs.DCGM_ST_OK:
            self.isBlank = True
            return
        if self.fieldType == dcgm_fields.DCGM_FT_DOUBLE:
            self.value = float(rawValue.value.dbl)
            self.isBlank = dcgmvalue.DCGM_FP64_IS_BLANK(self.value)
        elif self.fieldType in (dcgm_fields.DCGM_FT_INT64, dcgm_fields.DCGM_FT_TIMESTAMP):
            self.value = int(rawValue.value.i64)
            self.isBlank = dcgmvalue.DCGM_INT64_IS_BLANK(self.value)
        else:
            raise Exception(f"Unhandled fieldType: {self.fieldType}")


class DcgmFieldValueTimeSeries:
    def __init__(self) -> None:
        self.values: list[DcgmFieldValue] = []

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, key: int) -> DcgmFieldValue:
        return self.values[key]

    def InsertValue(self, value: DcgmFieldValue) -> None:
        self.values.append(value)
        self.values.sort(key=lambda v: v.ts)


def py_helper_dcgm_field_values_since_callback_v2(
    entityGroupId: int, entityId: int, values: list[Any], numValues: int, userData: Any
) -> int:
    # the real callback recovers userData from a ctypes py_object; the fake passes the object itself
    userData._ProcessValues(entityGroupId, entityId, values[0:numValues])
    return 0


helper_dcgm_field_values_since_entity_callback = py_helper_dcgm_field_values_since_callback_v2


class DcgmFieldValueEntityCollection:
    def __init__(self, handle: Any, groupId: Any) -> None:
        self.values: dict[int, dict[int, dict[int, DcgmFieldValueTimeSeries]]] = {}
        self._handle = handle
        self._groupId = groupId
        self._numValuesSeen = 0

    def _ProcessValues(self, entityGroupId: int, entityId: int, values: list[Any]) -> None:
        self._numValuesSeen += len(values)
        per_entity = self.values.setdefault(entityGroupId, {}).setdefault(entityId, {})
        for rawValue in values:
            value = DcgmFieldValue(rawValue)
            per_entity.setdefault(value.fieldId, DcgmFieldValueTimeSeries()).InsertValue(value)

    def GetLatestValues(self, fieldGroup: Any) -> None:
        ret = dcgm_agent.dcgmGetLatestValues_v2(
            self._handle,
            self._groupId,
            fieldGroup.fieldGroupId,
            helper_dcgm_field_values_since_entity_callback,
            self,
        )
        dcgm_structs._dcgmCheckReturn(ret)

    def EmptyValues(self) -> None:
        self.values = {}
        self._numValuesSeen = 0
