"""Which Kubernetes pod and container holds each GPU, from the kubelet's pod-resources API (v1).

The kubelet serves ``/v1.PodResourcesLister/List`` over gRPC on a unix socket. We speak it with grpcio's
generic API and a hand-written codec (protowire) so that neither protobuf nor generated code is needed,
and grpcio itself stays optional: without it the class reports why and does nothing.

Messages read (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto):
  ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
  PodResources       { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
  ContainerResources { string name = 1; repeated ContainerDevices devices = 2; ... }
  ContainerDevices   { string resource_name = 1; repeated string device_ids = 2; ... }
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpumon.gpu.attribution.protowire import expect_bytes, expect_str, field_bytes, field_str, iter_fields

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = frozenset({"nvidia.com/gpu", "nvidia.com/gpu.shared"})
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
FAILURES_BEFORE_EMPTY = 3
GRPC_MISSING = "grpcio is not installed: pip install 'gpumon[kubernetes]'"
# what Kubernetes' own podresources client allows; grpcio's 4 MiB default is tight on a node packed with pods
_MAX_MESSAGE = 16 * 1024 * 1024

log = logging.getLogger("gpumon.kubelet")


@dataclass(frozen=True, slots=True)
class PodOwner:
    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class Allocation:
    """One ContainerDevices entry, flattened with the pod and container it belongs to."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


_EMPTY: Mapping[str, PodOwner] = MappingProxyType({})


def decode_list_response(data: bytes) -> list[Allocation]:
    """Every device allocation in a ListPodResourcesResponse; raises ProtoError on malformed bytes."""
    out: list[Allocation] = []
    for num, wt, val in iter_fields(data):
        if num == 1:
            _decode_pod(expect_bytes(num, wt, val), out)
    return out


def _decode_pod(data: bytes, out: list[Allocation]) -> None:
    name = namespace = ""
    containers: list[bytes] = []
    for num, wt, val in iter_fields(data):
        if num == 1:
            name = expect_str(num, wt, val)
        elif num == 2:
            namespace = expect_str(num, wt, val)
        elif num == 3:
            containers.append(expect_bytes(num, wt, val))
    # protobuf allows fields in any order, so the pod's name may only be known after its containers
    for raw in containers:
        container = ""
        devices: list[bytes] = []
        for num, wt, val in iter_fields(raw):
            if num == 1:
                container = expect_str(num, wt, val)
            elif num == 2:
                devices.append(expect_bytes(num, wt, val))
        for dev in devices:
            resource = ""
            ids: list[str] = []
            for num, wt, val in iter_fields(dev):
                if num == 1:
                    resource = expect_str(num, wt, val)
                elif num == 2:
                    ids.append(expect_str(num, wt, val))
            out.append(Allocation(namespace, name, container, resource, tuple(ids)))


def encode_list_response(allocations: Iterable[Allocation]) -> bytes:
    """The inverse of decode_list_response (for fakes and tests: gpumon itself only reads)."""
    pods: dict[tuple[str, str], dict[str, list[Allocation]]] = {}
    for a in allocations:
        pods.setdefault((a.namespace, a.pod), {}).setdefault(a.container, []).append(a)
    out = bytearray()
    for (namespace, pod), containers in pods.items():
        body = field_str(1, pod) + field_str(2, namespace)
        for container, allocs in containers.items():
            devices = b"".join(
                field_bytes(2, field_str(1, a.resource) + b"".join(field_str(2, d) for d in a.device_ids))
                for a in allocs
            )
            body += field_bytes(3, field_str(1, container) + devices)
        out += field_bytes(1, body)
    return bytes(out)


def is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX)


def gpu_owners(allocations: Iterable[Allocation]) -> dict[str, PodOwner]:
    """Device id -> owner for NVIDIA resources. A GPU time-sliced between several containers has no
    single owner and is left out: labelling it with one of them would bill the others' work to it."""
    seen: dict[str, set[PodOwner]] = {}
    for a in allocations:
        if not is_gpu_resource(a.resource):
            continue
        owner = PodOwner(a.namespace, a.pod, a.container)
        for dev in a.device_ids:
            # the device plugin advertises time-slicing replicas as "<uuid>::<n>"; NVML knows only the uuid
            seen.setdefault(dev.split("::", 1)[0], set()).add(owner)
    return {dev: next(iter(owners)) for dev, owners in seen.items() if len(owners) == 1}


