"""The training flow's series as the collector writes them: rows instead of samples (families), counters of
rare events shown at 0 before their first value (zerofirst), a job's step histogram that never goes back
(jobsteps)."""
