"""The planner: the train step compiled ahead of time for devices this host does not have.

`python -m bert_jax.plan` (`__main__.py`) is the command. `compiled_plan` lowers and compiles the
step for simulated CPU devices or a TPU slice and reads memory, FLOPs and bytes off the result;
`hlo_traffic` splits the compiled program's bytes by memory space and counts scanned loops' trips;
`roofline` bounds a step by FLOPs and HBM traffic; `memory_fit` judges whether it fits a device;
`plan_search` ranks remat x mesh x batch x scan choices by what the compiler reports.
"""
