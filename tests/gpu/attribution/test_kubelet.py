"""Kubernetes attribution: the pod-resources wire codec and PodResources against a real gRPC fake kubelet."""

from __future__ import annotations

import logging
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from support.poll import poll

from gpumon.gpu.attribution import protowire
from gpumon.gpu.attribution.kubelet import (
    GRPC_MISSING,
    Allocation,
    PodOwner,
    PodResources,
    decode_list_response,
    encode_list_response,
)

# A ListPodResourcesResponse written out by hand, byte by byte, so the decoder is checked against input
# its own encoder did not make. One pod "train/job" with two containers.
HAND_WRITTEN = bytes.fromhex(
    "10 9601"  # unknown top-level varint, field 2 = 150
    "33 0801 34"  # unknown group, field 6, holding a varint
    "0a b001"  # pod_resources (1), 176 bytes
    "  0a 03 6a6f62"  # name "job"
    "  12 05 747261696e"  # namespace "train"
    "  3d 01020304"  # unknown fixed32, field 7
    "  1a 53"  # containers (3), 83 bytes
    "    0a 06 776f726b6572"  # name "worker"
    "    12 2a"  # devices (2), 42 bytes
    "      0a 0e 6e76696469612e636f6d2f677075"  # resource_name "nvidia.com/gpu"
    "      12 08 4750552d61616161"  # device_ids "GPU-aaaa"
    "      12 08 4750552d62626262"  # device_ids "GPU-bbbb"
    "      1a 04 0a02 0801"  # topology { nodes { ID: 1 } }
    "    1a 04 01028101"  # cpu_ids packed [1, 2, 129]
    "    22 0e 0a06 6d656d6f7279 10 8080808004"  # memory { memory_type "memory", size 1 GiB }
    "    49 0102030405060708"  # unknown fixed64, field 9
    "  1a 48"  # containers (3), 72 bytes
    "    0a 07 73696465636172"  # name "sidecar"
    "    12 17 0a0f 6578616d706c652e636f6d2f6e6963 1204 6e696330"  # "example.com/nic" ["nic0"]
    "    12 22 0a16 6e76696469612e636f6d2f6d69672d31672e31306762 1208 4d49472d63636363"  # mig ["MIG-cccc"]
    "    18 05"  # cpu_ids not packed [5]
)


def test_hand_written_bytes_decode() -> None:
    assert decode_list_response(HAND_WRITTEN) == [
        Allocation("train", "job", "worker", "nvidia.com/gpu", ("GPU-aaaa", "GPU-bbbb")),
        Allocation("train", "job", "sidecar", "example.com/nic", ("nic0",)),
        Allocation("train", "job", "sidecar", "nvidia.com/mig-1g.10gb", ("MIG-cccc",)),
    ]


def test_encoder_round_trips_and_varints() -> None:
    allocs = [
        Allocation("a", "p1", "c1", "nvidia.com/gpu", ("GPU-1",)),
        Allocation("a", "p1", "c2", "nvidia.com/gpu", ("GPU-2", "GPU-3")),
        Allocation("b", "p2", "c", "nvidia.com/mig-3g.40gb", ("MIG-x",)),
    ]
    assert decode_list_response(encode_list_response(allocs)) == allocs
    for value in (0, 1, 127, 128, 300, 2**63 - 1, 2**64 - 1):
        raw = protowire.encode_varint(value)
        assert protowire.decode_varint(raw, 0) == (value, len(raw))
    assert len(protowire.encode_varint(-1)) == 10  # negative int64: 64-bit two's complement


@pytest.mark.parametrize(
    "raw",
    [
        HAND_WRITTEN[:-1],  # truncated mid-field
        b"\x0a\x05abc",  # length past the end
        b"\x08" + b"\xff" * 11,  # varint too long
        b"\x0e",  # wire type 6 does not exist
        b"\x08\x01",  # pod_resources as a varint: the schema changed under us
        b"\x33\x08\x01\x3c",  # group 6 closed by end-group 7
        b"\x0a\x04\x0a\x02\xff\xfe",  # pod name not UTF-8
    ],
)
def test_malformed_bytes_raise_proto_error(raw: bytes) -> None:
    with pytest.raises(protowire.ProtoError):
        decode_list_response(raw)


