"""What a verdict says: one summary line per bottleneck, the advice, and a sentence per finding."""

from __future__ import annotations

from collections.abc import Callable

from gpumon.jobs.diagnosis.signals import Signals, Thresholds


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f} %"


ADVICE = {
    "gpu_down": "A GPU this rank runs on stopped answering NVML (lost, fallen off the bus, or a hung "
    "driver call): its numbers are gone and the job will fail or hang on it. Check the XID errors "
    "(gpumon_gpu_xid_errors_total, docs/xid.md) and dmesg; drain the node if it does not come back.",
    "exited": "The rank's process is gone without its final report: killed (OOM killer, SIGKILL, a "
    "preemption), crashed, or exited without Reporter.close(). Check its exit status and log (dmesg for the "
    "OOM killer, the scheduler's record); its peers will hang in their next collective until it is back.",
    "idle": "Nothing is running on the GPU and no step completed: the job is between phases, finished, or "
    "waiting on something outside the GPU (a checkpoint upload, a scheduler).",
    "stalled": "The GPU is busy but no step completed in the window: look for a hung collective (NCCL "
    "timeout, a rank that died), a deadlock, or a step far longer than the window.",
    "input": "The loop waits on data while the GPU idles: raise DataLoader num_workers, pin_memory, "
    "prefetch_factor; move decoding/augmentation off the critical path; check storage throughput and CPU.",
    "communication": "Time goes to collectives: overlap communication with compute (bucket sizes, "
    "gradient accumulation), check the interconnect (NVLink/InfiniBand health, NCCL topology), reduce "
    "data-parallel traffic (ZeRO stage, gradient compression), or scale up before scaling out.",
    "throttled": "Clocks are held down by thermal limits or a hardware slowdown: check cooling and inlet "
    "temperatures, the power supply and brake signals (nvidia-smi -q -d PERFORMANCE), and dmesg for XIDs.",
    "memory_capacity": "HBM is nearly full, or the caching allocator had to flush its cache (retries) or "
    "failed (OOMs): each retry synchronises the device and costs milliseconds, and an OOM is close. Set "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation; use activation checkpointing, "
    "a smaller micro-batch with accumulation, or a higher ZeRO stage (the rank's memory section compares the "
    "allocator with the estimate and names a stage that fits).",
    "memory_bandwidth": "DRAM is busy while tensor cores idle: kernels are bandwidth-bound. Fuse "
    "elementwise ops (torch.compile), use FlashAttention, lower precision (bf16/fp8), larger batches.",
    "compute": "The GPU's arithmetic units are the limit, which is where a training job should be. Gains "
    "now come from kernel efficiency and precision (fp8, fused kernels) and from MFU; compare MFU with the "
    "baseline.",
    "undetermined": "No signal crosses its threshold. Report phases (data_wait, communication) from the "
    "training loop and enable profiling counters (GPM on Hopper, or DCGM) so gpumon can tell.",
}


# the advice of a communication verdict on a node that sees its ranks wait for peers on other nodes
WAIT_ADVICE = (
    "The ranks here wait in collectives for ranks on other nodes. Either a peer is slower (a straggler: "
    "every other rank waits for it in each all-reduce) or the network between nodes is slow. The job view "
    "decides: instance_job_name:gpumon_training_straggler:ratio and the GpumonTrainingStragglerNode/Rank "
    "alerts name a straggler node or rank (fix or drain it first); with none, check the inter-node fabric "
    "(InfiniBand/RoCE link state and errors, NCCL_DEBUG=INFO's chosen transport) and overlap communication "
    "with compute."
)


# the advice when the NICs show the wait is not the network's
PEER_ADVICE = (
    "The ranks here wait in collectives for ranks on other nodes while their NICs idle: the network is not "
    "the limit, a slower peer is (every rank waits for the slowest in each collective). The job view names "
    "it: instance_job_name:gpumon_training_straggler:ratio and the GpumonTrainingStragglerNode/Rank alerts; "
    "fix or drain that node or rank. With none named, look for a peer whose own NICs are saturated or "
    "erroring (a degraded link slows only its own node's collectives)."
)


def nic_in_communication(s: Signals) -> float | None:
    """The line rate the rank's NICs carried while it communicated: their use over the window divided by
    its communication share (a job that communicates a third of the time at full speed reads 1)."""
    if s.nic_utilization is None or not s.communication_share:
        return None
    return min(1.0, s.nic_utilization / s.communication_share)


