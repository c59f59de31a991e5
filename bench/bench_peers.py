"""gpumon against a peer, side by side in one run: nvitop-exporter (PyPI), on the same fake NVML.

    python bench/bench_peers.py [--seconds 15] [--scrapes 300] [--trials 100] [--calls 200000] [--rounds 15]
                                [--json FILE]

About 6 minutes with the defaults. Results go to docs/performance.md ("Against a peer").

Both exporters run as they ship, each in its own process (so its CPU is its own), on loopback, sampling 8
simulated H100s every 1 s through the same simulator (``SimNvml("8xH100-SXM", static=True)``) with the same
per-call latencies, one after the other (never at the same time: they would share the 2 cores):
  1. sampling: process CPU per sweep and per wall second while nothing scrapes, the sweep's wall time
     (gpumon: ``Sampler.sweep`` and its "gpu" collector, what gpumon_collector_duration_seconds reports;
     nvitop-exporter: one pass of its ``collect`` loop, ``update_host`` then ``update_device`` per GPU), and
     the NVML calls each makes per sweep; with three latency profiles: none (CPU alone), 1 ms per call, and
     1 ms per call with ``nvmlDeviceGetPcieThroughput`` blocking 20 ms, as the real call does;
  2. /metrics over real HTTP: p50/p90/p99 of back-to-back scrapes, the exposition's bytes and series, CPU per
     scrape;
  3. freshness: a GPU's temperature is changed in the exporter's own simulator (at a random moment) and
     /metrics is polled until it shows the new value;
  4. the training SDK's hot path: ``Reporter.step`` against a bare prometheus_client ``Counter.inc()`` and
     Lightning's ``Throughput.update`` (when lightning imports), timeit in interleaved rounds.

How nvitop-exporter is put on the simulator (the shim, ``nvml_shim``): nvitop imports ``pynvml`` and reads
it as a module (``from pynvml import *``, ``vars(pynvml)``), so the worker installs a real module object as
``sys.modules["pynvml"]`` before nvitop is imported: nvidia-ml-py's constants, structures and exceptions,
with every NVML function the simulator implements bound to the simulator. Two things differ from a host:
  - nvitop re-implements five calls (memory info, temperature, field values, driver model, running
    processes) over ``pynvml._nvmlGetFunctionPointer``, the C symbol lookup, which a simulator cannot
    serve. The shim leaves that name out, so nvitop takes its own fallback (it logs that nvidia-ml-py looks
    "corrupted") and calls the nvidia-ml-py functions of the same names, which the simulator serves. Same
    number of NVML calls either way.
  - NVML functions the simulator lacks answer NOT_SUPPORTED, as a driver does for an unsupported query,
    after paying the profile's per-call latency like any call. Which ones nvitop called is reported
    ("missing"); the simulator is not changed.
The simulator runs inside each exporter's process, so its own cost per call is in both CPU figures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import inspect
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import timeit
import types
from collections.abc import Callable
from datetime import date
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC = "8xH100-SXM"
INTERVAL = 1.0
PROFILES: dict[str, dict[str, float]] = {
    "zero": {},
    "1ms": {"*": 0.001},
    "realistic": {"*": 0.001, "nvmlDeviceGetPcieThroughput": 0.020},
}
# what each exporter calls a GPU's temperature, and how it labels the GPU
TEMPERATURE = {"gpumon": ("gpumon_gpu_temperature_celsius", "gpu"), "nvitop": ("gpu_temperature_C", "index")}
EXPORTERS = ("gpumon", "nvitop")


# -- the fake NVML, shared by both workers ---------------------------------------------------------------


class CountingLatency(dict[str, float]):
    """``Faults.latency`` that also counts the calls: the simulator looks every call's latency up here once
    (plus once for the "*" default), so this sees each NVML call by name without wrapping any function."""

    def __init__(self, latency: dict[str, float]) -> None:
        super().__init__(latency)
        self.calls: collections.Counter[str] = collections.Counter()

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        if key != "*":
            self.calls[key] += 1
        return dict.get(self, key, default)


def make_sim(profile: str) -> Any:
    from gpumon.gpu.sim import SimNvml

    sim = SimNvml(SPEC, seed=1, static=True)
    sim.faults.latency = CountingLatency(PROFILES[profile])
    return sim


def reaches_driver(fn: Callable[..., Any], namespace: dict[str, Any], seen: set[str] | None = None) -> bool:
    """Whether an nvidia-ml-py function calls into libnvidia-ml (directly or through other nvml*
    functions), as opposed to a pure-Python helper such as nvmlStructToFriendlyObject."""
    seen = set() if seen is None else seen
    code = inspect.unwrap(fn).__code__
    if "_nvmlGetFunctionPointer" in code.co_names:
        return True
    for name in code.co_names:
        other = namespace.get(name)
        if name.startswith("nvml") and name not in seen and inspect.isfunction(other):
            seen.add(name)
            if reaches_driver(other, namespace, seen):
                return True
    return False


def nvml_shim(sim: Any, missing: collections.Counter[str]) -> types.ModuleType:
    """A ``pynvml`` module whose NVML functions are the simulator's (see the module docstring)."""
    import pynvml

    from gpumon.gpu.sim.device import SimGpu

    real = vars(pynvml)
    shim = types.ModuleType("pynvml", pynvml.__doc__)

    def unsupported(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            missing[name] += 1
            gpu = args[0].index if args and isinstance(args[0], SimGpu) else None
            sim.faults.check(name, gpu)  # a driver round trip like any other: same latency
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        call.__name__ = name
        return call

    for name, value in real.items():
        if name.startswith("__") or name == "_nvmlGetFunctionPointer":
            continue
        if name.startswith("nvml") and inspect.isfunction(value):
            if hasattr(type(sim), name):
                value = getattr(sim, name)
            elif reaches_driver(value, real):
                value = unsupported(name)
        setattr(shim, name, value)
    return shim


# -- the workers: one exporter each, driven over stdin/stdout --------------------------------------------


class Recorder:
    """Sweep timings, handed to the parent and reset on each "stats"."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sweeps = 0
        self.durations: list[tuple[float, float]] = []  # (whole sweep, its GPU part) in seconds

    def add(self, whole: float, gpu: float) -> None:
        with self.lock:
            self.sweeps += 1
            self.durations.append((whole, gpu))

    def take(self) -> tuple[int, list[tuple[float, float]]]:
        with self.lock:
            out, self.durations = self.durations, []
            return self.sweeps, out


def control(sim: Any, rec: Recorder, missing: collections.Counter[str], proto: Any, cleanup: Any) -> None:
    """Answers the parent: "stats" (CPU, sweeps, timings, NVML calls), "set" (a GPU's temperature), "quit"."""
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "stats":
            sweeps, durations = rec.take()
            calls = dict(sim.faults.latency.calls)
            sim.faults.latency.calls.clear()
            gaps = dict(missing)
            missing.clear()
            reply = {
                "cpu": time.process_time(),  # every thread of the process, nanosecond resolution
                "wall": time.monotonic(),
                "sweeps": sweeps,
                "durations": durations,
                "calls": calls,
                "missing": gaps,
            }
        elif cmd["cmd"] == "set":
            gpu = sim.gpus[cmd["gpu"]]
            with gpu.lock:
                gpu.state.temp_c = float(cmd["value"])
            reply = {"t": time.monotonic()}  # CLOCK_MONOTONIC: the same clock in the parent
        else:
            break
        proto.write(json.dumps(reply) + "\n")
        proto.flush()
    cleanup()
    os._exit(0)


def protocol_stream() -> Any:
    """The original stdout, for replies only; fd 1 then goes to stderr, so nothing an exporter prints can
    corrupt a reply."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return proto


def run_gpumon(profile: str, port: int) -> None:
    """``gpumon serve`` itself (gpumon.cli.main), with the simulator swapped for the shared static one."""
    proto = protocol_stream()
    import gpumon.cli.common as common
    import gpumon.cli.serve as serve
    from gpumon.cli import main
    from gpumon.gpu.nvml import NvmlBackend

    sim = make_sim(profile)
    rec = Recorder()
    common.simulated_backend = lambda spec, settings, wrap=None: NvmlBackend(sim)  # type: ignore[assignment]
    opened = serve.open_sampler

    def open_sampler(*args: Any, **kwargs: Any) -> Any:
        sampler = opened(*args, **kwargs)
        sweep = sampler.sweep

        def timed() -> Any:
            t0 = time.perf_counter()
            snap = sweep()
            gpu = next(c.duration_seconds for c in snap.collectors if c.name == "gpu")
            rec.add(time.perf_counter() - t0, gpu)
            return snap

        sampler.sweep = timed  # type: ignore[method-assign]  # the sampling thread calls self.sweep()
        return sampler

    serve.open_sampler = open_sampler  # type: ignore[assignment]
    args: tuple[Any, ...] = (sim, rec, collections.Counter(), proto, sim.remove_proc_root)
    threading.Thread(target=control, args=args, daemon=True).start()
    listen = f"127.0.0.1:{port}"
    main(
        [
            "serve",
            "--simulate",
            SPEC,
            "--sim-unreported-jobs",
            "--listen",
            listen,
            "--interval",
            "1s",
            "--log-level",
            "warning",
        ]
    )


def run_nvitop(profile: str, port: int) -> None:
    """``nvitop-exporter``'s own main(), on the shim; its collect loop is timed (same loop, same sleep)."""
    proto = protocol_stream()
    sim = make_sim(profile)
    missing: collections.Counter[str] = collections.Counter()
    sys.modules["pynvml"] = nvml_shim(sim, missing)  # before nvitop is imported
    from nvitop_exporter import cli
    from nvitop_exporter.exporter import PrometheusExporter

    rec = Recorder()

    def collect(self: PrometheusExporter) -> None:  # PrometheusExporter.collect with two clock reads added
        while True:
            next_update_time = time.monotonic() + self.interval
            t0 = time.perf_counter()
            self.update_host()
            t1 = time.perf_counter()
            for device in self.devices:
                self.update_device(device)
            t2 = time.perf_counter()
            rec.add(t2 - t0, t2 - t1)
            time.sleep(max(0.0, next_update_time - time.monotonic()))

    PrometheusExporter.collect = collect  # type: ignore[method-assign]
    threading.Thread(target=control, args=(sim, rec, missing, proto, lambda: None), daemon=True).start()
    sys.argv = ["nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"]
    sys.argv += ["--hostname", "bench"]  # the default looks up this host's IP address
    cli.main()


# -- the parent: start a worker, measure it ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Worker:
    def __init__(self, exporter: str, profile: str) -> None:
        import httpx

        self.exporter = exporter
        self.port = free_port()
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115  # the worker's stderr, closed in close()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMON_")}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", exporter, "--profile", profile, "--port", str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            cwd=ROOT,
            env={**env, "PYTHONPATH": str(ROOT)},
        )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.exporter} worker died:\n{self.stderr_tail()}")
        return dict(json.loads(line))

    def stderr_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]

    def wait_ready(self) -> None:
        """Until /metrics shows the last GPU's temperature: both exporters have swept once."""
        name, label = TEMPERATURE[self.exporter]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.exporter} worker exited:\n{self.stderr_tail()}")
            try:
                if read_value(self.client, name, label, 7) is not None:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.exporter} never became ready:\n{self.stderr_tail()}")

    def close(self) -> None:
        self.client.close()
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):  # already gone
            self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def read_value(client: Any, name: str, label: str, gpu: int) -> float | None:
    """One GPU's value of one family, through /metrics?name[]= (both exporters filter server-side)."""
    r = client.get("/metrics", params={"name[]": name}, headers={"Accept-Encoding": "identity"})
    m = re.search(rf'^{name}{{[^}}]*\b{label}="{gpu}"[^}}]*}} (\S+)$', r.text, re.M)
    return float(m.group(1)) if m else None


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def sampling(w: Worker, seconds: float) -> dict[str, Any]:
    """CPU and sweep times over ``seconds`` with nothing scraping."""
    w.ask(cmd="stats")
    a = w.ask(cmd="stats")
    time.sleep(seconds)
    b = w.ask(cmd="stats")
    sweeps = b["sweeps"] - a["sweeps"]
    cpu, wall = b["cpu"] - a["cpu"], b["wall"] - a["wall"]
    whole = [d[0] for d in b["durations"]]
    gpu = [d[1] for d in b["durations"]]
    return {
        "sweeps": sweeps,
        "cpu_percent_of_core": 100 * cpu / wall,
        "cpu_ms_per_sweep": 1000 * cpu / max(1, sweeps),
        "sweep_p50_ms": 1000 * statistics.median(whole),
        "sweep_p90_ms": 1000 * pct(whole, 0.9),
        "sweep_max_ms": 1000 * max(whole),
        "gpu_part_p50_ms": 1000 * statistics.median(gpu),
        "nvml_calls_per_sweep": round(sum(b["calls"].values()) / max(1, sweeps), 1),
        "calls_by_function_per_sweep": {
            k: round(v / max(1, sweeps), 2) for k, v in sorted(b["calls"].items())
        },
        "missing_in_simulator": sorted(b["missing"]),
        "cpu_rate": cpu / wall,
    }


