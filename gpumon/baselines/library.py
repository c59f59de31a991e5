"""The baseline library: reference figures per workload and hardware, in one human-editable TOML file.

A baseline is keyed by what makes throughput comparable: workload (model/config name), GPU model (NVML's
name), GPU count, dtype and FLOPs convention (MFU under PaLM's and Megatron's conventions differ). It holds
tokens/s per GPU, step time, MFU and tokens per joule, and says who recorded it, when and how. Two entries
with one key would make the comparison ambiguous, so a library with such a pair is refused.

Writes are atomic (a temporary file in the same directory, fsync, rename, fsync of the directory) under an
advisory lock, so the daemon never reads half a file, two ``gpumon baseline`` commands cannot lose each
other's entries, and a writer killed at any point leaves the old library or the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import re
import secrets
import stat
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from gpumon.baselines.toml_out import dumps
from gpumon.client.protocol import CONVENTIONS, DTYPES, NAME_PATTERN
from gpumon.files import MiB, NotAFile, read_bounded

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

VERSION = 1
LOCK_TIMEOUT = 30.0  # seconds a writer waits for another; a write holds the lock for milliseconds
# ~300 bytes a baseline: 50,000 of them. A 100 MiB file took 398 MiB of RSS to parse, most of a daemon's limit
MAX_BYTES = 16 * MiB
FIGURES = ("tokens_per_second_per_gpu", "step_time_seconds", "mfu", "tokens_per_joule")
_NAME = re.compile(NAME_PATTERN)
HEADER = (
    "# gpumon baseline library: reference figures per workload and hardware (docs/baselines.md).\n"
    "# Edit freely; `gpumon baseline` rewrites it atomically and keeps entries sorted by name.\n"
)


class LibraryError(Exception):
    """The file cannot be read or is not a valid library; the message says where and what to fix."""


@dataclass(frozen=True, slots=True, order=True)
class Key:
    workload: str
    gpu_model: str
    gpus: int
    dtype: str  # "" when the job reported none
    flops_convention: str  # "" when the job reported no FLOPs per token

    def describe(self) -> str:
        conv = f", {self.flops_convention} FLOPs" if self.flops_convention else ""
        return f"{self.workload} on {self.gpus}x {self.gpu_model}, {self.dtype or 'no dtype'}{conv}"


@dataclass(frozen=True, slots=True)
class Figures:
    tokens_per_second_per_gpu: float | None = None
    step_time_seconds: float | None = None
    mfu: float | None = None
    tokens_per_joule: float | None = None


@dataclass(frozen=True, slots=True)
class Baseline:
    name: str
    key: Key
    figures: Figures
    recorded_at: str = ""  # ISO 8601, UTC
    recorded_by: str = ""  # user@host
    source: str = ""  # how: the command, or "imported from FILE", or "edited by hand"
    job_name: str = ""
    node: str = ""
    window_seconds: float | None = None
    intervals: int | None = None  # measurement intervals the statistics used
    method: str = ""
    gpumon_version: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, **asdict(self.key)}
        out.update({k: v for k, v in asdict(self.figures).items() if v is not None})
        for f in fields(self):
            if f.name not in ("name", "key", "figures"):
                value = getattr(self, f.name)
                if value not in (None, ""):
                    out[f.name] = value
        return out


_PROVENANCE = {f.name for f in fields(Baseline)} - {"name", "key", "figures"}
_KNOWN = {"name", *(f.name for f in fields(Key)), *FIGURES, *_PROVENANCE}


@dataclass(frozen=True)
class Library:
    baselines: tuple[Baseline, ...] = ()

    def __post_init__(self) -> None:
        names: dict[str, int] = {}
        keys: dict[Key, str] = {}
        for b in self.baselines:
            if b.name in names:
                raise LibraryError(f"two baselines are named {b.name!r}: names must be unique")
            names[b.name] = 1
            if b.key in keys:
                raise LibraryError(
                    f"baselines {keys[b.key]!r} and {b.name!r} have the same key ({b.key.describe()}): "
                    "delete one, or change its workload"
                )
            keys[b.key] = b.name

    def get(self, name: str) -> Baseline | None:
        return next((b for b in self.baselines if b.name == name), None)

    def match(self, key: Key) -> Baseline | None:
        return next((b for b in self.baselines if b.key == key), None)

    def scaling_reference(self, key: Key) -> Baseline | None:
        """The baseline with the fewest GPUs (ideally one) for the same workload, GPU model, dtype and
        convention, and fewer GPUs than ``key``: the per-GPU speed a perfectly scaling job would keep. None
        when the only baselines are at the job's own size or larger: a job against itself measures no
        scaling (its efficiency would read 1.0 whatever it is)."""
        same = [
            b
            for b in self.baselines
            if replace(b.key, gpus=key.gpus) == key
            and b.key.gpus < key.gpus
            and b.figures.tokens_per_second_per_gpu is not None
        ]
        return min(same, key=lambda b: b.key.gpus, default=None)

    def put(self, b: Baseline, *, replace_existing: bool = False) -> tuple[Library, Baseline | None]:
        """A library with ``b`` added; the entry it replaces (same name or key), if any. Raises LibraryError
        when one exists and ``replace_existing`` is false."""
        other = next((x for x in self.baselines if x.name == b.name and x.key != b.key), None)
        if other is not None:  # --replace is for re-recording a key, never for dropping another key's entry
            raise LibraryError(
                f"the name {b.name!r} is taken by the baseline for {other.key.describe()}: "
                "choose another --name"
            )
        old = [x for x in self.baselines if x.key == b.key]
        if old and not replace_existing:
            o = old[0]
            raise LibraryError(
                f"baseline {o.name!r} already covers {o.key.describe()} (recorded {o.recorded_at or '?'}): "
                "pass --replace to overwrite it, or delete it first"
            )
        kept = tuple(x for x in self.baselines if x not in old)
        return Library(tuple(sorted((*kept, b), key=lambda x: x.name))), (old[0] if old else None)

    def without(self, names: list[str]) -> Library:
        missing = [n for n in names if self.get(n) is None]
        if missing:
            raise LibraryError(f"no baseline named {', '.join(map(repr, missing))} (gpumon baseline list)")
        return Library(tuple(b for b in self.baselines if b.name not in names))


def validate(b: Baseline) -> Baseline:
    """``b`` checked exactly as the file's entries are on load (LibraryError otherwise)."""
    return _entry(b.to_dict(), f"baseline {b.name!r}")


