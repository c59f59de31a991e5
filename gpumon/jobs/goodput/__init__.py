"""The goodput ledger: where each second of a training rank's wall-clock went (ledger.py), and a job's
ledgers summed for the API and `gpumon diagnose` (summary.py)."""
