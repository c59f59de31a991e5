"""NCCL's own view of a job's collectives: the Inspector profiler plugin's JSON dumps, read incrementally and
joined to the ranks that report to this daemon (docs/training.md, "NCCL's Inspector")."""
