"""NVML events: XID errors, ECC events, page retirement, GPU unavailable."""

from __future__ import annotations

from gpumon.metrics.registry import GPU, metric, section

section("Events and XID errors")
EVENTS = metric(
    "gpumon_gpu_events_total",
    "counter",
    "NVML events received by type; 0 from registration on, so the first event is an increase. By default "
    "only event=xid (every serious event comes with an XID); with --collect event-types every type "
    "(ecc_single_bit, ecc_double_bit, page_retirement, gpu_unavailable, ...).",
    (*GPU, "event"),
    source="nvmlEventSetWait_v2 (watcher thread)",
)
EVENT_LAST = metric(
    "gpumon_gpu_last_event_timestamp_seconds",
    "gauge",
    "Unix time the latest event of this type arrived (by default only event=xid, as above).",
    (*GPU, "event"),
    "seconds",
    source="nvmlEventSetWait_v2",
)
XID_ERRORS = metric(
    "gpumon_gpu_xid_errors_total",
    "counter",
    "XID errors by code since gpumon started (a series appears with the first XID of that code; "
    "gpumon_gpu_events_total{event=xid} counts them all from 0).",
    (*GPU, "xid"),
    source="nvmlEventTypeXidCriticalError .eventData",
)
XID_LAST = metric(
    "gpumon_gpu_xid_last_timestamp_seconds",
    "gauge",
    "Unix time of the latest XID of this code.",
    (*GPU, "xid"),
    "seconds",
    source="nvmlEventTypeXidCriticalError",
)
XID_INFO = metric(
    "gpumon_xid_info",
    "gauge",
    "What an XID code seen on this node means (join on xid for alert text): severity, cause, action.",
    ("xid", "description", "severity", "cause", "action"),
    source="gpumon XID catalogue (docs/xid.md)",
)
EVENTS_REGISTERED = metric(
    "gpumon_gpu_events_registered",
    "gauge",
    "1 for each event type the watcher listens to on this GPU (absent: the GPU does not support events).",
    (*GPU, "event"),
    source="nvmlDeviceGetSupportedEventTypes, nvmlDeviceRegisterEvents",
    detail="event-types",
)
