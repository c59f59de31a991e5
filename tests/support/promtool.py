"""promtool's rule unit tests, one process per test file and as many at once as there are cores: the files
are independent, and one run of all of them in a single process left a core idle for over a minute."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def run_unit_tests(promtool: str, files: Sequence[Path], timeout: float = 300) -> list[tuple[Path, int, str]]:
    """``promtool test rules FILE`` for each file: (file, exit status, stdout and stderr)."""

    def one(path: Path) -> tuple[Path, int, str]:
        r = subprocess.run(
            [promtool, "test", "rules", str(path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return path, r.returncode, r.stdout + r.stderr

    # the slowest files first, so the last to start is not the longest
    ordered = sorted(files, key=lambda p: p.stat().st_size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, ordered))