def spans_nics(s: Signals) -> bool:
    """The job has ranks on other nodes and the NICs nearest its GPUs here are known: its collectives cross
    them."""
    return bool(s.nics) and s.peers_elsewhere > 0


def network_busy(s: Signals, t: Thresholds) -> bool | None:
    """Whether the NICs nearest the rank's GPUs are the limit: busy while it communicates, erroring, or a
    port down. None: no NIC evidence (no NIC known, too few readings, or a job all on this node, whose
    collectives stay on NVLink and PCIe)."""
    if not spans_nics(s):
        return None
    if s.nics_down or (s.nic_errors or 0.0) >= 1 or fabric_trouble(s, t):
        return True
    busy = nic_in_communication(s)
    return None if busy is None else busy >= t.nic_busy


def fabric_trouble(s: Signals, t: Thresholds) -> bool:
    """The NICs' transport retries lost packets, or slows down for congestion notifications, at a rate that
    limits the job whatever their throughput: a lossy or congested RoCE fabric is the network's fault."""
    pairs = ((s.nic_retransmit_rate, t.nic_retransmit_rate), (s.nic_cnp_rate, t.nic_cnp_rate))
    return any(rate is not None and rate > 0 and rate >= threshold for rate, threshold in pairs)


def waits_on_peers(s: Signals, t: Thresholds) -> bool:
    """Time in collectives of a job with ranks on other nodes, this node's links not saturated and its NICs
    not busy: a wait for a slower peer (the NICs idle meanwhile) or, without NIC evidence, a slow network as
    much as a slower peer, which only the job's view across nodes can tell apart."""
    link = link_use(s)
    saturated = link is not None and link >= t.link_busy
    return s.peers_elsewhere > 0 and not saturated and network_busy(s, t) is not True


def link_use(s: Signals) -> float | None:
    return max((x for x in (s.nvlink_utilization, s.pcie_utilization) if x is not None), default=None)


def flops_note(s: Signals, t: Thresholds) -> str | None:
    """MFU counts the FLOPs the job declares; the tensor cores' activity bounds what it can have done."""
    if s.mfu is None or s.tensor_active is None or s.tensor_active < 0.02 or s.shared_with or not s.settled:
        return None
    if s.mfu <= s.tensor_active * (1.0 + t.mfu_over_tensor) + 0.01:
        return None
    return (
        f"the declared FLOPs per token looks {s.mfu / s.tensor_active:.1f}x too high: MFU {_pct(s.mfu)} "
        f"exceeds the tensor cores' activity {_pct(s.tensor_active)}, which bounds it (check "
        "flops_per_token, the model preset and the dtype)"
    )


def clocks_note(s: Signals) -> str:
    if s.slowdown is None:
        impact = "no unthrottled speed or baseline to compare with yet"
    else:
        against = "its baseline" if s.slowdown_against == "baseline" else "its recent unthrottled speed"
        impact = f"the job runs {_pct(max(0.0, s.slowdown))} slower than {against}"
    return f"thermal or hardware clock limits in {_pct(s.throttled_share)} of samples; {impact}"


GIB = 1024.0**3
SETUP_GAP_FLOOR = 2 * GIB  # buffers outside any estimate (NCCL, workspaces) are this large on small models


def setup_note(s: Signals, t: Thresholds) -> str | None:
    """The declared setup (model, micro-batch, ZeRO stage, offload, parallelism) against the HBM and the
    allocator: an estimate that cannot fit, or one far off what the allocator holds, means the setup declared
    is not the one running, and the estimate and its advice do not apply."""
    est, peak, hbm = s.setup_estimate_bytes, s.allocated_peak_bytes, s.hbm_bytes
    if est is None or est <= 0 or not s.settled:
        return None
    held = "" if peak is None else f"; the allocator peaked at {peak / GIB:.1f} GiB"
    if hbm and est > hbm:
        return (
            f"the declared setup needs an estimated {est / GIB:.1f} GiB per GPU, more than the GPU's "
            f"{hbm / GIB:.1f} GiB{held}: it cannot be the setup running (check zero_stage, micro_batch, "
            "offload, tp and the world size the ranks declare)"
        )
    if peak is None or abs(peak - est) <= max(t.setup_gap * est, SETUP_GAP_FLOOR):
        return None
    if peak < est:
        why = "activation checkpointing, a smaller micro-batch, a higher ZeRO stage or offload than declared"
    else:
        why = "a lower ZeRO stage or a larger micro-batch than declared, or large buffers the estimate omits"
    return (
        f"the allocator peaked at {peak / GIB:.1f} GiB per GPU, {_pct(abs(peak / est - 1))} "
        f"{'below' if peak < est else 'above'} the declared setup's estimate of {est / GIB:.1f} GiB: "
        f"{why}; the memory estimate and its advice do not describe this job"
    )


