"""A damaged or hand-edited capture is refused when it is loaded, naming the call and what is wrong, instead
of failing inside a sweep (a GPU marked down for a string where NVML gives a number) or at start."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from support.helpers import ROOT

from gpumon.gpu.capture import Capture, CaptureError, dump, mask
from gpumon.gpu.capture.format import parse

REAL = json.loads((ROOT / "tests" / "fixtures" / "captures" / "h200-load.json").read_text())


def edited(op: str, change: Any, nth: int = 0) -> dict[str, Any]:
    doc = copy.deepcopy(REAL)
    call = [c for c in doc["calls"] if c["op"] == op][nth]
    change(call)
    return doc


def set_value(value: Any) -> Any:
    return lambda c: c.update(value=value)


def first_field(key: str, value: Any) -> Any:
    return lambda c: c["value"]["items"][0]["fields"].update({key: value})


@pytest.mark.parametrize(
    ("op", "change", "message"),
    [
        ("nvmlDeviceGetCount", set_value("abc"), "whole number"),
        ("nvmlDeviceGetCount", set_value(10**9), "from 0 to 255"),  # discovery would run for hours
        ("nvmlDeviceGetCount", set_value(True), "whole number"),
        ("nvmlDeviceGetPowerUsage", set_value("x"), "whole number"),
        ("nvmlDeviceGetPowerUsage", set_value(-5), "whole number"),
        ("nvmlDeviceGetTemperature", set_value([1, 2, 3]), "whole number"),
        ("nvmlDeviceGetName", set_value({"repr": "x"}), "expected a string"),
        ("nvmlDeviceGetHandleByIndex", set_value({"ref": []}), "handle"),
        ("nvmlDeviceGetRemappedRows", set_value({"tuple": [0]}), "4 numbers"),
        ("nvmlDeviceGetMigMode", set_value(1), "[current, pending]"),
        ("nvmlDeviceGetComputeRunningProcesses", set_value([{"object": {"pid": "abc"}}]), "whole number"),
        ("nvmlDeviceGetComputeRunningProcesses", set_value([5]), "structure"),
        ("nvmlGpmQueryDeviceSupport", set_value("yes"), "structure"),
        ("nvmlDeviceGetPciInfo", lambda c: c["value"].update(struct="__class__"), "nvidia-ml-py's types"),
        ("nvmlDeviceGetUtilizationRates", lambda c: c["value"]["fields"].update(bogus=1), "no field 'bogus'"),
        ("nvmlDeviceGetFieldValues", first_field("valueType", 99), "type 99"),
        ("nvmlDeviceGetFieldValues", first_field("fieldId", "82"), "fieldId"),
        ("nvmlDeviceGetFieldValues", lambda c: c.update(args=[5, [1]]), "GPU handle"),
        ("nvmlDeviceGetFieldValues", set_value(5), "c_nvmlFieldValue_t"),
        ("nvmlGpmMetricsGet", set_value([{"metricId": 1}]), "metricId, nvmlReturn"),
        ("nvmlEventSetWait_v2", lambda c: (c.pop("error"), c.pop("code"), c.update(value=5)), "structure"),
        ("nvmlDeviceGetFanSpeed", lambda c: c.update(code="abc"), "return code"),
        ("nvmlDeviceGetFanSpeed", lambda c: c.update(code=None), "return code"),
        ("nvmlInit", lambda c: (c.pop("value"), c.update(missing=True)), "cannot be missing"),
        ("nvmlShutdown", lambda c: c.pop("value"), '"value", "error" or "missing"'),
    ],
)
def test_a_malformed_call_is_refused_naming_it(op: str, change: Any, message: str) -> None:
    with pytest.raises(CaptureError, match="call [0-9]+ \\(" + op) as err:
        parse(edited(op, change))
    assert message in str(err.value)


def test_the_header_must_be_exact_and_the_calls_not_empty() -> None:
    for version in (True, 1.0, "1"):
        with pytest.raises(CaptureError, match="version"):
            parse({**REAL, "version": version})
    with pytest.raises(CaptureError, match="holds no calls"):
        parse({**REAL, "calls": []})


def test_text_from_the_file_reaches_logs_printable() -> None:
    capture = parse({**REAL, "created": "\x1b[31mEVIL\x1b[0m\nFAKE LOG LINE"})
    summary = capture.summary()
    assert "\x1b" not in summary and "\n" not in summary and "EVIL" in summary


def test_masking_replaces_whole_serials_in_one_pass() -> None:
    """A serial "0" must not rewrite version strings and bus ids; two GPUs whose serials are each other's
    stand-ins must not merge."""
    calls = [
        {"op": "nvmlSystemGetDriverVersion", "args": [], "value": "580.159.04"},
        {"op": "nvmlDeviceGetSerial", "args": [{"ref": "gpu0"}], "value": "0"},
        {"op": "nvmlDeviceGetSerial", "args": [{"ref": "gpu1"}], "value": "0000000000002"},
        {"op": "nvmlDeviceGetSerial", "args": [{"ref": "gpu2"}], "value": "0000000000001"},
        {"op": "nvmlDeviceGetUUID", "args": [{"ref": "gpu0"}], "value": "GPU-0a0b"},
        {"op": "nvmlDeviceGetName", "args": [{"ref": "gpu0/mig0"}], "value": "MIG-GPU-0a0b/1/0"},
    ]
    out = {(c["op"], json.dumps(c["args"])): c["value"] for c in mask(Capture({}, calls)).calls}
    assert out[("nvmlSystemGetDriverVersion", "[]")] == "580.159.04"
    serials = [v for (op, _), v in out.items() if op == "nvmlDeviceGetSerial"]
    assert len(set(serials)) == 3 and not {"0", "0000000000002", "0000000000001"} & set(serials)
    assert (
        out[("nvmlDeviceGetName", '[{"ref": "gpu0/mig0"}]')]
        == "MIG-GPU-00000001-0000-4000-8000-000000000001/1/0"
    )
    assert "0a0b" not in dump(mask(Capture({}, calls)))
