"""DcgmSource against a fake of DCGM's Python bindings (tests/gpu/fake_dcgm), and without any bindings."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpumon.gpu import dcgm
from gpumon.gpu.dcgm import FIELDS, DcgmReadError, DcgmSource

FAKE_DIR = Path(__file__).resolve().parent / "fake_dcgm"
FAKE_MODULES = ("pydcgm", "dcgm_agent", "dcgm_fields", "dcgm_structs", "dcgmvalue", "dcgm_field_helpers")
UUIDS = {0: "GPU-0a0a0a0a-0000-0000-0000-000000000000", 1: "GPU-1b1b1b1b-1111-1111-1111-111111111111"}


def _purge() -> None:
    for name in FAKE_MODULES:
        sys.modules.pop(name, None)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No bindings module survives a test, sys.path is restored, and no real install is ever picked up."""
    _purge()
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(dcgm, "DEFAULT_BINDINGS_PATH", str(tmp_path / "no-dcgm-here"))
    yield
    _purge()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    monkeypatch.syspath_prepend(str(FAKE_DIR))
    agent: Any = importlib.import_module("dcgm_agent")
    agent.engine.gpus.update(UUIDS)
    return SimpleNamespace(
        engine=agent.engine,
        structs=importlib.import_module("dcgm_structs"),
        value=importlib.import_module("dcgmvalue"),
    )


@pytest.fixture
def source(fake: SimpleNamespace) -> Iterator[DcgmSource]:
    src = DcgmSource(bindings_path=None, update_interval=0.5)
    assert src.open(list(UUIDS.values())), src.reason
    yield src
    src.close()


def dcgm_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "gpumon.dcgm"]


