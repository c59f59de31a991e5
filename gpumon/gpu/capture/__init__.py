"""Captures of what a node's NVML answers, and replaying them (docs/captures.md).

codec.py   NVML values (pynvml's ctypes structures, handles) to JSON and back
keys.py    which recorded answer a replayed call gets
record.py  RecordingNvml: an NVML module that writes down every call made through it
format.py  the capture file: header, calls, masking of serials and UUIDs, loading with limits
replay.py  ReplayNvml: an NVML module that answers from a capture
"""

from gpumon.gpu.capture.format import Capture, CaptureError, dump, load, mask
from gpumon.gpu.capture.record import RecordingNvml
from gpumon.gpu.capture.replay import ReplayNvml

__all__ = ["Capture", "CaptureError", "RecordingNvml", "ReplayNvml", "dump", "load", "mask"]
