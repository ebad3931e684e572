"""The planner: the train step compiled ahead of time for devices this host does not have.

`bert-jax plan` (bert_jax/commands/plan.py; `python -m bert_jax.plan` too) is the command. `stage_plans` plans
every stage of a run and judges each; `stage_fixes` finds the single changes that make a stage fit; `stage_report`
prints it all. `compiled_plan` lowers and compiles one step for simulated CPU devices, a TPU slice or GPUs
(`gpu_cards`: XLA's GPU compiler for a card's target config, no GPU needed) and reads memory, FLOPs and bytes off
the result; `hlo_traffic` splits the compiled program's bytes by memory space and counts scanned loops' trips and
kernel launches; `collectives` lists the program's collectives, bytes per device and the link each crosses, and
`links` (the data sheets' table, links.toml) times them; `hlo_flops` counts the dots of an unoptimised program;
`roofline` bounds a step by FLOPs, HBM traffic and each link; `plan_report` writes a plan's report, one file per
kind of target (`report_tpu`, `report_gpu`, `report_cpu`, with `report_collectives`); `memory_fit` judges whether it fits a device; `plan_search` ranks remat x mesh x batch x scan choices by
what the compiler reports; `run_length` turns each stage's step time into hours and chip-hours.
"""
