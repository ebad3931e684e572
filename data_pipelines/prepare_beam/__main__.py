"""`python -m data_pipelines.prepare_beam`: the `bert-jax prepare-beam` command (bert_jax/commands/prepare_beam.py), by the name the docs gave it first."""
import runpy

if __name__ == "__main__":  # not when a worker process re-imports the main module
    runpy.run_module("bert_jax.commands.prepare_beam", run_name="__main__", alter_sys=True)  # as `bert-jax` runs it
