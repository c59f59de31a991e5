"""``python -m gpumon.dashboards [--check] [--dir grafana/dashboards] [--configmaps FILE]``, run from the
repository root: writes the dashboards' JSON and the Kubernetes ConfigMaps made of it
(deploy/kubernetes/base/dashboards.yaml)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpumon.dashboards import rendered
from gpumon.dashboards.configmaps import CONFIGMAPS_FILE, ConfigMapTooLarge, render_configmaps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpumon.dashboards", description=__doc__)
    parser.add_argument(
        "--dir", type=Path, default=Path("grafana/dashboards"), help="where the JSON files live"
    )
    parser.add_argument(
        "--configmaps",
        type=Path,
        default=CONFIGMAPS_FILE,
        help="the ConfigMaps for the Grafana sidecar (default: deploy/kubernetes/base/dashboards.yaml)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a committed file differs from the code"
    )
    args = parser.parse_args(argv)
    dashboards = rendered()
    try:
        manifest = render_configmaps(dashboards)
    except ConfigMapTooLarge as exc:
        print(f"python -m gpumon.dashboards: {exc}", file=sys.stderr)
        return 1
    outputs = {args.dir / name: text for name, text in dashboards.items()}
    outputs[args.configmaps] = manifest
    drift = []
    for path, text in outputs.items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        drift.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and drift:
        names = ", ".join(str(p) for p in drift)
        print(f"out of date: {names}; run python -m gpumon.dashboards", file=sys.stderr)
        return 1
    for path in [] if args.check else drift:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
