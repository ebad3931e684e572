"""Run infrastructure both loops use, one layer below `train/` and `finetune/`: the harness (process set-up, restore,
the step loop, preemption, cleanup), the workdir's lease, metrics files, the experiment and data identity checks,
completion markers, determinism flags, and the command line's config parsing."""
