"""The training flow's series as the collector writes them: rows instead of samples (families), a job's step
histogram that never goes back (jobsteps). Counters of rare events shown at 0 before their first value are
gpumon/zerofirst.py, shared with the GPU flow."""