def default_name(key: Key) -> str:
    """``workload/gpu/xN/dtype``: readable, and unique per key in practice."""
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", key.gpu_model.removeprefix("NVIDIA ")).strip("-") or "gpu"
    parts = [key.workload, gpu, f"x{key.gpus}"] + [p for p in (key.dtype, key.flops_convention) if p]
    return "/".join(parts)[:128]


def parse(data: Mapping[str, Any], where: str = "baselines") -> Library:
    """A library from the parsed TOML document; LibraryError naming the entry and field otherwise."""
    version = data.get("version", VERSION)
    if version != VERSION:
        raise LibraryError(f"{where}: version {version!r} is not supported (this gpumon reads {VERSION})")
    unknown_top = set(data) - {"version", "baseline"}
    if unknown_top:
        raise LibraryError(f"{where}: unknown top-level key(s) {', '.join(sorted(unknown_top))}")
    entries = data.get("baseline", [])
    if not isinstance(entries, list):
        raise LibraryError(f"{where}: 'baseline' must be an array of tables ([[baseline]])")
    parsed = tuple(_entry(e, f"{where}: baseline #{i + 1}") for i, e in enumerate(entries))
    try:
        return Library(parsed)
    except LibraryError as exc:  # duplicate names or keys: say which file holds them
        raise LibraryError(f"{where}: {exc}") from None


def _entry(e: object, where: str) -> Baseline:
    if not isinstance(e, dict):
        raise LibraryError(f"{where}: expected a table")
    if isinstance(e.get("name"), str):
        where = f"{where} ({e['name']!r})"
    unknown = set(e) - _KNOWN
    if unknown:
        raise LibraryError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    name = _str(e, "name", where, required=True)
    if not _NAME.match(name):
        raise LibraryError(f"{where}: name must be 1-128 chars of [A-Za-z0-9_.:/@+=-], got {name!r}")
    workload = _str(e, "workload", where, required=True)
    gpu_model = _str(e, "gpu_model", where, required=True)
    gpus = e.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise LibraryError(f"{where}: gpus must be a whole number >= 1, got {gpus!r}")
    key = Key(workload, gpu_model, gpus, _str(e, "dtype", where), _str(e, "flops_convention", where))
    # a hand-typed "BF16" would never match a job's "bf16": refuse it rather than never compare
    if key.dtype not in ("", *DTYPES):
        raise LibraryError(f"{where}: dtype must be one of {', '.join(DTYPES)} (or empty), got {key.dtype!r}")
    if key.flops_convention not in ("", *CONVENTIONS):
        raise LibraryError(
            f"{where}: flops_convention must be one of {', '.join(CONVENTIONS)} (or empty), "
            f"got {key.flops_convention!r}"
        )
    figures = Figures(**{f: _number(e, f, where) for f in FIGURES})
    if all(v is None for v in asdict(figures).values()):
        raise LibraryError(f"{where}: no figures: give at least one of {', '.join(FIGURES)}")
    if figures.mfu is not None and figures.mfu > 1:
        raise LibraryError(f"{where}: mfu is a ratio from 0 to 1, got {figures.mfu!r}")
    prov: dict[str, Any] = {}
    for k in sorted(_PROVENANCE):
        if k in ("window_seconds", "intervals"):
            prov[k] = _number(e, k, where)
            if k == "intervals" and prov[k] is not None:
                prov[k] = int(prov[k])
        else:
            prov[k] = _str(e, k, where)
    return Baseline(name, key, figures, **prov)


