"""The NICs over a diagnosis window (gpumon/net/history.py): a rank's nearest NICs' share of line rate and
their errors, from successive readings; counters that go back, ports that vanish, clocks that step back."""

from __future__ import annotations

import dataclasses

import pytest

from gpumon.gpu.snapshot import Snapshot
from gpumon.gpu.types import DriverInfo
from gpumon.net.history import NicHistory
from gpumon.net.rdma import RdmaPort

RATE = 5e10  # 400 Gb/s


def port(device: str, rx: int | None, tx: int | None, *, errors: int = 0, state: str = "ACTIVE") -> RdmaPort:
    return RdmaPort(
        device, 1, "InfiniBand", state, "LinkUp", RATE, rx, tx, None, None,
        errors={"symbol_error": errors, "link_downed": 0, "VL15_dropped": 1000 * errors},
    )  # fmt: skip


def snap(at: float, *ports: RdmaPort) -> Snapshot:
    return Snapshot(
        timestamp=at, sweep=int(at), interval_seconds=1.0, backend="sim", driver=DriverInfo("", 0, ""),
        device_count=0, gpus=(), host=None, collectors=(), errors={}, nics=ports, nics_at=at,
    )  # fmt: skip


def test_the_busier_direction_over_the_window_as_a_share_of_line_rate() -> None:
    h = NicHistory()
    for t in range(0, 61, 5):
        # mlx5_0 receives 20 GB/s and sends 10; mlx5_1 idles
        h.observe(snap(t, port("mlx5_0", int(2e10 * t), int(1e10 * t)), port("mlx5_1", 0, 0)), 30.0)
    use = h.use(["mlx5_0"], 60.0, 30.0)
    assert use is not None and use.nics == ("mlx5_0",)
    assert use.utilization == pytest.approx(0.4) and use.errors == 0 and use.down == ()
    # several NICs: the busiest speaks
    assert h.use(["mlx5_1", "mlx5_0"], 60.0, 30.0).utilization == pytest.approx(0.4)
    assert h.use(["mlx5_1"], 60.0, 30.0).utilization == 0.0
    # a NIC never read, or a window with one reading: no evidence, never 0
    assert h.use(["mlx5_9"], 60.0, 30.0) is None
    assert h.use(["mlx5_0"], 60.0, 4.0).utilization is None


def test_the_same_reading_twice_adds_one_point_and_old_points_go() -> None:
    h = NicHistory()
    s = snap(0.0, port("mlx5_0", 0, 0))
    h.observe(s, 10.0)
    h.observe(dataclasses.replace(s, sweep=2, timestamp=1.0), 10.0)  # a sweep between two NIC reads
    h.observe(snap(5.0, port("mlx5_0", int(5e10 * 5), 0)), 10.0)
    assert h.use(["mlx5_0"], 5.0, 10.0).utilization == pytest.approx(1.0)
    for t in range(10, 200, 5):
        h.observe(snap(float(t), port("mlx5_0", 0, 0)), 10.0)
    assert len(h._points[("mlx5_0", 1)]) <= 10  # the window and KEEP_AFTER, not every reading


def test_errors_count_the_growth_of_the_default_counters_only() -> None:
    h = NicHistory()
    h.observe(snap(0.0, port("mlx5_0", 0, 0, errors=3)), 30.0)
    h.observe(snap(5.0, port("mlx5_0", 0, 0, errors=10)), 30.0)
    # symbol_error grew by 7; VL15_dropped (not an error operators act on by default) by 7000
    assert h.use(["mlx5_0"], 5.0, 30.0).errors == 7.0


def test_counters_that_go_back_give_no_rate_and_no_errors() -> None:
    h = NicHistory()
    h.observe(snap(0.0, port("mlx5_0", 10**15, 10**15, errors=50)), 30.0)
    h.observe(snap(5.0, port("mlx5_0", 10, 10, errors=0)), 30.0)  # a driver reload reset them
    use = h.use(["mlx5_0"], 5.0, 30.0)
    assert use.utilization is None and use.errors is None
    # one direction unreadable (an adapter without counters): the other still counts
    h = NicHistory()
    h.observe(snap(0.0, port("mlx5_0", None, 0)), 30.0)
    h.observe(snap(5.0, port("mlx5_0", None, int(1e10 * 5))), 30.0)
    assert h.use(["mlx5_0"], 5.0, 30.0).utilization == pytest.approx(0.2)


def test_a_port_down_is_named_and_a_nic_that_vanished_is_down() -> None:
    h = NicHistory()
    h.observe(snap(0.0, port("mlx5_0", 0, 0), port("mlx5_1", 0, 0)), 30.0)
    h.observe(snap(5.0, port("mlx5_0", 0, 0, state="DOWN"), port("mlx5_1", 0, 0)), 30.0)
    assert h.use(["mlx5_0"], 5.0, 30.0).down == ("mlx5_0/1",)
    h.observe(snap(10.0, port("mlx5_0", 0, 0)), 30.0)  # mlx5_1 unplugged
    # a GPU's nearest NIC gone is down, not unknown (found by review: the verdict took it for idle)
    gone = h.use(["mlx5_1"], 10.0, 30.0)
    assert gone is not None and gone.down == ("mlx5_1 (gone)",) and gone.utilization is None
    h.observe(snap(15.0, port("mlx5_0", 0, 0), port("mlx5_1", 0, 0)), 30.0)  # back
    assert h.use(["mlx5_1"], 15.0, 30.0).down == ()


