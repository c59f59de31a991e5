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
from gpumon.gpu.capture.validate import Invalid, check_call

FORMAT = "gpumon-nvml-capture"
VERSION = 1
LIMIT = 64 << 20  # a capture of 8 GPUs over 5 sweeps is ~2 MiB; far larger is not one
MAX_DEPTH = 32  # the deepest a recorded value nests is ~6 (a GPM request in a list in an entry)

# the ops whose answers identify one physical board
SECRET_OPS = {"nvmlDeviceGetUUID": "uuid", "nvmlDeviceGetSerial": "serial"}
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
        driver = _printable(str(self.first_value("nvmlSystemGetDriverVersion") or "?"), 40)
        count = self.first_value("nvmlDeviceGetCount")
        source = _printable(str(self.meta.get("source", "?")), 20)
        created = _printable(str(self.meta.get("created", "?")), 40)
        return f"{source}, {count if count is not None else '?'} GPU(s), driver {driver}, recorded {created}"


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
    if type(version) is not int or version != VERSION:
        raise CaptureError(f"{what}: capture format version {version!r}; this gpumon reads version {VERSION}")
    calls = doc.get("calls")
    if not isinstance(calls, list):
        raise CaptureError(f'{what}: "calls" must be a list')
    if not calls:
        raise CaptureError(f"{what}: the capture holds no calls")
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("op"), str):
            raise CaptureError(f"{what}: call {i} has no op")
        op = _printable(call["op"], 60)
        call.setdefault("args", [])
        if not isinstance(call["args"], list):
            raise CaptureError(f'{what}: call {i} ({op}): "args" must be a list')
        if _depth(call) > MAX_DEPTH:
            raise CaptureError(f"{what}: call {i} ({op}) nests deeper than {MAX_DEPTH}")
        try:
            check_call(call)
        except Invalid as exc:
            raise CaptureError(f"{what}: call {i} ({op}): {_printable(str(exc), 200)}") from None
    meta = {k: v for k, v in doc.items() if k not in ("format", "version", "calls")}
    return Capture(meta, calls)


def _printable(text: str, limit: int) -> str:
    """Text from a file, safe for a log line: no control characters (a forged line, a terminal escape)."""
    clean = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")


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
    """The capture with every UUID and serial replaced by a stand-in, consistently throughout, in one pass.

    A UUID is replaced wherever it appears (a MIG device's name can hold its GPU's); a serial only as the
    answer of nvmlDeviceGetSerial, since a short serial ("0") is also part of version strings and bus ids."""
    uuids: dict[str, str] = {}
    serials: dict[str, str] = {}
    counts = {"GPU": 0, "MIG": 0}
    for call in capture.calls:
        kind = SECRET_OPS.get(call["op"])
        value = call.get("value")
        if kind is None or not isinstance(value, str) or not value:
            continue
        m = _UUID.match(value)
        if m and value not in uuids:
            n = counts[m.group(1)] = counts[m.group(1)] + 1
            # keep the shape: tools that parse UUIDs still parse these
            uuids[value] = f"{m.group(1)}-{n:08x}-0000-4000-8000-{n:012x}"
        elif not m and value not in serials:
            serials[value] = ""
    n = 0
    for real in serials:  # stand-ins of the same length, none of them a real serial of this capture
        while True:
            n += 1
            stand_in = f"{n:0{max(len(real), 4)}d}"
            if stand_in not in serials:
                break
        serials[real] = stand_in
    longest_first = sorted(uuids, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(u) for u in longest_first)) if uuids else None

    def replace(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda m: uuids[m.group(0)], value) if pattern else value
        if isinstance(value, list):
            return [replace(v) for v in value]
        if isinstance(value, dict):
            return {k: replace(v) for k, v in value.items()}
        return value

    def masked(call: dict[str, Any]) -> dict[str, Any]:
        out = replace(call)
        if SECRET_OPS.get(call["op"]) == "serial" and isinstance(call.get("value"), str):
            out["value"] = serials.get(call["value"], call["value"])
        return out

    return Capture({**capture.meta, "masked": True}, [masked(c) for c in capture.calls])
