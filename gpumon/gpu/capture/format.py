"""The capture file: a JSON document that says what it is, where and when it was recorded, and every NVML
call made while recording, in order (docs/captures.md describes it field by field).

Serials and UUIDs are masked by default: each distinct one is replaced, everywhere in the file, by a
stand-in of the same shape, so the GPUs stay told apart and the file can be attached to a public bug report.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpumon.files import NotAFile, read_text

FORMAT = "gpumon-nvml-capture"
VERSION = 1
LIMIT = 64 << 20  # a capture of 8 GPUs over 5 sweeps is ~2 MiB; far larger is not one
MAX_DEPTH = 32  # the deepest a recorded value nests is ~6 (a GPM request in a list in an entry)

# the ops whose answers identify one physical board
SECRET_OPS = {"nvmlDeviceGetUUID": "uuid", "nvmlDeviceGetSerial": "serial", "nvmlDeviceGetBoardId": "serial"}
_UUID = re.compile(r"^(GPU|MIG)-([0-9a-fA-F-]+)$")


class CaptureError(Exception):
    """The file is not a capture gpumon can replay; the message says why."""


@dataclass
class Capture:
    meta: dict[str, Any]
    calls: list[dict[str, Any]]

    def document(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, **self.meta, "calls": self.calls}

    def first_value(self, op: str) -> Any:
        return next((c.get("value") for c in self.calls if c["op"] == op and "value" in c), None)

    def summary(self) -> str:
        """One line for logs: what this capture is."""
        driver = self.first_value("nvmlSystemGetDriverVersion") or "?"
        count = self.first_value("nvmlDeviceGetCount")
        return (
            f"{self.meta.get('source', '?')}, {count if count is not None else '?'} GPU(s), driver {driver}, "
            f"recorded {self.meta.get('created', '?')}"
        )


def dump(capture: Capture) -> str:
    # one call per line: a diff of two captures, or a grep for one op, reads naturally
    calls = ",\n".join("    " + json.dumps(c, separators=(", ", ": ")) for c in capture.calls)
    head = json.dumps({k: v for k, v in capture.document().items() if k != "calls"}, indent=2)
    return head[:-2] + ',\n  "calls": [\n' + calls + "\n  ]\n}\n"


def load(path: str) -> Capture:
    try:
        text = read_text(path, LIMIT)
    except (OSError, NotAFile) as exc:
        raise CaptureError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CaptureError(f"{path}: not JSON ({exc})") from None
    return parse(doc, path)


def parse(doc: Any, what: str = "capture") -> Capture:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CaptureError(f'{what}: not a gpumon NVML capture (no "format": "{FORMAT}")')
    version = doc.get("version")
    if version != VERSION:
        raise CaptureError(f"{what}: capture format version {version!r}; this gpumon reads version {VERSION}")
    calls = doc.get("calls")
    if not isinstance(calls, list):
        raise CaptureError(f'{what}: "calls" must be a list')
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("op"), str):
            raise CaptureError(f"{what}: call {i} has no op")
        if not isinstance(call.get("args", []), list):
            raise CaptureError(f'{what}: call {i} ({call["op"]}): "args" must be a list')
        if _depth(call) > MAX_DEPTH:
            raise CaptureError(f"{what}: call {i} ({call['op']}) nests deeper than {MAX_DEPTH}")
    meta = {k: v for k, v in doc.items() if k not in ("format", "version", "calls")}
    return Capture(meta, calls)


def _depth(value: Any, limit: int = MAX_DEPTH + 1) -> int:
    stack = [(value, 1)]
    deepest = 0
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            break
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def mask(capture: Capture) -> Capture:
    """The capture with every UUID and serial replaced by a stand-in, consistently throughout."""
    stand_ins: dict[str, str] = {}
    counts = {"GPU": 0, "MIG": 0, "serial": 0}
    for call in capture.calls:
        kind = SECRET_OPS.get(call["op"])
        value = call.get("value")
        if kind is None or not isinstance(value, str) or not value or value in stand_ins:
            continue
        m = _UUID.match(value)
        prefix = m.group(1) if m else "serial"
        n = counts[prefix] = counts[prefix] + 1
        if prefix == "serial":
            stand_ins[value] = f"{n:0{max(len(value), 4)}d}"[-max(len(value), 4) :]
        else:  # keep the shape: tools that parse UUIDs still parse these
            stand_ins[value] = f"{prefix}-{n:08x}-0000-4000-8000-{n:012x}"
    calls = [_replace(c, stand_ins) for c in capture.calls]
    return Capture({**capture.meta, "masked": True}, calls)


def _replace(value: Any, stand_ins: dict[str, str]) -> Any:
    if isinstance(value, str):
        for secret, stand_in in stand_ins.items():
            if secret in value:
                value = value.replace(secret, stand_in)
        return value
    if isinstance(value, list):
        return [_replace(v, stand_ins) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, stand_ins) for k, v in value.items()}
    return value
