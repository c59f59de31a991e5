"""The repository keeps its promises: the README's commands are the ones CI runs, and code is lint-clean."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from support.helpers import IN_CI, ROOT


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```sh\n(.+?)\n```", text, flags=re.S)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci, f".ci/run must run the README's test command verbatim: {test_command}"


def test_readme_run_command_installs_and_serves() -> None:
    run_command = readme_commands()[0]
    assert "pip install ." in run_command and "gpumon serve --simulate-if-no-gpu 8xH100-SXM" in run_command


@pytest.mark.parametrize("tool", [["ruff", "check", "."], ["mypy"]], ids=["ruff", "mypy"])
def test_lint_and_types_are_clean(tool: list[str]) -> None:
    exe = shutil.which(tool[0])
    if exe is None:
        if IN_CI:
            pytest.fail(f"{tool[0]} is part of the test extra and must be installed in CI")
        pytest.skip(f"{tool[0]} not installed")
    result = subprocess.run([exe, *tool[1:]], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
