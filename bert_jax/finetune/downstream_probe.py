"""A downstream probe during pre-training: a small suite fine-tuned from the current parameters, in the same process
and on the same mesh, logged as `downstream/<task>/<metric>` in the eval row beside MLM accuracy.

    python -m bert_jax.commands.pretrain --config=configs/tiny.py --workdir=runs/tiny \
        --config.eval.downstream_suite=smoke --config.eval.downstream_data_dir=/data/glue \
        [--config.eval.downstream_every_steps=500]

Pre-training losses do not say what a representation is worth; a curve of a short task does.
Each probe is one seed (config.eval.downstream_seed) at each task's first learning rate, in
WORKDIR/downstream/step_<N>/<task>/ (a resumed pre-training keeps the probes that are DONE). A finished probe's
weights are deleted, its results, metrics and plots kept: each probe kept its fine-tuned checkpoint (params and Adam's
moments, 8.4 MB for configs/tiny.py, some 1.3 GB for BERT-base), and the workdir grew by one per probe, past
checkpoint.max_to_keep's bound (bench/long_haul.py's find, docs/results/long-haul.md). What a probe freed is given
back to the kernel after it (bert_jax/run/freed_memory.py): each probe raised the trainer's RSS for good.
The bert_jax.commands.pretrain command builds the probe (bert_jax/commands/pretrain.py) and the loop calls it at
its eval steps (bert_jax/train/loop.py); the suite is read and checked before the first step.
"""
import os
import signal

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.families import get_family
from bert_jax.finetune import battery, init_from
from bert_jax.models.scan_layout import stack_layers, unstack_layers
from bert_jax.parallel import distributed
from bert_jax.run import freed_memory
from bert_jax.run.refusal import refusal
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir


class DownstreamProbe:
    """probe(step, params) -> {"downstream/<task>/<metric>": value}; `due(step)` says when the loop calls it."""

    def __init__(self, config, workdir: str, suite):
        """`config` as bert_jax/train/config_validation.py checked it (config.eval's cadence and data folder)."""
        e = config.eval
        self.config, self.workdir, self.suite = config, workdir, suite
        self.every, self.num_steps, self.seed = e.downstream_every_steps, config.train.num_steps, e.downstream_seed
        try:
            self.tasks = battery.select_tasks(suite, e.downstream_tasks)
            data = {n: battery.read_task(suite, n, e.downstream_data_dir) for n in self.tasks}
        except ValueError as error:
            if refusal(error) is None:  # a fault reading the tasks keeps its traceback
                raise
            raise ValueError(f"config.eval.downstream_suite={e.downstream_suite!r}: {error}") from None
        self.root = paths.path(workdir) / "downstream"
        if jax.process_index() == 0:
            battery.write_data(str(self.root), data)
        distributed.sync("downstream_probe_data_written")  # the other hosts read what process 0 wrote

    def due(self, step: int) -> bool:
        return step == self.num_steps or bool(self.every and step % self.every == 0)

    def _source(self, step: int, params, task_model_cfg) -> init_from.Source:
        """The encoder as it is at `step`: the pre-training tree, laid out as the fine-tuning config runs it."""
        host = jax.tree.map(np.asarray, multihost_utils.process_allgather(params, tiled=True))
        model_cfg = ml_collections.ConfigDict(self.config.model.to_dict())
        for key in init_from.RUNTIME_KEYS:
            if key in task_model_cfg:
                model_cfg[key] = task_model_cfg[key]
        host = unstack_layers(host)
        host = stack_layers(host) if model_cfg.scan_layers else host
        return init_from.Source("pretraining", self.workdir, step, get_family(model_cfg.family), model_cfg,
                                str(Workdir(self.workdir).tokenizer), host)

    def __call__(self, step: int, params) -> dict:
        logging.info("downstream probe at step %d: fine-tuning %s", step, ", ".join(self.tasks))
        with freed_memory.one_off():  # what the fine-tuning runs allocate is given back when they end
            row, finished = self._probe(step, params)
        if finished:
            logging.info("downstream probe at step %d | %s", step, " | ".join(
                f"{k} {v:.4f}" for k, v in row.items() if not k.endswith("/loss")))
        return row

    def _probe(self, step: int, params) -> tuple[dict, bool]:
        """(the row, whether every task finished: not when the run was preempted inside the probe)."""
        # Imported here: bert_jax.finetune.run builds on the harness, which the pre-training loop is running.
        from bert_jax.finetune.run import run as finetune_run  # noqa: PLC0415

        row = {}
        for name in self.tasks:
            spec = self.suite.tasks[name]
            workdir = str(self.root / f"step_{step}" / name)
            run = battery.Run(name, float(spec.learning_rates[0]), self.seed, workdir)
            c = battery.run_config(self.suite, run, battery.data_files(str(self.root), name), f"{self.workdir}@{step}")
            c.mesh = self.config.mesh.copy_and_resolve_references()  # the pre-training's mesh
            # A probe reads its last validation only: validate before and after, save at the end (time is the
            # pre-training's).
            c.train.evals_per_run, c.checkpoint.every_steps = 1, 10**9
            result = battery.finished_result(workdir)
            if result is None:
                source = self._source(step, params, c.model)
                # Out of the pre-training loop's logical axis rules: the fine-tuning run sets its own (and its mesh,
                # config.mesh, is the pre-training's); under the loop's, flax would constrain the host-side init.
                with nn.logical_axis_rules(()):
                    result = finetune_run(c, workdir, source=source)
            if "validation" not in result:  # preempted inside the probe: the pre-training's watch must see it
                os.kill(os.getpid(), signal.SIGTERM)
                return row, False
            _drop_weights(workdir)
            row.update({f"downstream/{name}/{k}": float(v) for k, v in result["validation"].items() if "/" not in k})
        return row, True


def _drop_weights(workdir: str) -> None:
    """A finished probe's checkpoints (and best params): its row is written and DONE marks it, nothing reads them."""
    if jax.process_index() != 0:
        return
    run = Workdir(workdir)
    for folder in (run.checkpoints, run.best):
        if folder.exists():
            folder.rmtree()
