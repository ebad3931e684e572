"""`python -m data_pipelines.prepare`: the `bert-jax prepare` command (bert_jax/commands/prepare.py), by the name the docs gave it first."""
import runpy

if __name__ == "__main__":  # not when a worker process re-imports the main module
    runpy.run_module("bert_jax.commands.prepare", run_name="__main__", alter_sys=True)  # as `bert-jax` runs it
