"""``gpumon doctor --capture PATH``: record the NVML calls of a doctor run and write them as a capture."""

from __future__ import annotations

import datetime
import os
import platform
import sys
import tempfile
from importlib import metadata
from typing import Any

import gpumon
from gpumon.config import ConfigError
from gpumon.gpu.capture import Capture, RecordingNvml, dump, mask


class Recording:
    def __init__(self, path: str, masked: bool) -> None:
        self.path = path
        self.masked = masked
        self.recorder: RecordingNvml | None = None
        folder = os.path.dirname(os.path.abspath(path))
        # fail before sampling, not after: a wrong path should cost nothing
        if not os.path.isdir(folder):
            raise ConfigError(f"--capture {path}: no such directory {folder}")
        if os.path.isdir(path):
            raise ConfigError(f"--capture {path}: is a directory")
        if not os.access(folder, os.W_OK):
            raise ConfigError(f"--capture {path}: cannot write in {folder}")

    def wrap(self, nv: Any) -> RecordingNvml:
        self.recorder = RecordingNvml(nv)
        return self.recorder

    def write(self, *, sweeps: int, interval: float) -> None:
        assert self.recorder is not None
        capture = Capture(meta(self.recorder, sweeps=sweeps, interval=interval), list(self.recorder.calls))
        if self.masked:
            capture = mask(capture)
        folder = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".capture-", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(dump(capture))
            os.replace(tmp, self.path)
        except OSError as exc:
            os.unlink(tmp)
            raise ConfigError(f"--capture {self.path}: {exc.strerror or exc}") from None
        print(
            f"capture: {len(capture.calls)} NVML calls over {sweeps} sweeps written to {self.path}"
            f" ({'serials and UUIDs masked' if self.masked else 'NOT masked: holds serials and UUIDs'})",
            file=sys.stderr,
        )


def meta(recorder: RecordingNvml, *, sweeps: int, interval: float) -> dict[str, Any]:
    try:
        binding = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        binding = "?"
    uname = platform.uname()
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": "sim" if getattr(recorder.wrapped, "simulated", False) else "nvml",
        "gpumon": gpumon.__version__,
        "nvidia_ml_py": binding,
        "python": platform.python_version(),
        "os": f"{uname.system} {uname.release} {uname.machine}",
        "sweeps": sweeps,
        "interval_seconds": interval,
        "masked": False,
    }
