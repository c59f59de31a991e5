"""Text output of ``gpumon baseline``: the library as a table, a job against its baseline."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.baselines.library import Baseline

# figure, heading, how to print it, whether a higher ratio is better
FIGURES = (
    ("tokens_per_second_per_gpu", "tokens/s/GPU", "{:,.0f}", True),
    ("step_time_seconds", "step", "{:.3g} s", False),
    ("mfu", "MFU", "{:.1%}", True),
    ("tokens_per_joule", "tokens/J", "{:.3g}", True),
)


def _fmt(template: str, v: object) -> str:
    return template.format(v) if isinstance(v, int | float) else "-"


def table(bs: list[Baseline]) -> str:
    head = ["name", "GPUs", "dtype", *(h for _, h, _, _ in FIGURES), "recorded"]
    rows = [head]
    for b in bs:
        f = b.figures
        rows.append(
            [
                b.name,
                f"{b.key.gpus}x {b.key.gpu_model}",
                b.key.dtype or "-",
                *(_fmt(t, getattr(f, name)) for name, _, t, _ in FIGURES),
                b.recorded_at[:10] or "-",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def comparison(job: str, section: Mapping[str, Any]) -> str:
    if section.get("key") is None:
        return f"Job {job} has no baseline key: {section.get('why_no_key')}."
    k = section["key"]
    described = f"{k['workload']} on {k['gpus']}x {k['gpu_model']}, {k['dtype'] or 'no dtype'}"
    base = section.get("baseline")
    if base is None:
        return (
            f"Job {job} ({described}) has no baseline. Record one once it runs well:\n"
            f"  gpumon baseline record --job {job}"
        )
    lines = [
        f"Job {job} against baseline {base['name']} ({described}; recorded {base.get('recorded_at', '?')}):",
        f"  {'':<14} {'now':>12} {'baseline':>12} {'ratio':>8}",
    ]
    now, ratios = section["current"], section.get("ratios") or {}
    for name, heading, t, higher_better in FIGURES:
        r = ratios.get(name)
        verdict = ""
        if isinstance(r, int | float):
            # the figure's own change (a step time 52.8 % longer is +52.8 %), then what it means
            worse = r < 1 if higher_better else r > 1
            verdict = f"{r - 1:+.1%}".replace("%", " %")
            if abs(r - 1) >= 0.05:
                verdict += " worse" if worse else " better"
        lines.append(
            f"  {heading:<14} {_fmt(t, now.get(name)):>12} {_fmt(t, base.get(name)):>12} "
            f"{_fmt('{:.3f}', r):>8}  {verdict}".rstrip()
        )
    return "\n".join(lines)
