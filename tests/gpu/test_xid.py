"""The XID catalogue: well-formed entries, and spot checks against NVIDIA that would catch a wrong table."""

from __future__ import annotations

import re
import subprocess
import sys
from types import MappingProxyType

import pytest

from gpumon.gpu import xid
from gpumon.gpu.xid import CATALOGUE, Cause, Severity, XidInfo

# The brief's list: every one of these has a source, so none may silently drop out of the table.
REQUIRED = (
    8, 13, 31, 32, 38, 43, 45, 48, 56, 57, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 109, 119, 120,
    121, 122, 123, 136, 137, 140, 143, 144, 145, 146, 147, 148, 149, 150, 154, 155,
)  # fmt: skip


def test_keys_are_unique_positive_and_match_the_code() -> None:
    assert CATALOGUE, "empty catalogue"
    for key, info in CATALOGUE.items():
        assert isinstance(info, XidInfo)
        assert key == info.code
        assert isinstance(key, int)
        assert key > 0


def test_the_catalogue_cannot_be_changed() -> None:
    assert isinstance(CATALOGUE, MappingProxyType)
    with pytest.raises(TypeError):
        CATALOGUE[1] = CATALOGUE[8]  # type: ignore[index]
    with pytest.raises(AttributeError):
        CATALOGUE[8].severity = Severity.INFO  # type: ignore[misc]


def test_every_required_code_is_catalogued() -> None:
    assert [code for code in REQUIRED if code not in CATALOGUE] == []


@pytest.mark.parametrize("info", list(CATALOGUE.values()), ids=lambda i: str(i.code))
def test_text_fits_help_lines_and_markdown_cells(info: XidInfo) -> None:
    for text in (info.description, info.action):
        assert text.strip() == text
        assert text
        assert len(text) < 100
        assert "\n" not in text
        assert "\r" not in text
        assert '"' not in text
        assert "\\" not in text
        assert "|" not in text  # would split the Markdown table cell
    assert isinstance(info.severity, Severity)
    assert isinstance(info.cause, Cause)


def test_fallen_off_the_bus_is_critical() -> None:
    info = CATALOGUE[79]
    assert info.severity is Severity.CRITICAL
    assert "fallen off the bus" in info.description.lower()
    assert info.cause is Cause.SYSTEM
    assert "reboot" in info.action  # NVIDIA's bucket is RESTART_BM, not a GPU reset


@pytest.mark.parametrize("code", [13, 31])
def test_engine_exception_and_page_fault_are_the_application(code: int) -> None:
    assert CATALOGUE[code].cause is Cause.APPLICATION
    assert CATALOGUE[code].severity is Severity.WARNING


def test_48_is_a_double_bit_ecc_memory_error() -> None:
    info = CATALOGUE[48]
    assert info.cause is Cause.MEMORY
    assert info.severity is Severity.CRITICAL
    assert "double-bit ecc" in info.description.lower()


def test_74_is_nvlink() -> None:
    assert CATALOGUE[74].cause is Cause.NVLINK
    assert "nvlink" in CATALOGUE[74].description.lower()
    assert CATALOGUE[74].severity is Severity.CRITICAL


def test_94_is_contained_and_95_uncontained() -> None:
    contained, uncontained = CATALOGUE[94], CATALOGUE[95]
    assert contained.description.lower().startswith("contained")
    assert uncontained.description.lower().startswith("uncontained")
    assert contained.cause is uncontained.cause is Cause.MEMORY
    # 94 only costs the faulting application; 95 needs the GPU reset before anything runs again.
    assert contained.severity is Severity.WARNING
    assert uncontained.severity is Severity.CRITICAL
    assert "restart the application" in contained.action
    assert "reset" in uncontained.action


def test_a_few_more_rows_against_the_catalog() -> None:
    assert CATALOGUE[63].severity is Severity.INFO  # the row remapper did its job
    assert CATALOGUE[64].severity is Severity.CRITICAL  # and here it failed
    assert CATALOGUE[92].cause is Cause.MEMORY
    assert "single-bit" in CATALOGUE[92].description
    assert CATALOGUE[119].severity is CATALOGUE[120].severity is Severity.CRITICAL
    assert "GSP" in CATALOGUE[119].description
    assert CATALOGUE[121].severity is Severity.INFO  # corrected C2C errors, no operational impact
    assert CATALOGUE[140].cause is Cause.MEMORY
    assert all(CATALOGUE[code].cause is Cause.NVLINK for code in range(144, 151))
    assert CATALOGUE[43].severity is not Severity.CRITICAL  # the GPU stays healthy


def test_unknown_code_falls_back() -> None:
    assert 9999 not in CATALOGUE
    info = xid.lookup(9999)
    assert info == XidInfo(
        9999, "unknown XID 9999", Severity.WARNING, Cause.SYSTEM, "look up the code in NVIDIA's XID catalogue"
    )
    assert xid.lookup(79) is CATALOGUE[79]


def test_as_json() -> None:
    assert xid.as_json(48) == {
        "code": 48,
        "description": CATALOGUE[48].description,
        "severity": "critical",
        "cause": "memory",
        "action": CATALOGUE[48].action,
    }
    unknown = xid.as_json(9999)
    assert set(unknown) == {"code", "description", "severity", "cause", "action"}
    assert unknown["severity"] == "warning"
    assert all(type(value) in (int, str) for value in unknown.values())  # plain JSON, no enums


def test_render_markdown_has_every_code_exactly_once_sorted() -> None:
    text = xid.render_markdown()
    assert text.startswith("## XID catalogue\n")
    assert "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html" in text
    assert "2026-11" in text
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    codes = [int(row.split("|")[1]) for row in rows]
    assert codes == sorted(CATALOGUE)  # each once, in order
    for row in rows:
        assert row.count("|") == 6  # five cells: nothing in a cell broke the table
    assert "| 79 | " + CATALOGUE[79].description + " | critical | system | " in text


def test_running_the_module_prints_the_markdown() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpumon.gpu.xid"], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout == xid.render_markdown()