def unknown_device_note(s: Signals) -> str:
    return (
        f"device {', '.join(repr(d) for d in s.unknown_devices)} names no GPU of this node (NVML indexes "
        "or GPU-/MIG- UUIDs as NVML lists them): no GPU signal is known"
    )


def shared_note(s: Signals) -> str:
    who = ", ".join(s.shared_with)
    if s.own_utilization:
        return (
            f"GPU shared with {who}: its own SM use is {_pct(s.utilization)} (NVML per process), the whole "
            f"GPU's {_pct(s.shared_utilization)}"
        )
    return (
        f"GPU shared with {who}: GPU activity is not attributable to one job, so the verdict rests on "
        "the job's own phases"
    )


def _allocator_note(s: Signals) -> str:
    if s.alloc_retries is None:
        return ""
    return f"; {s.alloc_retries:.0f} allocation retries and {s.ooms or 0:.0f} OOMs in the window"


# one line per verdict, formatted only for the verdict reached (every rank, every scrape)
_SUMMARIES: dict[str, Callable[[Signals], str]] = {
    "gpu_down": lambda s: f"a GPU is down ({s.gpu_down})",
    "exited": lambda s: f"the process is gone ({s.exited}); {_gpu_now(s)}",
    "idle": lambda s: f"no recent step and the GPU is idle now ({_utilization_now(s)}){_inside(s)}",
    "stalled": lambda s: f"no recent step while the GPU is busy now ({_utilization_now(s)}){_inside(s)}",
    "input": lambda s: (
        f"input-bound: {_pct(s.data_wait_share)} of wall time waiting for data, GPU "
        f"utilisation {_pct(s.utilization)}"
    ),
    "communication": lambda s: (
        f"communication-bound: {_pct(s.communication_share)} of wall time in "
        f"communication, link use {_pct(link_use(s))}{_network(s)}{_nccl(s)}"
    ),
    "communication_wait": lambda s: (
        f"waiting in communication: {_pct(s.communication_share)} of wall time in collectives with "
        f"{s.peers_elsewhere} ranks on other nodes, link use {_pct(link_use(s))}{_nccl(s)}; a slow network "
        "and a "
        "slower peer look the same from this node: the job's view across nodes says which"
    ),
    "peer_wait": lambda s: (
        f"waiting on peers: {_pct(s.communication_share)} of wall time in collectives with "
        f"{s.peers_elsewhere} ranks on other nodes, while its NICs ({', '.join(s.nics)}) carry "
        f"{_pct(nic_in_communication(s))} of their line rate in them ({_pct(s.nic_utilization)} over the "
        f"window){_nccl(s)}: not the network, a slower peer holds the collectives back"
    ),
    "throttled": lambda s: (
        f"throttled: thermal or hardware clock limits active in {_pct(s.throttled_share)} of samples, and "
        f"the job runs {_pct(s.slowdown)} slower than "
        f"{'its baseline' if s.slowdown_against == 'baseline' else 'before'}"
    ),
    "memory_capacity": lambda s: (
        f"memory capacity: {_pct(s.memory_used_ratio)} of HBM in use{_allocator_note(s)}"
    ),
    "memory_bandwidth": lambda s: (
        f"memory-bandwidth-bound: DRAM active {_pct(s.dram_active)}, tensor cores {_pct(s.tensor_active)}"
    ),
    "compute": lambda s: (
        f"compute-bound: tensor cores {_pct(s.tensor_active)}, SMs {_pct(s.sm_active)}, "
        f"utilisation {_pct(s.utilization)}, MFU {_pct(s.mfu)}"
    ),
    "undetermined": lambda s: (
        "no bottleneck signal crosses its threshold (utilisation "
        f"{_pct(s.utilization)}, data wait {_pct(s.data_wait_share)}, communication "
        f"{_pct(s.communication_share)})"
    ),
}


