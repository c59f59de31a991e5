"""ECC and row remapping."""

from __future__ import annotations

from gpumon.metrics.registry import GPU, metric, section

section("Memory errors")
ECC = metric(
    "gpumon_gpu_ecc_errors_total",
    "counter",
    "ECC errors since the driver loaded (type=corrected or uncorrected). Absent until it first rises (0 "
    "first, so increase() sees it), or at once where the driver counted some before.",
    (*GPU, "type"),
    source="fields NVML_FI_DEV_ECC_{SBE,DBE}_VOL_TOTAL, else nvmlDeviceGetTotalEccErrors(…, VOLATILE)",
)
ECC_LIFETIME = metric(
    "gpumon_gpu_ecc_lifetime_errors_total",
    "counter",
    "ECC errors over the GPU's lifetime (type=corrected or uncorrected).",
    (*GPU, "type"),
    source="fields NVML_FI_DEV_ECC_{SBE,DBE}_AGG_TOTAL, else nvmlDeviceGetTotalEccErrors(…, AGGREGATE)",
    detail="ecc-lifetime",
)
REMAPPED = metric(
    "gpumon_gpu_remapped_rows_total",
    "counter",
    "HBM rows remapped to spares, by the type of error that caused it (corrected or uncorrected). Absent "
    "until it first rises, as gpumon_gpu_ecc_errors_total.",
    (*GPU, "type"),
    source="fields NVML_FI_DEV_REMAPPED_*, else nvmlDeviceGetRemappedRows",
)
REMAP_PENDING = metric(
    "gpumon_gpu_row_remap_pending",
    "gauge",
    "1 if a row remap waits for a GPU reset.",
    source="fields NVML_FI_DEV_REMAPPED_*, else nvmlDeviceGetRemappedRows",
    field="row_remap_pending",
)
REMAP_FAILURE = metric(
    "gpumon_gpu_row_remap_failure",
    "gauge",
    "1 if a row remap failed (the GPU needs service).",
    source="fields NVML_FI_DEV_REMAPPED_*, else nvmlDeviceGetRemappedRows",
    field="row_remap_failure",
)
