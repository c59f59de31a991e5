"""What gpumon costs the Prometheus that scrapes it: a real Prometheus scraping many nodes' recorded
expositions for a bounded time, per exposition kind, beside dcgm-exporter's default set. Results go to
docs/performance.md ("Sizing the Prometheus"); the advice that follows from them to docs/deploy.md.

    python bench/bench_prom_sizing.py [--nodes 100] [--seconds 150] [--interval 1] [--json FILE]

1. Record: `gpumon serve --simulate 8xH100-SXM`, scraped in the text format once per sweep, 60 times, for
   each kind: the default exposition of an idle node and of a node running an 8-rank training job that
   reports through the SDK, `--compat dcgm` (gpumon's and dcgm-exporter's names), `--collect all` (every
   opt-in detail), and dcgm-exporter's default set (the 25 fields of its default counters file,
   tests/fixtures/dcgm-exporter/, cut from the compat exposition: the labels and values dcgm-exporter would
   give, no gpumon series).
2. Serve: one HTTP server answers every node: node K's n-th scrape gets recording (K + n) mod 60, so nodes
   differ and values move as they do on a node. Prometheus tells the nodes apart by a `node` target label
   (and the URL parameter `node`), so each has series of its own.
3. Scrape: Prometheus (the one on PATH) scrapes the N nodes every INTERVAL seconds for SECONDS. Then: head
   series, samples appended, its RSS (less the RSS of the same Prometheus with no targets), and, from a TSDB
   snapshot of the head (the admin API writes it as a compacted block), bytes per sample on disk.
4. Extrapolate to 1,000 and 10,000 nodes at a 15 s and 60 s scrape interval: head series and memory
   (bytes per head series as measured), samples per second, and disk per day (bytes per sample as measured).

Compaction needs samples: a short run over-counts bytes per sample (chunks hold 120 samples; a run of 150 s
at 1 s fills one), so the figure is an upper bound of what a long-lived Prometheus stores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.helpers import free_port, require_tool, start_daemon  # noqa: E402
from support.soak import footprint  # noqa: E402
from support.stack import Process, start  # noqa: E402

RECORDINGS = int(os.environ.get("GPUMON_SIZING_RECORDINGS", "60"))
JOB = ["--sim-job", "llama-70b:0-7"]  # an 8-rank training job reporting through the SDK
KINDS = {
    "gpumon default, idle node": [],
    "gpumon default, 8-rank job": JOB,
    "gpumon --compat dcgm, idle": ["--compat", "dcgm"],
    "gpumon --collect all, idle": ["--collect", "all"],
}
COMPAT = "gpumon --compat dcgm, idle"
DCGM = "dcgm-exporter default"


def dcgm_default_fields() -> set[str]:
    rows = (ROOT / "tests" / "fixtures" / "dcgm-exporter" / "default-counters.csv").read_text().splitlines()
    return {
        r.split(",")[0].strip() for r in rows if r.strip() and not r.startswith("#") and ", label" not in r
    }


def only(body: str, names: set[str]) -> str:
    """The families of ``body`` named in ``names`` (HELP, TYPE and samples)."""
    out = []
    for line in body.splitlines():
        name = line.split()[2] if line.startswith("#") else re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in names:
            out.append(line)
    return "\n".join(out) + "\n"


def record(args: list[str], interval: float) -> list[str]:
    d = start_daemon("--simulate", "8xH100-SXM", "--sim-unreported-jobs", "--interval", f"{interval}s", *args)
    try:
        time.sleep(3 * interval + 2)  # GPM pairs, the event watcher, the job's first reports
        bodies = []
        for _ in range(RECORDINGS):
            bodies.append(d.get("/metrics", headers={"Accept": "text/plain;version=0.0.4"}).text)
            time.sleep(interval)
        return bodies
    finally:
        d.stop()


def series_of(body: str) -> int:
    return sum(1 for ln in body.splitlines() if ln and not ln.startswith("#"))


class Nodes(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies
        self.scrapes: Counter[str] = Counter()
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", free_port()), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Nodes

    def do_GET(self) -> None:
        node = parse_qs(urlparse(self.path).query).get("node", ["0"])[0]
        with self.server.lock:
            n = self.server.scrapes[node]
            self.server.scrapes[node] += 1
        body = self.server.bodies[(int(node) + n) % len(self.server.bodies)]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def prometheus(config: dict[str, Any], work: Path) -> Process:
    """Prometheus on a free loopback port with its admin API (for the TSDB snapshot), ready on return."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    args = [
        require_tool("prometheus"),
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-admin-api",
    ]
    return start("prometheus", args, f"http://127.0.0.1:{port}", "/-/ready", work)


def own_metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def baseline_rss(work: Path, seconds: float) -> int:
    prom = prometheus({"global": {"scrape_interval": "1s"}, "scrape_configs": []}, work)
    try:
        time.sleep(seconds)
        return footprint(prom.proc.pid).rss_bytes
    finally:
        prom.stop()


