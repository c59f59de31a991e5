"""Field-value arrays: the struct fast path must read exactly what pynvml's attribute access reads."""

from __future__ import annotations

import pynvml
import pytest

from gpumon.gpu import fields


def test_the_layout_matches_the_installed_pynvml() -> None:
    assert fields.FAST, "c_nvmlFieldValue_t changed layout: decode() now takes the slow path"


@pytest.mark.parametrize(
    ("value_type", "value", "member"),
    [
        (pynvml.NVML_VALUE_TYPE_DOUBLE, 1.5, "dVal"),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 4_000_000_000, "uiVal"),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG, 2**40, "ulVal"),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 2**63 + 5, "ullVal"),
        (pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG, -(2**40), "sllVal"),
        (pynvml.NVML_VALUE_TYPE_SIGNED_INT, -7, "siVal"),
        (pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT, 65000, "usVal"),
    ],
)
def test_encode_then_decode_every_value_type(value_type, value, member) -> None:
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    fields.encode(values, 0, 82, 0, 123, 4, value_type, pynvml.NVML_SUCCESS, value)
    fields.encode(values, 1, 197, 7, 123, 4, value_type, pynvml.NVML_ERROR_NOT_SUPPORTED, 0)
    assert (values[0].fieldId, values[0].valueType, values[0].nvmlReturn) == (82, value_type, 0)
    assert getattr(values[0].value, member) == value  # what pynvml's own accessors see
    assert (values[1].scopeId, values[1].nvmlReturn) == (7, pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert fields.decode(values) == [(0, value), (pynvml.NVML_ERROR_NOT_SUPPORTED, None)]
    assert fields.decode(list(values)) == fields.decode(values)  # the attribute path agrees


def test_requests_accept_ids_and_pairs() -> None:
    assert fields.request([82, (138, 3), [139, 4]]) == [(82, 0), (138, 3), (139, 4)]
