"""The rank's state file: what a process leaves beside its checkpoints for the next process of its rank."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Server

from gpumon.client import Reporter
from gpumon.client import rankstate as RS


def test_a_reporter_leaves_its_progress_and_the_next_one_sends_it_as_its_predecessor(
    server: Server, reporters: Callable[..., Reporter], tmp_path: Path
) -> None:
    srv = server()
    first = reporters(url=srv.url, state_dir=str(tmp_path), resumed_step=100, interval=60)
    for _ in range(5):
        first.step(tokens=10)
    first.close()
    (path,) = tmp_path.glob("gpumon-test-job-*-rank0.json")
    left = json.loads(path.read_text())
    assert (left["incarnation"], left["step"]) == (first.incarnation, 105)
    assert abs(left["last_step"] - time.time()) < 5
    # the Reporter registry hands a second Reporter of a live (job, rank) the first's counters: a closed one
    # is gone, so this is what a new process of the rank does
    second = reporters(url=srv.url, state_dir=str(tmp_path), interval=60)
    assert second.flush()
    assert srv.bodies[-1]["predecessor"] == {
        "incarnation": first.incarnation,
        "step": 105,
        "last_step": left["last_step"],
    }
    # without resume() the successor continues from the predecessor's mark, which never goes back
    second.step()
    second.step()
    second.close()
    assert json.loads(path.read_text())["step"] == 107


def test_a_successor_resuming_from_an_older_checkpoint_keeps_the_high_water_mark(tmp_path: Path) -> None:
    state = RS.StateFile(str(tmp_path / "s.json"), "b2", {"incarnation": "a1", "step": 500, "last_step": 2e9})
    assert state.high_water(resumed_step=440, steps=30) == 500  # redoing 441..470
    assert state.high_water(resumed_step=440, steps=90) == 530
    assert RS.StateFile("x", "a1", None).high_water(None, 7) == 7


def test_writes_are_rate_limited_while_stepping_but_the_final_one_always_lands(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    state = RS.StateFile(str(path), "a1", None)
    state.update(None, 1, 2e9, final=False)
    state.update(None, 2, 2e9 + 1, final=False)  # within WRITE_EVERY of the first: skipped
    assert json.loads(path.read_text())["step"] == 1
    state.update(None, 3, 2e9 + 2, final=True)
    assert json.loads(path.read_text())["step"] == 3
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[1, 2]",
        b'{"incarnation": "a1", "step": -1, "last_step": 2000000000}',
        b'{"incarnation": "a1", "step": 5, "last_step": true}',
        b'{"incarnation": "../x", "step": 5, "last_step": 2000000000}',
        b'{"incarnation": "a1", "step": 5, "last_step": 9000000000}',  # from the future
        b'{"incarnation": "me", "step": 5, "last_step": 2000000000}',  # its own
        b" " * (RS.MAX_BYTES + 1),
    ],
)
def test_a_file_that_is_not_a_valid_state_is_ignored_with_a_warning(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.json"
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        assert RS.read_predecessor(str(path), "me", time.time()) is None
    assert "ignored" in caplog.text


def test_no_file_is_a_fresh_rank_and_no_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert RS.read_predecessor(str(tmp_path / "none.json"), "me", time.time()) is None
    assert not caplog.records


def test_an_unwritable_place_warns_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"  # a path under a regular file cannot be written, not even by root
    blocker.write_text("")
    state = RS.StateFile(str(blocker / "s.json"), "a1", None)
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        state.update(None, 1, 2e9, final=True)
        state.update(None, 2, 2e9, final=True)
    assert caplog.text.count("cannot write the rank state") == 1


def test_a_missing_state_directory_is_a_warning_not_an_error(
    reporters: Callable[..., Reporter], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        r = reporters(state_dir=str(tmp_path / "absent"), interval=60)
    assert r.enabled and "is not a directory" in caplog.text


def test_job_names_with_unsafe_characters_get_distinct_file_names(tmp_path: Path) -> None:
    a = RS.state_path(str(tmp_path), "team/llama:run@1", 3)
    b = RS.state_path(str(tmp_path), "team_llama_run_1", 3)
    assert a != b and Path(a).parent == tmp_path and "/" not in Path(a).name and a.endswith("-rank3.json")


def test_a_fifo_or_a_symlink_at_the_state_path_is_not_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A FIFO would block the Reporter's constructor forever in open(); a symlink could point anywhere."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    target = tmp_path / "elsewhere.json"
    target.write_text('{"incarnation": "a1", "step": 5, "last_step": 2000000000}')
    link.symlink_to(target)
    with caplog.at_level(logging.WARNING, logger="gpumon.client"):
        assert RS.read_predecessor(str(fifo), "me", time.time()) is None
        assert RS.read_predecessor(str(link), "me", time.time()) is None
    assert "not a regular file" in caplog.text and "cannot read" in caplog.text


def test_a_failed_write_removes_the_stale_file_and_the_next_one_succeeds(tmp_path: Path) -> None:
    """Progress written once and then frozen would link the next process to stale data (its time booked
    twice, its redone steps missed): after a failed write there is no file until a write succeeds."""
    path = tmp_path / "s.json"
    state = RS.StateFile(str(path), "a1", None)
    state.update(None, 10, 2e9, final=True)
    assert json.loads(path.read_text())["step"] == 10
    real = os.replace

    def failing(*args: object) -> None:
        raise OSError(28, "No space left on device")

    os.replace = failing  # type: ignore[assignment]
    try:
        state.update(None, 20, 2e9 + 5, final=True)
    finally:
        os.replace = real
    assert not path.exists() and not list(tmp_path.glob("*.tmp"))
    state.update(None, 30, 2e9 + 9, final=True)
    assert json.loads(path.read_text())["step"] == 30


def test_a_planted_file_at_a_temporary_name_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "s.json"
    for pid_guess in range(5):  # the old predictable names: path.<pid>.tmp
        (tmp_path / f"s.json.{os.getpid() + pid_guess}.tmp").symlink_to(victim)
    RS.StateFile(str(path), "a1", None).update(None, 1, 2e9, final=True)
    assert victim.read_text() == "precious" and not path.is_symlink()
