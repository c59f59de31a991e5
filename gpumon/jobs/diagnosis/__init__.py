"""The diagnosis: per rank and per job, one verdict with its evidence (flow), from signals (signals), in
words (wording); what it remembers between evaluations (state) and whether a rank's process lives
(liveness)."""

from gpumon.jobs.diagnosis.flow import diagnose, straggler_scores
from gpumon.jobs.diagnosis.signals import (
    BOTTLENECKS,
    Evidence,
    Signals,
    Thresholds,
    Verdict,
    parse_thresholds,
)
from gpumon.jobs.diagnosis.wording import ADVICE

__all__ = [
    "ADVICE",
    "BOTTLENECKS",
    "Evidence",
    "Signals",
    "Thresholds",
    "Verdict",
    "diagnose",
    "parse_thresholds",
    "straggler_scores",
]