def _import_grpc() -> tuple[Any, str]:
    try:
        return importlib.import_module("grpc"), ""
    except ImportError:
        return None, GRPC_MISSING
    except Exception as exc:  # a broken install (bad shared object) must not take the daemon down
        return None, f"grpcio failed to import: {type(exc).__name__}: {exc}"


def _describe(exc: BaseException) -> str:
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):  # a grpc.RpcError: its str() is a multi-line debug dump
        try:
            return f"{code().name}: {details()}"
        except Exception:
            pass
    return f"{type(exc).__name__}: {exc}"


class PodResources:
    """Device id -> PodOwner, refreshed from the kubelet in the background; owners() is a plain read."""

    def __init__(
        self, socket_path: str = DEFAULT_SOCKET, *, refresh: float = 30.0, timeout: float = 2.0
    ) -> None:
        self.socket_path = socket_path
        self.refresh = refresh
        self.timeout = timeout
        self.last_success: float | None = None
        self.errors = 0
        self._owners: Mapping[str, PodOwner] = _EMPTY
        self._failures = 0  # consecutive
        self._lock = threading.Lock()  # serialises refreshes; readers never take it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._grpc, self.reason = _import_grpc()
        self.available: bool = self._grpc is not None

    def owners(self) -> Mapping[str, PodOwner]:
        return self._owners

    def refresh_now(self) -> bool:
        if self._grpc is None:
            return False
        path = self.socket_path
        with self._lock:
            if not os.path.exists(path):
                self._failed(f"kubelet pod-resources socket not found: {path}", empty=True)
                return False
            try:
                owners = gpu_owners(decode_list_response(self._list()))
            except Exception as exc:
                self._failed(_describe(exc), empty=False)
                return False
            if self._failures:
                log.info("kubelet pod-resources on %s works again after %d failures", path, self._failures)
            self._failures = 0
            self.reason = ""
            self.last_success = time.time()
            self._owners = MappingProxyType(owners)
            return True

    def healthy(self) -> bool:
        """The last List succeeded (before the first one: whether the socket is there at all)."""
        return self._failures == 0 and self.available

    def _list(self) -> bytes:
        grpc = self._grpc
        # a fresh channel per call: a kept one would sit in grpc's reconnect backoff (up to 2 min) after a
        # kubelet restart, and at one call per refresh interval the connect cost does not matter
        channel = grpc.insecure_channel(
            "unix://" + os.path.abspath(self.socket_path),
            options=[("grpc.max_receive_message_length", _MAX_MESSAGE)],
        )
        try:
            # raw bytes both ways and decoding here: an exception inside a response_deserializer reaches us
            # only as "Exception deserializing response!", losing what was wrong
            call = channel.unary_unary(LIST_METHOD, request_serializer=bytes, response_deserializer=bytes)
            return bytes(call(b"", timeout=self.timeout))
        finally:
            channel.close()

    def _failed(self, text: str, *, empty: bool) -> None:
        self.errors += 1
        self._failures += 1
        self.reason = text
        path = self.socket_path
        # a brief outage keeps the last mapping, but labels must not outlive their pods indefinitely
        if empty or self._failures >= FAILURES_BEFORE_EMPTY:
            self._owners = _EMPTY
        if self._failures == 1:
            log.warning("kubelet pod-resources List on %s failed: %s", path, text)
        else:
            log.debug("kubelet pod-resources List on %s failed (%d in a row): %s", path, self._failures, text)

    def start(self) -> None:
        if self._grpc is None:
            log.warning("Kubernetes pod attribution is off: %s", self.reason)
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpumon-kubelet", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.refresh_now()
            except Exception:  # refresh_now handles its own errors; a dead thread would freeze the labels
                log.exception("kubelet pod-resources refresh crashed")
            if self._stop.wait(self.refresh):
                return

    def stop(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(self.timeout + 1.0)
