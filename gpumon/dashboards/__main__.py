"""``python -m gpumon.dashboards [--check] [--dir grafana/dashboards]``, run from the repository root."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpumon.dashboards import rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpumon.dashboards", description=__doc__)
    parser.add_argument(
        "--dir", type=Path, default=Path("grafana/dashboards"), help="where the JSON files live"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a committed file differs from the code"
    )
    args = parser.parse_args(argv)
    drift = []
    for name, text in rendered().items():
        path = args.dir / name
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        drift.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and drift:
        print(
            f"out of date in {args.dir}: {', '.join(drift)}; run python -m gpumon.dashboards", file=sys.stderr
        )
        return 1
    for name in [] if args.check else drift:
        print(f"wrote {args.dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