def _str(e: Mapping[str, Any], k: str, where: str, required: bool = False) -> str:
    v = e.get(k, "")
    if not isinstance(v, str) or (required and not v.strip()):
        raise LibraryError(f"{where}: {k} must be {'a non-empty' if required else 'a'} string, got {v!r}")
    if not v.isascii():
        try:  # a lone surrogate (bytes a terminal could not decode, a JSON "\ud800") cannot be written
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise LibraryError(f"{where}: {k} is not valid Unicode text, got {v!r}") from None
    return v


def _number(e: Mapping[str, Any], k: str, where: str) -> float | None:
    v = e.get(k)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise LibraryError(f"{where}: {k} must be a positive number, got {v!r}")
    return float(v)


def render(lib: Library) -> str:
    return HEADER + dumps({"version": VERSION, "baseline": [b.to_dict() for b in lib.baselines]})


def load(path: str) -> Library:
    """The library at ``path``; an empty one when the file does not exist. Anything else that is not a
    library (a directory, a pipe, a file over MAX_BYTES, an empty or binary file, TOML of another shape) is
    a LibraryError that names the file and what is wrong with it."""
    try:
        raw = read_bounded(path, MAX_BYTES)  # a FIFO in the file's place cannot hang the daemon's reload
    except FileNotFoundError:
        return Library()
    except NotAFile as exc:
        raise LibraryError(f"{path}: {exc}, not a library file") from None
    except OSError as exc:
        raise LibraryError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LibraryError(
            f"{path}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}): not a baseline library"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LibraryError(f"{path}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise LibraryError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    return parse(data, path)


def save(path: str, lib: Library) -> None:
    """Replace the file atomically: readers see the old library or the new one, never a torn write. A
    symlinked path is written through to its target, and an existing file keeps its permissions (and,
    written by root, its owner). Takes no lock (``export -o`` should not leave a lock file beside what it
    writes): a change to a library in use goes through ``editing``."""
    path = os.path.realpath(path)
    _write(path, _checked_rendering(path, lib))


@contextlib.contextmanager
def editing(path: str) -> Iterator[list[Library]]:
    """Read-modify-write under an exclusive lock on ``PATH.lock``: yields a one-element list holding the
    current library; whatever library the block leaves in it is saved (unchanged: nothing is written). A
    file that is not a valid library is never written over."""
    path = os.path.realpath(path)  # one lock per file, however it is reached
    with _locked(path):
        try:
            before = load(path)
        except LibraryError as exc:
            raise LibraryError(f"{exc}; nothing was written (fix the file, or move it aside)") from None
        box = [before]
        yield box
        if box[0] is not before:
            text = _checked_rendering(path, box[0])
            _remove_stale_temporaries(path)
            _write(path, text)


def _checked_rendering(path: str, lib: Library) -> str:
    text = render(lib)
    parse(tomllib.loads(text), path)  # never write what we could not read back
    return text


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold ``PATH.lock`` exclusively. The kernel drops a flock when its holder dies however it dies, so a
    crashed writer never leaves a stale lock; one that hangs holding it makes the next writer give up
    after LOCK_TIMEOUT with its pid, rather than wait forever."""
    lock_path = path + ".lock"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise LibraryError(f"{path}: cannot lock for writing: {exc.strerror}; nothing was written") from None
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LibraryError(
                        f"{lock_path}: another writer{_holder(fd)} has held it for over {LOCK_TIMEOUT:g} s; "
                        "nothing was written (is a gpumon baseline command stuck?)"
                    ) from None
                time.sleep(0.02)
        with contextlib.suppress(OSError):  # who holds it, for the message above; advisory only
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _write(path: str, text: str) -> None:
    """Write ``text`` to the resolved ``path``: a temporary file beside it, fsync, rename, fsync of the
    directory, so that after a crash or power cut the path holds the old library or the new one, whole."""
    directory, base = os.path.split(path)
    try:
        os.makedirs(directory, exist_ok=True)
        try:
            st: os.stat_result | None = os.stat(path)
        except FileNotFoundError:
            st = None
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                if st is not None and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                    # root writing the daemon's user's file: a root-owned 0600 file it could not read
                    with contextlib.suppress(PermissionError):
                        os.fchown(fd, st.st_uid, st.st_gid)
                os.fchmod(fd, stat.S_IMODE(st.st_mode) if st is not None else 0o644)
                view = memoryview(text.encode("utf-8"))
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)  # the rename itself, which lives in the directory
        finally:
            os.close(dfd)
    except OSError as exc:
        raise LibraryError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _remove_stale_temporaries(path: str) -> None:
    """Temporary files of this library that a writer killed mid-write left behind. Every writer holds the
    lock while its temporary file exists, and the caller holds it now, so none of these is in use."""
    directory, base = os.path.split(path)
    stale = re.compile(re.escape(f".{base}.") + r"[0-9a-f]{12}\.tmp")
    try:
        found = os.listdir(directory)
    except OSError:
        return  # the write that follows says what is wrong with the directory
    for name in found:
        if stale.fullmatch(name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
