"""Launchers: the same pretrain command on TPU VMs, SLURM clusters, local processes, and sweeps."""