# what a loop stuck inside a phase it timed most likely waits for
_INSIDE = {
    "data_wait": "the input pipeline delivers nothing: data loader workers dead or blocked, storage stalled",
    "communication": "a collective that does not return: a peer died or hangs (NCCL timeout pending)",
    "checkpoint": "a planned checkpoint, not a hang unless it should have ended by now",
    "evaluation": "a planned evaluation, not a hang unless it should have ended by now",
}
# advice in place of the stalled/idle one when the loop is inside a phase it timed
OPEN_ADVICE = {
    "data_wait": "The loop is inside data_wait: check the DataLoader's workers (alive? stuck on I/O or a "
    "lock?), the storage or network they read from, and the host's CPU and memory.",
    "communication": "The loop is inside a collective that has not returned: find the rank that is not in "
    "it (dead, hung, or slower), check NCCL's log (NCCL_DEBUG=INFO) and the interconnect.",
    "checkpoint": "The loop is saving a checkpoint: if it takes longer than it should, check the storage's "
    "throughput and free space, and whether every rank reached the save.",
    "evaluation": "The loop is evaluating: if it takes longer than expected, check the evaluation set's size "
    "and its data loader; shorten or space out evaluations if they cost too much.",
}


def _network(s: Signals) -> str:
    """The NICs' side of a communication verdict, where they are known and carry the job's collectives."""
    if not spans_nics(s):
        return ""
    parts = []
    if (busy := nic_in_communication(s)) is not None:
        window = _pct(s.nic_utilization)
        parts.append(f"its NICs at {_pct(busy)} of line rate while communicating ({window} over the window)")
    if s.nic_errors:
        parts.append(f"{s.nic_errors:.0f} NIC errors in the window")
    if s.nics_down:
        parts.append(f"ports not ACTIVE: {', '.join(s.nics_down)}")
    parts += _fabric(s)
    return "".join(f", {p}" for p in parts)


def _fabric(s: Signals) -> list[str]:
    parts = []
    if s.nic_retransmit_rate:
        parts.append(f"{s.nic_retransmit_rate:.3g} transport retransmissions a second")
    if s.nic_cnp_rate:
        parts.append(f"{s.nic_cnp_rate:.3g} congestion notifications a second")
    return parts


def fabric_note(s: Signals) -> str:
    """Retransmissions or congestion notifications on the NICs nearest the rank's GPUs."""
    return _about_nics(
        s,
        _fabric(s),
        "the fabric drops or marks the job's packets (RoCE): check PFC and ECN on the switches and the "
        "NICs (mlnx_qos), switch buffer drops, and other traffic sharing the links "
        "(gpumon_nic_hw_events_total with --collect nic-detail names the counter)",
    )


def _nccl(s: Signals) -> str:
    """NCCL's own figure for the rank's collectives, where its Inspector's dumps are read."""
    if s.nccl_bus_bandwidth is None:
        return ""
    what = s.nccl_operation or "all operations"
    return f", NCCL's bus bandwidth {s.nccl_bus_bandwidth / 1e9:.3g} GB/s ({what})"


def nic_note(s: Signals) -> str:
    """Errors or a port down on the NICs nearest the rank's GPUs."""
    parts = []
    if s.nic_errors:
        parts.append(f"{s.nic_errors:.0f} errors in the window")
    if s.nics_down:
        parts.append(f"ports not ACTIVE: {', '.join(s.nics_down)}")
    return _about_nics(
        s,
        parts,
        "its traffic to other nodes retries or fails over: check the cable, the transceiver and the switch "
        "port (ibstat, ibqueryerrors; gpumon_nic_errors_total names the counter)",
    )


def _about_nics(s: Signals, facts: list[str], advice: str) -> str:
    """A note on the NICs nearest the rank's GPUs: what they show, and what to check."""
    return f"NIC {', '.join(s.nics)}: {' and '.join(facts)}; {advice}"


def _inside(s: Signals) -> str:
    if s.open_phase is None:
        return ""
    name, seconds = s.open_phase
    why = _INSIDE.get(name)
    return f"; inside its {name} phase for {seconds:.0f} s" + (f" ({why})" if why else "")


def _utilization_now(s: Signals) -> str:
    return f"utilisation {_pct(s.current_utilization)}"


def _gpu_now(s: Signals) -> str:
    now = s.current_utilization
    if now is None:
        return "its GPU's utilisation is not measured"
    state = "idle" if now < Thresholds.idle_utilization else "still busy"
    return f"its GPU is {state} now ({_utilization_now(s)})"


def summary(verdict: str, s: Signals) -> str:
    return _SUMMARIES[verdict](s)