def test_a_clock_that_steps_back_starts_afresh() -> None:
    h = NicHistory()
    h.observe(snap(100.0, port("mlx5_0", 0, 0)), 30.0)
    h.observe(snap(105.0, port("mlx5_0", int(5e10 * 5), 0)), 30.0)
    h.observe(snap(50.0, port("mlx5_0", int(5e10 * 6), 0)), 30.0)  # NTP stepped the clock back
    assert len(h._points[("mlx5_0", 1)]) == 1
    assert h.use(["mlx5_0"], 50.0, 30.0).utilization is None


def test_no_reading_adds_nothing() -> None:
    h = NicHistory()
    h.observe(None, 30.0)
    h.observe(dataclasses.replace(snap(0.0), nics=None, nics_at=None), 30.0)  # --no-nics
    assert h.use(["mlx5_0"], 0.0, 30.0) is None


def test_a_gpus_nearest_nic_that_vanishes_stays_its_nearest_and_reads_gone() -> None:
    """Found by review: a GPU whose NIC vanished was given the next NIC, and the verdict read that one's
    idleness as "waiting on peers". The reader keeps the vanished NIC as the GPU's nearest; the history
    says it is gone; the verdict calls the network."""
    from gpumon.jobs.diagnosis import Signals, Thresholds, diagnose
    from gpumon.net.affinity import Nearest
    from gpumon.net.reader import NicReader

    class Source:
        def __init__(self) -> None:
            self.devices = ["mlx5_0", "mlx5_1"]

        def ports(self, detail: bool) -> tuple[RdmaPort, ...]:
            return tuple(dataclasses.replace(port(d, 0, 0), pci_bus_id=f"0000:1{i}:00.0")
                         for i, d in enumerate(self.devices))  # fmt: skip

        def nearest(self, gpus: list[str], nics: dict[str, str]) -> list[Nearest]:
            return [Nearest(g, sorted(nics)[0], "PIX") for g in gpus]  # the first left, as a farther one

        def peermem(self) -> str | None:
            return None

        def interfaces(self) -> tuple[()]:
            return ()

    source = Source()
    reader = NicReader(source)
    gpus = [("GPU-0", "00000000:18:00.0")]
    assert reader.read(gpus).nearest == (("GPU-0", "mlx5_0", "PIX"),)
    source.devices = ["mlx5_1"]
    r = reader.read(gpus)
    assert r.nearest == (("GPU-0", "mlx5_0", "PIX"),)
    h = NicHistory()
    h.observe(snap(0.0, port("mlx5_0", 0, 0), port("mlx5_1", 0, 0)), 30.0)
    h.observe(snap(5.0, port("mlx5_1", 0, 0)), 30.0)
    use = h.use(["mlx5_0"], 5.0, 30.0)
    s = Signals(progressing=True, communication_share=0.45, peers_elsewhere=8, nics=use.nics,
                nic_utilization=use.utilization, nic_errors=use.errors, nics_down=use.down)  # fmt: skip
    v = diagnose(s, Thresholds())
    assert "waiting_on_peers" not in v.findings and "nic_errors" in v.findings
    assert "mlx5_0 (gone)" in v.summary


def test_roce_retransmits_and_congestion_notifications_as_rates() -> None:
    def roce(t: int, retries: int, cnps: int) -> RdmaPort:
        hw = {"local_ack_timeout_err": retries, "out_of_sequence": 2 * retries, "rp_cnp_handled": cnps}
        return dataclasses.replace(port("mlx5_0", 0, 0), link_layer="Ethernet", hw_counters=hw)

    h = NicHistory()
    for t in range(0, 31, 5):
        h.observe(snap(t, roce(t, 10 * t, 500 * t), port("mlx5_1", 0, 0)), 30.0)
    use = h.use(["mlx5_0"], 30.0, 30.0)
    assert use is not None
    assert use.retransmit_rate == pytest.approx(30.0) and use.cnp_rate == pytest.approx(500.0)
    # InfiniBand without hw_counters: unknown, not 0
    ib = h.use(["mlx5_1"], 30.0, 30.0)
    assert ib is not None and ib.retransmit_rate is None and ib.cnp_rate is None
    # a driver reload resets the counters: no rate from a counter that went back
    h2 = NicHistory()
    h2.observe(snap(0, roce(0, 1000, 1000)), 30.0)
    h2.observe(snap(5, roce(5, 3, 3)), 30.0)
    after = h2.use(["mlx5_0"], 5.0, 30.0)
    assert after is not None and after.retransmit_rate is None and after.cnp_rate is None


def test_a_counter_missing_from_one_reading_is_not_counted_whole() -> None:
    """A firmware query that timed out leaves a counter out of one reading: the next must not add its
    lifetime value as growth (found by review: 200,000 retransmissions a second)."""

    def roce(t: int, **hw: int) -> RdmaPort:
        return dataclasses.replace(port("mlx5_0", 0, 0, errors=0), link_layer="Ethernet", hw_counters=hw)

    h = NicHistory()
    h.observe(snap(0, roce(0, local_ack_timeout_err=5)), 30.0)  # out_of_sequence not read this time
    h.observe(snap(5, roce(5, local_ack_timeout_err=5, out_of_sequence=2_000_000)), 30.0)
    h.observe(snap(10, roce(10, local_ack_timeout_err=15, out_of_sequence=2_000_000)), 30.0)
    use = h.use(["mlx5_0"], 10.0, 30.0)
    assert use is not None and use.retransmit_rate == pytest.approx(1.0)  # local_ack_timeout_err alone