def measure(bodies: list[str], nodes: int, seconds: float, interval: float, work: Path) -> dict[str, float]:
    server = Nodes([b.encode() for b in bodies])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_address[1]}"
    config = {
        "global": {
            "scrape_interval": f"{round(interval * 1000)}ms",
            "scrape_timeout": f"{round(interval * 1000)}ms",
        },
        "scrape_configs": [
            {
                "job_name": "gpumon",
                "static_configs": [
                    {"targets": [target], "labels": {"node": f"node-{k}", "__param_node": str(k)}}
                    for k in range(nodes)
                ],
            }
        ],
    }
    prom = prometheus(config, work)
    url = prom.url
    try:
        time.sleep(seconds)
        head = own_metric(url, "prometheus_tsdb_head_series")
        appended = own_metric(url, "prometheus_tsdb_head_samples_appended_total")
        memory = footprint(prom.proc.pid).rss_bytes
        snap = httpx.post(url + "/api/v1/admin/tsdb/snapshot", timeout=120).json()["data"]["name"]
        blocks = [p for p in (work / "data" / "snapshots" / snap).iterdir() if p.is_dir()]
        samples = sum(json.loads((b / "meta.json").read_text())["stats"]["numSamples"] for b in blocks)
        size = sum(f.stat().st_size for b in blocks for f in b.rglob("*") if f.is_file())
        chunks = sum(f.stat().st_size for b in blocks for f in (b / "chunks").iterdir())
        return {
            "head_series": head,
            "samples_appended": appended,
            "rss_bytes": memory,
            "block_samples": samples,
            "block_bytes": size,
            "chunk_bytes": chunks,
            "scrapes": sum(server.scrapes.values()),
            "scrapes_expected": nodes * seconds / interval,
        }
    finally:
        prom.stop()
        server.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=100, help="simulated nodes Prometheus scrapes (100)")
    p.add_argument("--seconds", type=float, default=150.0, help="how long it scrapes each kind (150)")
    p.add_argument("--interval", type=float, default=1.0, help="scrape interval in seconds (1)")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()

    bodies: dict[str, list[str]] = {}
    for kind, flags in KINDS.items():
        print(f"recording {kind} ...", flush=True)
        bodies[kind] = record(flags, 0.5)
    bodies[DCGM] = [only(b, dcgm_default_fields()) for b in bodies[COMPAT]]

    results: dict[str, Any] = {"nodes": args.nodes, "seconds": args.seconds, "interval": args.interval}
    with tempfile.TemporaryDirectory() as tmp:
        results["baseline_rss_bytes"] = baseline_rss(Path(tmp) / "baseline", min(args.seconds, 30))
        for kind in (DCGM, *KINDS):
            print(f"scraping {args.nodes} nodes of {kind} for {args.seconds:.0f} s ...", flush=True)
            work = Path(tmp) / re.sub(r"\W+", "-", kind)
            work.mkdir()
            r = measure(bodies[kind], args.nodes, args.seconds, args.interval, work)
            r["series_per_node"] = sum(series_of(b) for b in bodies[kind]) / len(bodies[kind])
            r["bytes_per_scrape"] = sum(len(b) for b in bodies[kind]) / len(bodies[kind])
            results[kind] = r
            print(json.dumps(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print_table(results)


def print_table(res: dict[str, Any]) -> None:
    base = res["baseline_rss_bytes"]
    print(f"\n{res['nodes']} nodes x 8 H100, scraped every {res['interval']:g} s for {res['seconds']:.0f} s")
    head = "| exposition | series/node | scrapes done | head series | RSS over idle | bytes/head series |"
    print(head + " bytes/sample |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in (DCGM, *KINDS):
        r = res[kind]
        per_series = (r["rss_bytes"] - base) / r["head_series"]
        per_sample = r["chunk_bytes"] / r["block_samples"]
        print(
            f"| {kind} | {r['series_per_node']:.0f} | {r['scrapes'] / r['scrapes_expected']:.0%} | "
            f"{r['head_series']:.0f} | "
            f"{(r['rss_bytes'] - base) / 2**20:.0f} MiB | {per_series:.0f} | {per_sample:.2f} |"
        )
    print(
        "\nExtrapolated: head memory at the measured bytes per series, disk at the measured bytes per sample"
    )
    print("| exposition | nodes | series | memory | samples/s at 15 s | disk/day at 15 s | at 60 s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in (DCGM, *KINDS):
        r = res[kind]
        per_series = (r["rss_bytes"] - base) / r["head_series"]
        per_sample = r["chunk_bytes"] / r["block_samples"]
        for n in (1_000, 10_000):
            series = r["series_per_node"] * n
            day15 = series / 15 * 86400 * per_sample
            print(
                f"| {kind} | {n:,} | {series / 1e6:.2f} M | {series * per_series / 2**30:.1f} GiB | "
                f"{series / 15:,.0f} | {day15 / 2**30:.1f} GiB | {day15 / 4 / 2**30:.1f} GiB |"
            )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
