"""The node dashboard's health sections: errors and XIDs, processes and owners, profiling counters, host."""

from __future__ import annotations

from gpumon.dashboards.builder import Panel, Row, Target
from gpumon.dashboards.panels import (
    BYTES,
    BYTES_PER_S,
    COUNT,
    NONE,
    PER_SECOND,
    RATIO,
    stat,
    state_timeline,
    table,
    timeseries,
)
from gpumon.dashboards.variables import sel

NODE = 'job=~"$job",instance=~"$instance"'
GPU = NODE + ',gpu=~"$gpu"'
EACH = "{{instance}} GPU {{gpu}}"
BY_GPU = "job, instance, gpu, uuid"  # the identity of a GPU series, without any owner labels


def per_gpu(
    title: str, description: str, unit: str, metric: str, *, width: int = 12, hi: float | None = None
) -> Panel:
    """A time series of one per-GPU metric, one line per selected GPU."""
    return timeseries(title, description, unit, Target(sel(metric, GPU), EACH), width=width, hi=hi)


def _or_none(counter: str) -> str:
    """A rare hardware counter per GPU, 0 where it never rose on a GPU with HBM row remapping (the HBM boards,
    whose ECC is always on): its series appears with the first error (gpumon/zerofirst.py)."""
    return f"sum by ({BY_GPU}) ({counter}) or 0 * max by ({BY_GPU}) (gpumon_gpu_row_remap_pending{{{GPU}}})"


def errors_and_processes() -> list[Panel | Row]:
    return [
        Row("Errors and XID"),
        timeseries(
            "NVML events",
            "NVML events per second by node and type (xid, ecc_single_bit, ecc_double_bit, "
            "page_retirement, ...), summed over the node's selected GPUs.",
            PER_SECOND,
            Target(
                f"sum by (instance, event) (rate(gpumon_gpu_events_total{{{GPU}}}[$__rate_interval]))",
                "{{instance}} {{event}}",
            ),
        ),
        table(
            "XID errors",
            "XID errors per GPU and code since gpumon started, with the catalogue's severity and the action "
            "it advises (docs/xid.md). Empty while no GPU has reported an XID.",
            COUNT,
            Target(
                f"sum by (instance, gpu, xid) (gpumon_gpu_xid_errors_total{{{GPU}}})"
                " * on(instance, xid) group_left(description, severity, action)"
                # one catalogue entry per node and code, even while two gpumon versions overlap (an
                # instance scraped by two jobs, an upgrade that rewords a code)
                " topk by (instance, xid) (1,"
                f" max by (instance, xid, description, severity, action) (gpumon_xid_info{{{NODE}}}))"
            ),
            columns={"Value": ("errors", COUNT)},
        ),
        table(
            "Memory errors",
            "Volatile ECC errors since the driver loaded, HBM rows remapped to spares, and remaps pending a "
            "reset or failed. Uncorrected errors and remap failures need the GPU drained and serviced. The "
            "counters are served from their first error: a GPU with row remapping that never had one "
            "reads 0.",
            COUNT,
            Target(_or_none(f'gpumon_gpu_ecc_errors_total{{{GPU},type="corrected"}}')),
            Target(_or_none(f'gpumon_gpu_ecc_errors_total{{{GPU},type="uncorrected"}}')),
            Target(_or_none(f"gpumon_gpu_remapped_rows_total{{{GPU}}}")),
            Target(f"max by ({BY_GPU}) (gpumon_gpu_row_remap_pending{{{GPU}}})"),
            Target(f"max by ({BY_GPU}) (gpumon_gpu_row_remap_failure{{{GPU}}})"),
            columns={
                "Value #A": ("ECC corrected", COUNT),
                "Value #B": ("ECC uncorrected", COUNT),
                "Value #C": ("rows remapped", COUNT),
                "Value #D": ("remap pending", NONE),
                "Value #E": ("remap failed", NONE),
            },
        ),
        timeseries(
            "Sampling errors",
            "Failed NVML calls per second by node, call and error (deadline_exceeded: a call hung past "
            "the deadline). 0 when every call succeeds.",
            PER_SECOND,
            Target(
                f"sum by (instance, op, error) (rate(gpumon_errors_total{{{NODE}}}[$__rate_interval]))"
                " or vector(0)",
                "{{instance}} {{op}} {{error}}",
            ),
        ),
        state_timeline(
            "Collector health",
            "Whether each of gpumon's collectors succeeded in its last run; per-GPU health is GPUs up above.",
            {"0": ("failed", "red"), "1": ("ok", "green")},
            Target(
                f"min by (instance, collector) (gpumon_collector_success{{{NODE}}})",
                "{{instance}} {{collector}}",
            ),
            width=12,
        ),
        Row("Processes and owners"),
        stat(
            "Compute processes",
            "Compute processes running on the selected GPUs.",
            COUNT,
            Target(f"sum(gpumon_gpu_processes{{{GPU}}})"),
            height=8,
        ),
        table(
            "Processes",
            "Each compute process, the GPU memory it holds and its owner: user, Kubernetes pod and "
            "container, Slurm job.",
            BYTES,
            Target(
                f"gpumon_process_memory_used_bytes{{{GPU}}} * on(job, instance, uuid, pid)"
                " group_left(name, user, namespace, pod, container, slurm_job_id)"
                f" gpumon_process_info{{{GPU}}}"
            ),
            width=20,
            hide=("Time", "__name__", "job", "uuid"),
            columns={"Value": ("GPU memory", BYTES)},
        ),
        timeseries(
            "Process GPU memory",
            "GPU memory each process holds over time: a leak climbs, a restarted rank shows as a new pid.",
            BYTES,
            Target(sel("gpumon_process_memory_used_bytes", GPU), "{{instance}} GPU {{gpu}} pid {{pid}}"),
        ),
        table(
            "GPU owners",
            "Who each GPU belongs to now: the pod the kubelet allocated it to and/or the Slurm job on it.",
            NONE,
            Target(sel("gpumon_gpu_owner_info", GPU)),
            hide=("Time", "__name__", "job", "Value", "uuid"),
        ),
    ]


