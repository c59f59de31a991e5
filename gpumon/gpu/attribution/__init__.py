"""Who owns a GPU process: container, Kubernetes pod, Slurm job, user."""
