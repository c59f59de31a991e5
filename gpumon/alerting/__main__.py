"""``python -m gpumon.alerting [--check]``: write deploy/kubernetes/base/prometheusrule.yaml from alerts/, or
(with --check) exit 1 when the committed copy differs from what the rule files render.

``python -m gpumon.alerting --vmalert DIR``: write the vmalert variant of both rule files into DIR instead
(gpumon.alerting.victoria)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpumon.alerting import PROMETHEUS_RULE, AlertingError, render_prometheus_rule, write_vmalert


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpumon.alerting",
        description="Render the prometheus-operator PrometheusRule from the rule files in alerts/.",
    )
    parser.add_argument(
        "--check", action="store_true", help="do not write; exit 1 if the file is not up to date"
    )
    parser.add_argument("--output", type=Path, default=PROMETHEUS_RULE, help="default: %(default)s")
    parser.add_argument(
        "--vmalert",
        type=Path,
        metavar="DIR",
        help="instead, write the rule files for vmalert with VictoriaMetrics (MetricsQL) into DIR",
    )
    args = parser.parse_args(argv)
    if args.vmalert is not None:
        if args.check:
            parser.error("--check compares the PrometheusRule; the vmalert files are not committed")
        try:
            written = write_vmalert(args.vmalert)
        except (AlertingError, OSError) as exc:
            print(f"gpumon.alerting: {exc}", file=sys.stderr)
            return 1
        for path in written:
            print(f"wrote {path}")
        return 0
    try:
        text = render_prometheus_rule()
    except AlertingError as exc:
        print(f"gpumon.alerting: {exc}", file=sys.stderr)
        return 1
    out: Path = args.output
    if args.check:
        try:
            current = out.read_text()
        except OSError:
            current = None
        if current != text:
            print(f"{out} is out of date: run python -m gpumon.alerting", file=sys.stderr)
            return 1
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)  # atomic: a reader never sees half a manifest
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