def scraping(w: Worker, scrapes: int, cpu_rate: float) -> dict[str, Any]:
    """Back-to-back scrapes, plain text as Prometheus asks for it; the worker's CPU per scrape net of its
    sampling."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Accept-Encoding": "identity"}
    for _ in range(20):
        w.client.get("/metrics", headers=headers)
    a = w.ask(cmd="stats")
    times = []
    for _ in range(scrapes):
        t0 = time.perf_counter()
        r = w.client.get("/metrics", headers=headers)
        times.append(time.perf_counter() - t0)
        r.raise_for_status()
    b = w.ask(cmd="stats")
    net_cpu = (b["cpu"] - a["cpu"]) - cpu_rate * (b["wall"] - a["wall"])
    body = w.client.get("/metrics", headers=headers).text
    gz = w.client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    families = list(text_string_to_metric_families(body))
    series = sum(len(f.samples) for f in families)
    gpu_label = TEMPERATURE[w.exporter][1]
    return {
        "p50_ms": 1000 * statistics.median(times),
        "p90_ms": 1000 * pct(times, 0.9),
        "p99_ms": 1000 * pct(times, 0.99),
        "cpu_ms_per_scrape": 1000 * net_cpu / scrapes,
        "cpu_us_per_series": 1e6 * net_cpu / scrapes / series,
        "bytes": len(body.encode()),
        "bytes_gzip": gz.num_bytes_downloaded if gz.headers.get("content-encoding") == "gzip" else None,
        "series": series,
        # the exporters export different things: per-GPU series are the comparable part
        "gpu_series": sum(1 for f in families for s in f.samples if gpu_label in s.labels),
        "families": len(families),
    }


def freshness(w: Worker, trials: int, rng: random.Random) -> dict[str, Any]:
    """A GPU's temperature changes at a random moment; how long until a scrape shows it."""
    name, label = TEMPERATURE[w.exporter]
    delays = []
    for trial in range(trials):
        gpu = rng.randrange(8)
        value = float(40 + trial % 40)
        time.sleep(rng.uniform(0.0, INTERVAL))  # a random phase of the sweep cycle
        changed = w.ask(cmd="set", gpu=gpu, value=value)["t"]
        while True:
            seen = read_value(w.client, name, label, gpu)
            now = time.monotonic()
            if seen == value:
                delays.append(now - changed)
                break
            if now - changed > 10 * INTERVAL:
                raise RuntimeError(f"{w.exporter}: GPU {gpu}'s new temperature never appeared")
            time.sleep(0.002)
    return {
        "trials": trials,
        "p50_s": statistics.median(delays),
        "p99_s": pct(delays, 0.99),
        "max_s": max(delays),
        "min_s": min(delays),
    }


