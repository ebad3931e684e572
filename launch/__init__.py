"""Launchers: the same pretrain command on TPU VMs, SLURM clusters, local processes, and sweeps.

Installed as `bert_jax.launch` (a top-level `launch` would collide with a user's own package); the commands that
drive it are bert_jax/commands/{tpu_vm,slurm,local,ray_tpu,sweep}.py. `python -m launch.<name>` still runs each from
the repository root, where this folder is importable by its own name.
"""
import os
import shlex

# Weights & Biases reads these from the environment (WANDB_API_KEY, WANDB_ENTITY, WANDB_PROJECT, WANDB_MODE,
# WANDB_BASE_URL, ...): the launchers pass every WANDB_* variable of the launching shell to the workers.
WANDB_PREFIX = "WANDB_"


def wandb_env(environ: dict | None = None) -> dict[str, str]:
    """The WANDB_* variables of `environ` (default: this process's), for the workers a launcher starts."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if k.startswith(WANDB_PREFIX)}


def shown(command: str, env: dict[str, str]) -> str:
    """`command` with the values of env's secrets (names holding KEY or TOKEN) masked, for printing."""
    for name, value in env.items():
        if value and ("KEY" in name or "TOKEN" in name):
            command = command.replace(shlex.quote(value), "***").replace(value, "***")
    return command