# -- no bindings -----------------------------------------------------------------------------------------
def test_without_bindings_open_logs_one_info_line_and_returns_false(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gpumon.dcgm")
    src = DcgmSource(bindings_path=None)
    assert src.open(list(UUIDS.values())) is False
    assert src.available is False
    assert "DCGM Python bindings not found" in src.reason
    [record] = dcgm_records(caplog)
    assert record.levelno == logging.INFO
    assert "DCGM Python bindings not found (" in record.getMessage()
    assert "profiling counters come from NVML GPM where supported" in record.getMessage()
    assert src.read(UUIDS[0]) is None
    src.close()
    src.close()


def test_bindings_path_is_searched_when_the_bindings_are_not_on_sys_path() -> None:
    assert str(FAKE_DIR) not in sys.path
    src = DcgmSource(bindings_path=str(FAKE_DIR))
    # the fake engine has no GPUs yet: getting as far as asking DCGM for them proves the import worked
    assert src.open([UUIDS[0]]) is False
    assert "none of the 1 GPU(s)" in src.reason
    assert str(FAKE_DIR) in sys.path
    assert Path(sys.modules["pydcgm"].__file__ or "").parent == FAKE_DIR


def test_update_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        DcgmSource(update_interval=0)


# -- opening ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("address", [None, "10.0.0.7:5555"], ids=["embedded", "hostengine"])
def test_open_watches_the_profiling_fields_of_our_gpus(fake: SimpleNamespace, address: str | None) -> None:
    src = DcgmSource(address, update_interval=0.5, bindings_path=None)
    assert src.open([UUIDS[1]]), src.reason
    assert src.available and src.reason == ""
    engine = fake.engine
    assert list(engine.handles.values()) == [address]
    [(_, _, gpus)] = engine.groups.values()
    assert gpus == [1]
    [(_, _, field_ids)] = engine.field_groups.values()
    assert field_ids == list(range(1001, 1013))
    [(update_usec, max_keep_age, max_keep_samples)] = engine.watches.values()
    assert update_usec == 500_000
    assert max_keep_age >= 1.0 and 1 <= max_keep_samples <= 5
    src.close()
    assert engine.registered() == [] and engine.leaked == []


def test_uuids_match_whatever_their_case(fake: SimpleNamespace) -> None:
    src = DcgmSource(bindings_path=None)
    assert src.open([UUIDS[0].upper()])
    fake.engine.set_value(0, 1002, 0.5)
    reading = src.read(UUIDS[0])
    assert reading is not None and reading.sm_active_ratio == 0.5
    src.close()


@pytest.mark.parametrize(
    ("setup", "address", "expect"),
    [
        ("make_unreachable", "10.0.0.7:5555", ["nv-hostengine at 10.0.0.7:5555", "ConnectionNotValid"]),
        ("make_unreachable", None, ["embedded DCGM host engine", "DCGMError_InitError"]),
        ("make_profiling_unsupported", None, ["DCGMError_ProfilingNotSupported", "no DCGM profiling"]),
    ],
)
def test_a_failing_open_warns_once_and_leaves_nothing_registered(
    fake: SimpleNamespace,
    caplog: pytest.LogCaptureFixture,
    setup: str,
    address: str | None,
    expect: list[str],
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpumon.dcgm")
    getattr(fake.engine, setup)()
    src = DcgmSource(address, bindings_path=None)
    assert src.open(list(UUIDS.values())) is False
    assert src.available is False
    [record] = dcgm_records(caplog)
    assert record.levelno == logging.WARNING
    for text in expect:
        assert text in src.reason and text in record.getMessage()
    assert fake.engine.registered() == [] and fake.engine.leaked == []
    assert src.read(UUIDS[0]) is None


@pytest.mark.parametrize(
    ("code", "hint"),
    [
        ("DCGM_ST_REQUIRES_ROOT", "CAP_SYS_ADMIN"),
        ("DCGM_ST_MODULE_NOT_LOADED", "profiling module"),
        ("DCGM_ST_PROFILING_NOT_SUPPORTED", "no DCGM profiling metrics"),
    ],
)
def test_profiling_refusals_say_what_to_do(fake: SimpleNamespace, code: str, hint: str) -> None:
    fake.engine.make_profiling_unsupported(getattr(fake.structs, code))
    src = DcgmSource(bindings_path=None)
    assert src.open(list(UUIDS.values())) is False
    assert hint in src.reason
    # created group and field group are gone before the handle closes: the engine saw no leak
    assert fake.engine.registered() == [] and fake.engine.leaked == []
    assert fake.engine.calls[-3:] == ["dcgmFieldGroupDestroy", "dcgmGroupDestroy", "dcgmStopEmbedded"]


def test_gpus_unknown_to_dcgm_make_the_source_unavailable(fake: SimpleNamespace) -> None:
    src = DcgmSource(bindings_path=None)
    assert src.open(["GPU-ffffffff-ffff-ffff-ffff-ffffffffffff"]) is False
    assert "none of the 1 GPU(s)" in src.reason
    assert fake.engine.registered() == []


def test_a_missing_libdcgm_is_reported_like_missing_bindings(
    fake: SimpleNamespace, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpumon.dcgm")
    fake.structs.fake_library_present = False
    src = DcgmSource(bindings_path=None)
    assert src.open(list(UUIDS.values())) is False
    [record] = dcgm_records(caplog)
    assert record.levelno == logging.INFO and "libdcgm.so.4 not found" in record.getMessage()


# -- reading ---------------------------------------------------------------------------------------------
def test_each_field_lands_in_its_reading_attribute(fake: SimpleNamespace, source: DcgmSource) -> None:
    expected: dict[str, float] = {}
    for n, (field_id, attr) in enumerate(FIELDS):
        # ratios below 1 for the activity fields, large integers (bytes per second) for the rates
        value: float = (n + 1) / 100 if field_id <= 1008 else (n + 1) * 1_000_000_007
        fake.engine.set_value(1, field_id, value)
        expected[attr] = value
    reading = source.read(UUIDS[1])
    assert reading is not None and reading.source == "dcgm"
    for attr, value in expected.items():
        assert getattr(reading, attr) == pytest.approx(value), attr


def test_spot_check_units(fake: SimpleNamespace, source: DcgmSource) -> None:
    fake.engine.set_value(0, 1004, 0.42)
    fake.engine.set_value(0, 1009, 25_000_000_000)
    fake.engine.set_value(0, 1012, 7)
    reading = source.read(UUIDS[0])
    assert reading is not None
    assert reading.tensor_active_ratio == 0.42
    assert reading.pcie_transmit_bytes_per_second == 25e9
    assert isinstance(reading.pcie_transmit_bytes_per_second, float)
    assert reading.nvlink_receive_bytes_per_second == 7.0
    assert reading.sm_active_ratio is None  # never sampled: DCGM hands back a blank


def test_blanks_and_failed_statuses_read_as_none(fake: SimpleNamespace, source: DcgmSource) -> None:
    engine, value = fake.engine, fake.value
    engine.set_value(0, 1001, value.DCGM_FP64_BLANK)
    engine.set_value(0, 1002, value.DCGM_FP64_NOT_SUPPORTED)
    engine.set_value(0, 1009, value.DCGM_INT64_NOT_PERMISSIONED)
    engine.set_value(0, 1010, value.DCGM_INT64_BLANK)
    engine.set_value(0, 1003, 0.3)
    engine.statuses[0, 1003] = fake.structs.DCGM_ST_NO_DATA
    engine.set_value(0, 1005, 0.0)
    reading = source.read(UUIDS[0])
    assert reading is not None
    assert reading.graphics_engine_active_ratio is None
    assert reading.sm_active_ratio is None
    assert reading.pcie_transmit_bytes_per_second is None
    assert reading.pcie_receive_bytes_per_second is None
    assert reading.sm_occupancy_ratio is None
    assert reading.dram_active_ratio == 0.0  # zero is a value, not a blank


def test_blank_thresholds_apply_even_when_the_helper_does_not_flag_them() -> None:
    def series(v: object) -> list[SimpleNamespace]:
        return [SimpleNamespace(value=v, isBlank=False)]

    assert dcgm._number(series(dcgm.INT64_BLANK + 2)) is None
    assert dcgm._number(series(dcgm.FP64_BLANK)) is None
    # an int byte rate above 2**47 is still a number: the FP64 threshold must not apply to it
    assert dcgm._number(series(2**47 + 5)) == float(2**47 + 5)
    assert dcgm._number([]) is None and dcgm._number(None) is None


def test_unknown_uuid_reads_none(fake: SimpleNamespace) -> None:
    src = DcgmSource(bindings_path=None)
    assert src.open([UUIDS[0]])  # GPU 1 exists in DCGM but was not asked for
    assert src.read(UUIDS[1]) is None
    assert src.read("GPU-not-a-gpu") is None
    src.close()


def test_one_dcgm_query_serves_a_whole_sweep(fake: SimpleNamespace, source: DcgmSource) -> None:
    def queries() -> int:
        return fake.engine.calls.count("dcgmGetLatestValues_v2")

    fake.engine.set_value(0, 1002, 0.1)
    first = source.read(UUIDS[0])
    source.read(UUIDS[1])
    assert queries() == 1
    fake.engine.set_value(0, 1002, 0.9)
    second = source.read(UUIDS[0])  # GPU 0 again: a new sweep, so fresh values
    assert queries() == 2
    assert first is not None and first.sm_active_ratio == 0.1
    assert second is not None and second.sm_active_ratio == 0.9


def test_a_dcgm_error_during_read_raises_dcgm_read_error(fake: SimpleNamespace, source: DcgmSource) -> None:
    fake.engine.fail["dcgmGetLatestValues_v2"] = fake.structs.DCGM_ST_CONNECTION_NOT_VALID
    with pytest.raises(DcgmReadError, match="not valid") as info:
        source.read(UUIDS[0])
    assert isinstance(info.value.__cause__, fake.structs.DCGMError)
    del fake.engine.fail["dcgmGetLatestValues_v2"]
    fake.engine.set_value(0, 1004, 0.25)
    reading = source.read(UUIDS[0])
    assert reading is not None and reading.tensor_active_ratio == 0.25


# -- closing ---------------------------------------------------------------------------------------------
def test_close_releases_everything_in_order_and_is_idempotent(fake: SimpleNamespace) -> None:
    src = DcgmSource(bindings_path=None)
    assert src.open(list(UUIDS.values()))
    src.close()
    src.close()
    assert src.available is False and src.reason == "closed"
    assert src.read(UUIDS[0]) is None
    assert fake.engine.registered() == [] and fake.engine.leaked == []
    teardown = [
        c
        for c in fake.engine.calls
        if c.startswith(("dcgmUnwatch", "dcgmFieldGroupD", "dcgmGroupD", "dcgmStop"))
    ]
    assert teardown == ["dcgmUnwatchFields", "dcgmFieldGroupDestroy", "dcgmGroupDestroy", "dcgmStopEmbedded"]


def test_close_swallows_dcgm_errors(fake: SimpleNamespace) -> None:
    src = DcgmSource("localhost", bindings_path=None)
    assert src.open(list(UUIDS.values()))
    for call in ("dcgmUnwatchFields", "dcgmFieldGroupDestroy", "dcgmGroupDestroy", "dcgmDisconnect"):
        fake.engine.fail[call] = fake.structs.DCGM_ST_CONNECTION_NOT_VALID
    src.close()
    assert src.available is False


def test_reopening_releases_the_previous_session(fake: SimpleNamespace) -> None:
    src = DcgmSource(bindings_path=None)
    assert src.open([UUIDS[0]])
    assert src.open(list(UUIDS.values()))
    assert len(fake.engine.handles) == 1 and len(fake.engine.groups) == 1
    assert fake.engine.leaked == []
    src.close()


# -- the fake itself -------------------------------------------------------------------------------------
def test_fake_errors_follow_the_real_class_hierarchy(fake: SimpleNamespace) -> None:
    structs = fake.structs
    err = structs.DCGMError(structs.DCGM_ST_PROFILING_NOT_SUPPORTED)
    assert type(err) is structs.DCGMError_ProfilingNotSupported
    assert (
        structs.dcgmExceptionClass(structs.DCGM_ST_CONNECTION_NOT_VALID)
        is structs.DCGMError_ConnectionNotValid
    )
    assert isinstance(structs.DCGMError_ConnectionNotValid(), structs.DCGMError)
    assert "Profiling is not supported" in str(err)


def test_zz_no_fake_binding_module_outlives_its_test() -> None:
    assert not [m for m in FAKE_MODULES if m in sys.modules]