def peers(seconds: float, scrapes: int, trials: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, profile in enumerate(PROFILES):
        order = EXPORTERS if i % 2 == 0 else EXPORTERS[::-1]  # alternate who goes first: drift hits both
        for exporter in order:
            print(f"[{profile}] {exporter} ...", file=sys.stderr, flush=True)
            w = Worker(exporter, profile)
            try:
                time.sleep(3.0)  # past first-sweep work (nvitop's first NVLink read sleeps 20 ms a GPU)
                res: dict[str, Any] = {"sampling": sampling(w, seconds)}
                res["metrics"] = scraping(w, scrapes, res["sampling"].pop("cpu_rate"))
                if profile == "1ms":
                    # the same random phases for both exporters: the trials are paired
                    res["freshness"] = freshness(w, trials, random.Random(7))
            finally:
                w.close()
            out.setdefault(profile, {})[exporter] = res
    return out


# -- the SDK's hot path against its peers ----------------------------------------------------------------


def sdk(calls: int, rounds: int) -> dict[str, Any]:
    import itertools
    import logging

    from prometheus_client import CollectorRegistry, Counter

    from gpumon.client import Reporter

    logging.getLogger("gpumon.client").setLevel(logging.ERROR)  # the dead daemon's warning is expected
    ns: dict[str, Any] = {
        "counter": Counter("bench_total", "bench", registry=CollectorRegistry()),
        "reporter": Reporter(url=f"http://127.0.0.1:{free_port()}", job="bench", interval=1.0),
        "perf_counter": time.perf_counter,
    }
    cases = {
        "counter_inc": ("counter.inc()", ""),
        "reporter_step": ("reporter.step(tokens=4096, samples=8)", ""),
    }
    try:
        from lightning.fabric.utilities.throughput import Throughput

        ns["Throughput"] = Throughput
        ns["itertools"] = itertools
        # Throughput takes cumulative counts and elapsed time, so a training loop keeps them and reads the
        # clock itself; "bookkeeping" is that part alone, to tell it from update()'s own cost
        setup = "tp = Throughput(); c = itertools.count(1); t0 = perf_counter()"
        cases["lightning_update"] = (
            "i = next(c); tp.update(time=perf_counter() - t0, batches=i, samples=8 * i, lengths=4096 * i)",
            setup,
        )
        cases["lightning_bookkeeping"] = ("i = next(c); perf_counter() - t0; 8 * i; 4096 * i", setup)
        lightning = version("lightning")
    except ImportError as exc:
        lightning = f"not importable: {exc}"
    # Rounds, each timing every case once: a noisy neighbour hits all cases alike, and each round gives a
    # paired ratio whose median survives a slow drift in the machine's load better than a ratio of bests.
    per_round: dict[str, list[float]] = {key: [] for key in cases}
    for _ in range(rounds):
        for key, (stmt, setup) in cases.items():
            elapsed = timeit.timeit(stmt, setup=setup or "pass", globals=ns, number=calls)
            per_round[key].append(elapsed / calls * 1e9)
    best = {key: min(v) for key, v in per_round.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(per_round[a], per_round[b], strict=True))

    ns["reporter"].close(timeout=0.5)
    out: dict[str, Any] = {"calls": calls, "best_of": rounds, "lightning": lightning}
    out["ns_per_call"] = best
    out["step_over_inc"] = best["reporter_step"] / best["counter_inc"]
    out["step_over_inc_paired_median"] = paired("reporter_step", "counter_inc")
    if "lightning_update" in best:
        out["step_over_lightning_update"] = best["reporter_step"] / best["lightning_update"]
        out["step_over_lightning_update_paired_median"] = paired("reporter_step", "lightning_update")
        net = best["lightning_update"] - best["lightning_bookkeeping"]
        out["lightning_update_net_ns"] = net
        out["step_over_lightning_update_net"] = best["reporter_step"] / net
    return out


# -- report ----------------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    out = {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "date": date.today().isoformat(),
    }
    for pkg in ("nvitop", "nvitop-exporter", "prometheus-client", "nvidia-ml-py", "uvicorn", "psutil"):
        out[pkg] = version(pkg)
    for pkg in ("lightning", "torch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def summary(results: dict[str, Any]) -> str:
    lines = []
    for profile, pair in results["peers"].items():
        g, n = pair["gpumon"], pair["nvitop"]
        for section in ("sampling", "metrics", "freshness"):
            if section not in g:
                continue
            for key, gv in g[section].items():
                nv = n[section].get(key)
                if isinstance(gv, int | float) and isinstance(nv, int | float):
                    ratio = f"{gv / nv:.2f}" if nv else "-"
                    lines.append(f"{profile:>9} {section:>9} {key:<24} {gv:10.3f} {nv:10.3f}  x{ratio}")
    s = results["sdk"]
    lines.append(f"sdk ns/call {json.dumps({k: round(v, 1) for k, v in s['ns_per_call'].items()})}")
    lines.append(
        f"sdk step/inc {s['step_over_inc']:.2f} "
        f"(paired median {s['step_over_inc_paired_median']:.2f}; target <= 2)"
    )
    if "step_over_lightning_update" in s:
        lines.append(
            f"sdk step/lightning update {s['step_over_lightning_update']:.2f} "
            f"(net of bookkeeping {s['step_over_lightning_update_net']:.2f})"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15.0, help="sampling window per exporter and profile")
    p.add_argument("--scrapes", type=int, default=300, help="back-to-back /metrics requests per exporter")
    p.add_argument("--trials", type=int, default=100, help="freshness trials per exporter")
    p.add_argument("--calls", type=int, default=200_000, help="SDK: calls per timeit repeat")
    p.add_argument("--rounds", type=int, default=15, help="SDK: rounds, each timing every case once")
    p.add_argument("--json", type=Path, help="also write the raw results here")
    p.add_argument("--worker", choices=EXPORTERS, help=argparse.SUPPRESS)
    p.add_argument("--profile", choices=list(PROFILES), default="1ms", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        (run_gpumon if args.worker == "gpumon" else run_nvitop)(args.profile, args.port)
        return

    started = time.monotonic()
    results: dict[str, Any] = {"machine": machine()}
    results["sdk"] = sdk(args.calls, args.rounds)
    results["peers"] = peers(args.seconds, args.scrapes, args.trials)
    results["total_seconds"] = time.monotonic() - started
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(summary(results), file=sys.stderr)


if __name__ == "__main__":
    main()
