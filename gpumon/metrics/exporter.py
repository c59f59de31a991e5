"""The exporter itself: build, driver, sampling, per-collector health, errors."""

from __future__ import annotations

from gpumon.metrics.registry import metric, section

section("Exporter")
BUILD_INFO = metric(
    "gpumon_build_info",
    "gauge",
    "gpumon version and the GPU backend in use (backend sim: simulated GPUs; replay: a recorded capture).",
    ("version", "python_version", "backend"),
    source="constant 1",
)
DRIVER_INFO = metric(
    "gpumon_driver_info",
    "gauge",
    "NVIDIA driver, CUDA driver API and NVML versions.",
    ("driver_version", "cuda_driver_version", "nvml_version"),
    source="nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion, nvmlSystemGetNVMLVersion",
)
NODE_INFO = metric(
    "gpumon_node_info",
    "gauge",
    "The node this daemon runs on (--node-name, else NODE_NAME, else the host name); 1. Dashboards map "
    "node names to scrape instances through it.",
    ("node",),
    source="constant 1",
)
DEVICE_COUNT = metric(
    "gpumon_nvml_devices",
    "gauge",
    "GPUs the driver reports, whether or not gpumon could identify them (compare with count(gpumon_gpu_up)).",
    (),
    source="nvmlDeviceGetCount",
)
SAMPLE_INTERVAL = metric(
    "gpumon_sample_interval_seconds", "gauge", "Configured time between sampling sweeps.", (), "seconds"
)
LAST_SAMPLE = metric(
    "gpumon_last_sample_timestamp_seconds",
    "gauge",
    "Unix time the latest sampling sweep finished.",
    (),
    "seconds",
)
SAMPLES = metric("gpumon_samples_total", "counter", "Sampling sweeps completed since start.", ())
COLLECTOR_SUCCESS = metric(
    "gpumon_collector_success",
    "gauge",
    "Whether the collector's last run succeeded (per-GPU health is in gpumon_gpu_up).",
    ("collector",),
)
COLLECTOR_DURATION = metric(
    "gpumon_collector_duration_seconds",
    "gauge",
    "Wall time of the collector's last run (for gpu: all GPUs in parallel, up to the deadline).",
    ("collector",),
    "seconds",
)
ERRORS = metric(
    "gpumon_errors_total",
    "counter",
    "Failed operations by GPU, NVML call and error kind "
    "(an NVML error name, deadline_exceeded for a call that hung past its deadline, late for a read slowed "
    "by the daemon itself (op=read; the GPU keeps its last reading), or exception).",
    ("gpu", "uuid", "op", "error"),
)
HTTP_CONNECTIONS = metric(
    "gpumon_http_connections",
    "gauge",
    "HTTP connections open now, on the TCP listener and the unix ingest socket together.",
    (),
)
HTTP_CONNECTIONS_LIMIT = metric(
    "gpumon_http_connections_limit",
    "gauge",
    "Open connections allowed: --max-connections on the TCP listener, as many again on the unix ingest "
    "socket, each apart (lowered to leave the daemon file descriptors of its own); past a listener's cap "
    "its newest idle connection is closed, else the one slowest to send its request.",
    (),
)
HTTP_CONNECTIONS_CLOSED = metric(
    "gpumon_http_connections_closed_total",
    "counter",
    "Connections the daemon closed by force: header_timeout (request headers not in within "
    "--header-timeout), request_timeout (the whole request not in within --request-timeout), write_timeout "
    "(the client read none of an answer for --request-timeout), header_too_large (a request head over 64 "
    "KiB, answered 431), pipeline (more than 16 requests sent ahead of their answers), shed (idle or not "
    "reading, closed to make room at the connection limit).",
    ("reason",),
)
HTTP_REQUESTS_REFUSED = metric(
    "gpumon_http_requests_refused_total",
    "counter",
    "Requests not served: bad_request (not HTTP, answered 400; logged at most once a minute), "
    "passwords_busy (the basic-auth password checks waiting were at their limit, answered 503), "
    "too_many_names (/metrics?name[] naming more series than allowed, answered 400), selections_busy "
    "(the /metrics?name[] scrapes waiting were at their limit, answered 503), abandoned (the "
    "client had gone before its password check or render began, which were then not done).",
    ("reason",),
)
