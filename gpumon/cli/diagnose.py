"""gpumon diagnose: why is my job slow? The daemon's verdict per job and rank, with evidence and advice."""

from __future__ import annotations

import argparse
import contextlib
import json
import textwrap
from typing import Any

from gpumon.cli.common import printable
from gpumon.cli.daemon_api import NotFound, default_url, display_url, get_json, job_path
from gpumon.config import Settings

USES_GPUS = False  # it reads the daemon's API; no GPU options


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--job", metavar="NAME", help="one job (default: every job reporting to the daemon)")
    p.add_argument(
        "--url",
        metavar="URL",
        help="the daemon, http://, https://[USER:PASSWORD@] or unix:// (default $GPUMON_URL or http://127.0.0.1:9478)",
    )
    p.add_argument("--json", action="store_true", help="print the daemon's JSON, evidence included")


def run(settings: Settings, args: argparse.Namespace) -> int:
    url = args.url or default_url()
    if args.job is not None:
        missing = (
            f"no job {args.job!r} reports to the daemon at {display_url(url)} "
            "(gpumon diagnose lists those that do)"
        )
        jobs = [get_json(url, job_path(args.job), missing=missing)]
    else:
        listing = get_json(url, "/v1/jobs")
        jobs = []
        for j in listing.get("jobs", []):
            with contextlib.suppress(NotFound):  # a job that went between the listing and this request
                jobs.append(get_json(url, job_path(j["job"])))
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print(
            f"No training or inference job reports to the daemon at {display_url(url)}.\n"
            "Add the SDK to the training loop (docs/sdk.md): reporter = gpumon.client.Reporter(job=...); "
            "reporter.step(tokens=...)."
        )
        return 0
    # a daemon's strings (a NIC name from sysfs in a summary, a job's note) reach the terminal escaped
    print("\n\n".join(render(_printable(job)) for job in jobs))
    return 0


def _printable(doc: Any) -> Any:
    """The daemon's document with every string printable() (a newline in one would forge a line)."""
    if isinstance(doc, str):
        return printable(doc)
    if isinstance(doc, dict):
        return {k: _printable(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_printable(v) for v in doc]
    return doc


def _pct(x: object) -> str:
    return f"{100 * x:.1f} %" if isinstance(x, int | float) else "n/a"


def _num(x: object, unit: str = "") -> str:
    if not isinstance(x, int | float):
        return "n/a"
    return f"{x:,.0f}{unit}" if abs(x) >= 100 else f"{x:.3g}{unit}"


def _evidence_lines(diagnosis: dict[str, Any]) -> list[str]:
    lines = []
    for e in diagnosis.get("evidence", []):
        met = {True: "yes", False: "no", None: "not measured"}[e.get("met")]
        show = _num if e.get("unit") == "count" else _pct
        value, threshold = show(e.get("value")), show(e["threshold"])
        lines.append(f"    {e['signal']:<22} {value:>9}  {e['op']} {threshold:>7}  {met}")
    return lines


def render(job: dict[str, Any]) -> str:
    d = job["diagnosis"]
    out = [
        f"Job {job['job']}: {job['ranks_on_node']} rank(s) on this node, "
        f"{_num(job.get('tokens_per_second'))} tokens/s, MFU {_pct(job.get('mfu'))} "
        f"(window {job.get('window_seconds', 0):g} s)",
        f"  Verdict: {d['bottleneck'].replace('_', ' ')}. {d['summary'][0].upper()}{d['summary'][1:]}.",
        "  Evidence (signal, value, test, threshold, met):",
        *_evidence_lines(d),
    ]
    if job.get("goodput"):
        out.append(f"  Goodput: {job['goodput']['summary']}.")
    if d.get("findings"):
        out.append("  Also true: " + ", ".join(f.replace("_", " ") for f in d["findings"]) + ".")
    for note in d.get("notes") or []:
        out += textwrap.wrap(f"Note: {note}.", width=100, initial_indent="  ", subsequent_indent="    ")
    out += textwrap.wrap("Advice: " + d["advice"], width=100, initial_indent="  ", subsequent_indent="    ")
    out.append("  Ranks:")
    shown: tuple[list[str], object] = ([], None)  # the last memory section printed, and whose
    for r in job.get("ranks", []):
        gpus = (
            ", ".join(
                f"GPU {g['index']} {g['name']}"
                + (f" (shared with {', '.join(g['shared_with'])})" if g.get("shared_with") else "")
                for g in r.get("gpus", [])
            )
            or "no GPU known"
        )
        rates = r.get("rates", {})
        phases = rates.get("phase_ratios") or {}
        problem = r.get("peak_problem") or "no FLOPs per token reported"
        why = "" if r.get("mfu") is not None else f" (no MFU: {problem})"
        out.append(
            f"    rank {r['rank']} on {gpus}: {_num(rates.get('tokens_per_second'))} tokens/s, "
            f"step {_num(rates.get('step_time_seconds'), ' s')}, MFU {_pct(r.get('mfu'))}{why}, "
            f"data wait {_pct(phases.get('data_wait'))}, communication {_pct(phases.get('communication'))}, "
            f"straggler {_num(r.get('straggler_score'))} -> {r['diagnosis']['bottleneck'].replace('_', ' ')}"
        )
        memory = _memory_lines(r.get("memory"))
        if memory and memory == shown[0]:  # ranks of one job mostly match: say it once
            out.append(f"      memory: as rank {shown[1]}")
        else:
            out += memory
            shown = (memory, r["rank"])
    return "\n".join(out)


def _gib(x: object) -> str:
    return f"{x / 1024**3:.1f} GiB" if isinstance(x, int | float) else "n/a"


def _memory_lines(m: dict[str, Any] | None) -> list[str]:
    """A rank's allocator view, its estimate, the gap and the advice, when it reported any of them."""
    if not m:
        return []
    out = []
    o = m.get("observed")
    if o:
        out.append(
            f"      memory: {_gib(o.get('allocated_bytes'))} allocated "
            f"(peak {_gib(o.get('allocated_peak_bytes'))}), "
            f"{_gib(o.get('reserved_bytes'))} reserved (peak {_gib(o.get('reserved_peak_bytes'))}), "
            f"{_num(m.get('alloc_retries_total'))} allocation retries, {_num(m.get('ooms_total'))} OOMs"
        )
    e = m.get("estimate")
    if e:
        parts = " + ".join(f"{name.replace('_', ' ')} {_gib(b)}" for name, b in e["parts_bytes"].items())
        setup = f"ZeRO {e['zero_stage']}, " if e["kind"] == "train" else ""
        if e["kind"] == "train" and e.get("offload", "none") != "none":
            setup += f"{e['offload']} offloaded to the host, "
        out.append(
            f"      estimate ({setup}micro-batch {e['micro_batch']}): {_gib(e['total_bytes'])} = {parts}"
        )
    elif m.get("estimate_problem"):
        out.append(f"      no estimate: {m['estimate_problem']}")
    if m.get("gap"):
        out += textwrap.wrap(m["gap"], width=100, initial_indent="      ", subsequent_indent="        ")
    for line in m.get("advice") or []:
        out += textwrap.wrap("- " + line, width=100, initial_indent="      ", subsequent_indent="        ")
    return out