class FakeKubelet:
    """A real gRPC server on a unix socket answering List with whatever bytes `payload` holds."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.payload = b""
        self.calls = 0
        self.delay = 0.0
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(self._list)  # no (de)serializers: raw bytes
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),)
        )
        self.server.add_insecure_port("unix:" + path)
        self.server.start()

    def _list(self, request: bytes, context: object) -> bytes:
        assert request == b""  # ListPodResourcesRequest has no fields
        self.calls += 1
        time.sleep(self.delay)
        return self.payload

    def serve(self, *allocs: Allocation) -> None:
        self.payload = encode_list_response(allocs)

    def stop(self) -> None:
        self.server.stop(None).wait()


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # pytest's tmp_path can exceed the ~107-byte limit on unix socket paths
    path = tempfile.mkdtemp(prefix="gk", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(sock_dir: str) -> Iterator[FakeKubelet]:
    fake = FakeKubelet(sock_dir + "/kubelet.sock")
    yield fake
    fake.stop()


@pytest.fixture
def pods() -> Iterator[Callable[..., PodResources]]:
    made: list[PodResources] = []

    def make(path: str, **kw: float) -> PodResources:
        pr = PodResources(path, **{"timeout": 2.0, **kw})
        made.append(pr)
        return pr

    yield make
    for pr in made:
        pr.stop()


def test_gpu_and_mig_ids_map_to_their_containers(kubelet: FakeKubelet, pods) -> None:
    kubelet.serve(
        Allocation("ml", "trainer-0", "main", "nvidia.com/gpu", ("GPU-1", "GPU-2")),
        Allocation("ml", "trainer-0", "main", "example.com/nic", ("nic0",)),
        Allocation("ml", "trainer-0", "helper", "nvidia.com/mig-1g.10gb", ("MIG-a",)),
        Allocation("ml", "trainer-0", "helper", "cpu.example/thing", ("GPU-9",)),
        Allocation("web", "infer", "srv", "nvidia.com/gpu.shared", ("GPU-3::0",)),
    )
    pr = pods(kubelet.path)
    assert pr.available and pr.refresh_now()
    assert dict(pr.owners()) == {
        "GPU-1": PodOwner("ml", "trainer-0", "main"),
        "GPU-2": PodOwner("ml", "trainer-0", "main"),
        "MIG-a": PodOwner("ml", "trainer-0", "helper"),
        "GPU-3": PodOwner("web", "infer", "srv"),  # time-slicing replica suffix dropped
    }
    assert pr.reason == "" and pr.errors == 0 and pr.last_success is not None
    with pytest.raises(TypeError):
        pr.owners()["GPU-1"] = PodOwner("x", "y", "z")  # type: ignore[index]


def test_hand_written_response_over_grpc_and_shared_gpus(kubelet: FakeKubelet, pods) -> None:
    kubelet.payload = HAND_WRITTEN
    pr = pods(kubelet.path)
    assert pr.refresh_now()
    assert set(pr.owners()) == {"GPU-aaaa", "GPU-bbbb", "MIG-cccc"}
    assert pr.owners()["MIG-cccc"] == PodOwner("train", "job", "sidecar")
    kubelet.serve(
        Allocation("a", "p", "c", "nvidia.com/gpu.shared", ("GPU-1::0",)),
        Allocation("b", "q", "c", "nvidia.com/gpu.shared", ("GPU-1::1",)),
    )
    assert pr.refresh_now() and dict(pr.owners()) == {}  # two owners: neither is the owner


def test_failures_keep_the_mapping_then_empty_it_after_three(kubelet: FakeKubelet, pods, caplog) -> None:
    kubelet.serve(Allocation("ns", "p", "c", "nvidia.com/gpu", ("GPU-1",)))
    pr = pods(kubelet.path, timeout=1.0)
    assert pr.refresh_now() and pr.healthy()
    kubelet.stop()
    # a kubelet killed hard leaves its socket file behind: connections are refused
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(kubelet.path)
    caplog.set_level(logging.DEBUG, logger="gpumon.kubelet")
    try:
        for n in (1, 2):
            assert not pr.refresh_now()
            assert pr.errors == n and "GPU-1" in pr.owners() and pr.reason.startswith("UNAVAILABLE")
        assert not pr.refresh_now()
        assert dict(pr.owners()) == {} and pr.errors == 3 and not pr.healthy()
    finally:
        dead.close()
    levels = [r.levelno for r in caplog.records if r.name == "gpumon.kubelet"]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert kubelet.path in caplog.records[0].getMessage()

    revived = FakeKubelet(kubelet.path)
    try:
        revived.serve(Allocation("ns", "p2", "c", "nvidia.com/gpu", ("GPU-1",)))
        assert pr.refresh_now() and pr.owners()["GPU-1"].pod == "p2" and pr.reason == "" and pr.healthy()
        assert caplog.records[-1].levelno == logging.INFO
    finally:
        revived.stop()


def test_missing_socket_empties_at_once(kubelet: FakeKubelet, pods) -> None:
    kubelet.serve(Allocation("ns", "p", "c", "nvidia.com/gpu", ("GPU-1",)))
    pr = pods(kubelet.path)
    assert pr.refresh_now()
    kubelet.stop()  # removes the socket file
    assert not pr.refresh_now()
    assert dict(pr.owners()) == {} and "not found" in pr.reason and kubelet.path in pr.reason


def test_malformed_response_and_a_hung_kubelet_are_counted(kubelet: FakeKubelet, pods) -> None:
    kubelet.serve(Allocation("ns", "p", "c", "nvidia.com/gpu", ("GPU-1",)))
    pr = pods(kubelet.path, timeout=0.3)
    assert pr.refresh_now()
    kubelet.payload = b"\x0a\x05abc"
    assert not pr.refresh_now()
    assert pr.errors == 1 and "ProtoError" in pr.reason and "GPU-1" in pr.owners()
    kubelet.serve(Allocation("ns", "p", "c", "nvidia.com/gpu", ("GPU-1",)))
    kubelet.delay = 1.0
    assert not pr.refresh_now()
    assert pr.errors == 2 and pr.reason.startswith("DEADLINE_EXCEEDED")


def test_without_grpcio_it_is_unavailable_and_inert(monkeypatch, sock_dir: str) -> None:
    monkeypatch.setitem(sys.modules, "grpc", None)  # makes `import grpc` raise ImportError
    pr = PodResources(sock_dir + "/kubelet.sock", refresh=0.01)
    assert not pr.available and pr.reason == GRPC_MISSING
    assert not pr.refresh_now() and dict(pr.owners()) == {} and pr.errors == 0
    pr.start()
    pr.stop()
    assert not any(t.name == "gpumon-kubelet" for t in threading.enumerate())


def test_the_thread_refreshes_on_its_timer_and_survives_a_bug(
    kubelet: FakeKubelet, pods, monkeypatch
) -> None:
    kubelet.serve(Allocation("ns", "p1", "c", "nvidia.com/gpu", ("GPU-1",)))
    pr = pods(kubelet.path, refresh=0.05)
    real = pr.refresh_now
    crashes: list[int] = []

    def flaky() -> bool:
        if not crashes:
            crashes.append(1)
            raise RuntimeError("bug")
        return real()

    monkeypatch.setattr(pr, "refresh_now", flaky)
    pr.start()
    poll(
        lambda: pr.owners().get("GPU-1") == PodOwner("ns", "p1", "c"), 5, "GPU-1 owned by pod p1", every=0.01
    )
    kubelet.serve(Allocation("ns", "p2", "c", "nvidia.com/gpu", ("GPU-1",)))
    poll(
        lambda: pr.owners().get("GPU-1") == PodOwner("ns", "p2", "c"), 5, "GPU-1 owned by pod p2", every=0.01
    )
    assert crashes and kubelet.calls >= 2
    pr.stop()
    calls = kubelet.calls
    time.sleep(0.2)
    assert kubelet.calls == calls  # stopped means stopped
