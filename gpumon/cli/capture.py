"""``gpumon doctor --capture PATH``: record the NVML calls of a doctor run and write them as a capture."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import stat
import sys
import tempfile
from importlib import metadata
from typing import Any

import gpumon
from gpumon.config import ConfigError
from gpumon.gpu.capture import Capture, RecordingNvml, dump, mask

MAX_SECONDS = 600.0  # sweeps x interval: a capture is a few sweeps, not a recording of a day


class Recording:
    """Where a capture goes. The file is created (as a temporary file beside the path) before sampling, so
    a path that cannot be written costs nothing, and renamed into place whole at the end."""

    def __init__(self, path: str, masked: bool) -> None:
        if not path:
            raise ConfigError("--capture: give a file to write the capture to")
        self.path = path
        self.masked = masked
        self.recorder: RecordingNvml | None = None
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise ConfigError(f"--capture {path}: no such directory {folder}")
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = None
        except OSError as exc:
            raise ConfigError(f"--capture {path}: {exc.strerror or exc}") from None
        if mode is not None and stat.S_ISDIR(mode):
            raise ConfigError(f"--capture {path}: is a directory")
        if mode is not None and not stat.S_ISREG(mode):
            # a device, a pipe or a link in its place would be replaced by the file: never what was meant
            raise ConfigError(f"--capture {path}: is not a regular file; name a new file or an old capture")
        try:
            self._fd, self._tmp = tempfile.mkstemp(prefix=".capture-", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise ConfigError(f"--capture {path}: cannot write in {folder}: {exc.strerror or exc}") from None
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(self._fd, 0o666 & ~umask)  # as an ordinary new file, not mkstemp's 0600

    def wrap(self, nv: Any) -> RecordingNvml:
        self.recorder = RecordingNvml(nv)
        return self.recorder

    def discard(self) -> None:
        """Remove the temporary file (the run failed before anything was written)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)

    def write(self, *, sweeps: int, interval: float) -> None:
        assert self.recorder is not None
        capture = Capture(meta(self.recorder, sweeps=sweeps, interval=interval), list(self.recorder.calls))
        if self.masked:
            capture = mask(capture)
        try:
            with os.fdopen(self._fd, "w", encoding="utf-8") as f:
                self._fd = -1
                f.write(dump(capture))
            os.replace(self._tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
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
