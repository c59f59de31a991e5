"""The baseline library: what a healthy run of a workload looks like, and each job set against it.

``library`` (the TOML file: keys, figures, locked atomic writes, written by ``toml_out``), ``watch`` (the
daemon's reloading view of it), ``jobfigures`` (a live job's key and figures, and its ratio to a baseline),
``history`` (10 s samples of every job for ``gpumon baseline record``) and ``steady`` (the steady-state
figures recorded from that history).
"""