def profiling_and_host() -> list[Panel | Row]:
    link = [(bus, d) for bus in ("nvlink", "pcie") for d in ("transmit", "receive")]
    return [
        Row("Profiling (GPM or DCGM)"),
        per_gpu(
            "Tensor pipe activity",
            "Time the tensor pipes were busy. The best single measure of useful work for training: low "
            "tensor activity at high utilisation means the GPU is busy with something else.",
            RATIO,
            "gpumon_gpu_tensor_active_ratio",
            width=8,
            hi=1,
        ),
        timeseries(
            "SM activity and occupancy",
            "SM activity: time SMs had a warp resident; occupancy: resident warps over the maximum.",
            RATIO,
            Target(sel("gpumon_gpu_sm_active_ratio", GPU), "active " + EACH),
            Target(sel("gpumon_gpu_sm_occupancy_ratio", GPU), "occupancy " + EACH),
            width=8,
            hi=1,
        ),
        per_gpu(
            "DRAM bandwidth utilisation",
            "HBM bandwidth used as a share of peak; high with low tensor activity means memory-bound "
            "kernels.",
            RATIO,
            "gpumon_gpu_dram_active_ratio",
            width=8,
            hi=1,
        ),
        timeseries(
            "Link traffic per node",
            "NVLink and PCIe bytes per second from the cumulative counters, summed over each node's selected "
            "GPUs: NVLink carries the collectives, PCIe the host transfers (input, checkpoints, offload).",
            BYTES_PER_S,
            *[
                Target(
                    f"sum by (instance) (rate(gpumon_gpu_{bus}_{d}_bytes_total{{{GPU}}}[$__rate_interval]))",
                    f"{bus} {d} {{{{instance}}}}",
                )
                for bus, d in link
            ],
            width=24,
        ),
        Row("Host"),
        timeseries(
            "Host CPU utilisation",
            "Host CPU busy share, all cores: a saturated host starves the input pipeline.",
            RATIO,
            Target(sel("gpumon_host_cpu_utilization_ratio", NODE), "{{instance}}"),
            width=8,
            hi=1,
        ),
        timeseries(
            "Host memory available",
            "Host memory available without swapping.",
            BYTES,
            Target(sel("gpumon_host_memory_available_bytes", NODE), "{{instance}}"),
            width=8,
        ),
        timeseries(
            "Load per CPU",
            "1-minute load average over logical CPUs; above 1 the host has more runnable threads than CPUs.",
            COUNT,
            Target(f"gpumon_host_load1{{{NODE}}} / gpumon_host_cpus{{{NODE}}}", "{{instance}}"),
            width=8,
        ),
    ]
