"""Joining a multi-host run: `jax.distributed.initialize` from `config.distributed` or the environment.

Multi-host JAX is one program run once per host; every process must call this before
anything touches a device (`jax.devices()`, `jax.process_index()`, building arrays).

- Explicit (localhost, or any cluster without a scheduler JAX knows): set
  `distributed.coordinator_address=host:port`, `num_processes`, `process_id`.
- Auto: on a Cloud TPU VM (TPU_WORKER_HOSTNAMES / TPU_WORKER_ID / TPU_ACCELERATOR_TYPE
  in the environment), under SLURM with more than one task, or with
  `distributed.auto=True`, JAX reads everything from the environment. Under SLURM it
  runs one process per *task* and, by default, gives each process the GPU numbered
  by SLURM_LOCALID: launch one task per GPU (`launch/slurm.py` does).

A process that dies stops sending heartbeats; after `heartbeat_timeout_s` the
coordination service reports it and the others fail with an error rather than
hang in a collective.
"""
import os

import jax
import ml_collections
from absl import logging
from jax.experimental import multihost_utils

# Environment variables whose presence means a TPU VM slice with several workers.
_TPU_ENV = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")


def default_config() -> ml_collections.ConfigDict:
    """config.distributed of every command: a single process unless told or detected otherwise."""
    c = ml_collections.ConfigDict()
    c.coordinator_address = ""  # "host:port" of process 0; "" = single process or auto
    c.num_processes = 1
    c.process_id = 0
    c.auto = False  # True: jax.distributed.initialize() detects the cluster itself
    c.initialization_timeout_s = 300  # wait this long for every process to join
    # A process silent this long counts as dead: the others stop with an error instead of hanging.
    c.heartbeat_timeout_s = 100
    c.shutdown_timeout_s = 300
    return c


def detected_cluster(environ=os.environ) -> str | None:
    """'tpu' or 'slurm' when the environment describes a multi-process job JAX can join by itself."""
    hosts = next((environ[k] for k in _TPU_ENV if environ.get(k)), "")
    if len([h for h in hosts.split(",") if h.strip()]) > 1:
        return "tpu"
    if int(environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in environ:
        return "slurm"
    return None


def initialize_kwargs(dist_cfg, environ=os.environ) -> dict | None:
    """The arguments for jax.distributed.initialize, or None for a single-process run."""
    timeouts = dict(
        initialization_timeout=int(dist_cfg.initialization_timeout_s),
        heartbeat_timeout_seconds=int(dist_cfg.heartbeat_timeout_s),
        shutdown_timeout_seconds=int(dist_cfg.shutdown_timeout_s),
    )
    if dist_cfg.coordinator_address:
        n, i = int(dist_cfg.num_processes), int(dist_cfg.process_id)
        if n < 1 or not 0 <= i < n:
            raise ValueError(
                f"config.distributed.process_id={i} must be in [0, config.distributed.num_processes={n})"
            )
        return dict(coordinator_address=dist_cfg.coordinator_address, num_processes=n, process_id=i, **timeouts)
    if dist_cfg.num_processes > 1:
        raise ValueError(
            f"config.distributed.num_processes={dist_cfg.num_processes} needs "
            f"config.distributed.coordinator_address=HOST:PORT (process 0's address), or distributed.auto=True"
        )
    if dist_cfg.auto or detected_cluster(environ):
        return timeouts  # JAX detects coordinator, process count and id from the environment
    return None


def initialize(dist_cfg) -> None:
    """Joins the run (no-op for one process, or when already joined). Call before touching devices."""
    kwargs = initialize_kwargs(dist_cfg)
    if kwargs is None or jax.distributed.is_initialized():
        return
    logging.info("jax.distributed.initialize(%s)", ", ".join(f"{k}={v}" for k, v in kwargs.items()))
    jax.distributed.initialize(**kwargs)
    logging.info("process %d of %d; %d local / %d global devices",
                 jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


def sync(name: str) -> None:
    """A barrier across all processes (no-op for one): e.g. process 0 has written the tokenizer."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
