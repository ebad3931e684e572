"""`python -m bert_jax.plan`: the `bert-jax plan` command (bert_jax/commands/plan.py), by the name the docs gave it first."""
import runpy

if __name__ == "__main__":  # not when a worker process re-imports the main module
    runpy.run_module("bert_jax.commands.plan", run_name="__main__", alter_sys=True)  # as `bert-jax` runs it
