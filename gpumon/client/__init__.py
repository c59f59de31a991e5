"""gpumon's training-side SDK: a process tells its node's gpumon daemon how far it got.

    from gpumon.client import Reporter

    reporter = Reporter(workload="llama-7b", dtype="bf16", flops_per_token=6 * 7e9)
    for batch in loader:
        with reporter.data_wait():          # cached per name: no allocation per step
            batch = next_batch()
        with reporter.forward_backward():
            loss = model(batch).backward()
        reporter.step(tokens=batch_tokens, samples=batch_size)
    reporter.close()                        # also done at interpreter exit

``Reporter(job, rank, world_size, local_rank, device, kind, workload, dtype, flops_per_token, model,
flops_convention, peak_flops, url, token, interval, enabled, resumed_step, micro_batch, zero_stage, setup,
state_dir)``:
every argument is optional. Left None:

- job: GPUMON_JOB, TORCHELASTIC_RUN_ID, "<SLURM_JOB_NAME>-<SLURM_JOB_ID>", else the script's name;
- rank, world_size, local_rank: torchrun, Slurm, Open MPI or MPICH variables (gpumon.client.env);
- device: the local rank's GPU through CUDA_VISIBLE_DEVICES (an int or "cuda:N" is a CUDA ordinal mapped the
  same way; "GPU-…"/"MIG-…" UUIDs and decimal strings, taken as NVML indexes, pass through);
- flops_per_token: ``model.flops_per_token(train=kind == "train", convention=...)`` when a model is given;
- url: GPUMON_URL, else http://127.0.0.1:9478 ("unix:///path.sock" for the daemon's unix socket);
- token: GPUMON_INGEST_TOKEN (sent as a bearer token); interval: GPUMON_REPORT_INTERVAL, else 1 s;
- enabled: false when GPUMON_REPORT is 0/false/no/off; every call is then a no-op;
- resumed_step: none (a fresh run); the global step of the checkpoint this process resumed from;
- state_dir: GPUMON_STATE_DIR, else none; a directory that outlives the process wherever the rank restarts
  (the checkpoint directory), where the rank keeps a small state file so that its next process, on any
  node, books the restart's gap and redone steps (gpumon.client.rankstate);
- micro_batch, zero_stage, setup: none; with a model (a ModelSpec or a preset name), what the daemon's memory
  estimate needs (setup: optimizer, checkpointing, offload, flash_attention, tp, sequence_parallel).

Hot path, none of which does I/O, waits, touches the GPU or raises: ``step(tokens=0, samples=0)`` once per
optimizer step; ``with reporter.phase(name):`` (or the shortcuts data_wait, forward_backward, communication,
optimizer, checkpoint, evaluation); ``add_phase(name, seconds)`` for time measured elsewhere;
``request(tokens=0, latency=None)`` per served request. step() and the phase context managers belong to one
thread (the training loop's); add_phase() and request() may be called from any thread.

Also: ``resume(step)`` (the checkpoint loaded after the Reporter was made), ``totals`` (a copy of the
cumulative counters and phase seconds), ``flush(timeout=2.0) -> bool``,
``close(timeout=2.0)`` (final report; idempotent), ``with Reporter(...) as r:``. Forked children (DataLoader
workers) inherit a disabled copy: only the parent reports. A second Reporter of the same (job, rank) and
daemon in one process is a handle on the first (``shares_with``): one set of counters, one incarnation, the
last handle closed sends the final report. Standard library only.
"""

from __future__ import annotations

from gpumon.client.reporter import NULL_PHASE, Phase, Reporter

__all__ = ["NULL_PHASE", "Phase", "Reporter"]
