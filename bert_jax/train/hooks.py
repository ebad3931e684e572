"""Pre-training's hooks for the harness (bert_jax/run/harness.py): its cadence (config.train.*_every_steps), its MLM
evaluation (per source for a mixture, with a downstream probe when one is due), its speed line, and a mixture's
per-source counts and end. Complete when built: the harness only calls them."""
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.parallel.mesh import global_batch
from bert_jax.run import harness
from bert_jax.train import counters, perf
from bert_jax.train.budget_clock import BudgetClock
from data_pipelines.loader import mixing, pipeline


class PretrainHooks:
    """`eval_sets`: [(source name, or "" for the whole stream; its host batches)] from pipeline.build_eval_sets.
    `downstream`: a probe (bert_jax/finetune/downstream_probe.py) that evaluations call when it is due, or None.
    `stages`: the whole run's (bert_jax/train/stages.py plan), whose batches and lengths count the tokens seen."""

    def __init__(self, config, program, workdir: str, last_step: int, train_iter, eval_sets, downstream=None,
                 stages=(), data_share: int = 0):
        self.config, self.program, self.workdir, self.last_step = config, program, workdir, last_step
        self.train_iter, self.downstream = train_iter, downstream
        self.t_cfg, self.objective = config.train, program.objective
        self.headline = ("loss",) + self.objective.headline
        self.eval_host_batches = [batch for _, batches in eval_sets for batch in batches]
        self.eval_sources = [(name, len(batches)) for name, batches in eval_sets if name]
        # The MLM floor (always the most frequent masked id); a causal objective's batches mask nothing.
        masked = any("masked_ids" in batch for batch in self.eval_host_batches)
        self.baseline = pipeline.most_frequent_token_accuracy(self.eval_host_batches) if masked else None
        self.meter = _meter(config, program)
        self.spans = counters.token_spans(stages, config)  # train/tokens_seen's stages (bert_jax/train/counters.py)
        self.budget_clock = BudgetClock.of(config.train)  # None without config.train.budget
        # Which stream this process reads (the loop's host_data_share): processes that hold the same rows (a context
        # or tensor axis across them) read the same one, and a mixture's counts count it once.
        self.data_share = data_share
        self.last_metrics: dict = {}

    def started(self, step, state, writer):
        logging.info("starting at step %d of %d (workdir %s)", step, self.t_cfg.num_steps, self.workdir)
        self.eval_batches = [global_batch(b, self.program.data_sharding) for b in self.eval_host_batches]
        self.meter.start(step)

    def logs_at(self, step):
        return step % self.t_cfg.log_every_steps == 0

    def logged(self, step, row):
        row["train/learning_rate"] = counters.schedule_at(self.program.schedule, step - 1)
        row["train/tokens_seen"] = float(counters.tokens_seen(step, self.spans))
        if self.budget_clock is not None:  # the share of config.train.budget spent: what every schedule runs by
            row["train/budget_spent"] = self.budget_clock.fraction(step)
        row.update(self.meter.measure(step))
        row.update(_data_metrics(self.train_iter, self.data_share))
        self.last_metrics.update(row)
        logging.info(
            "step %d/%d | %s | %.0f tok/s | %s %.2f%% | ETA %s", step, self.t_cfg.num_steps,
            harness.headline(row, "train", self.objective.headline), row["perf/tokens_per_s"],
            self.meter.mfu_label, 100 * row["perf/mfu"], perf.format_duration(row["perf/eta_s"]),
        )

    def evaluates_at(self, step):
        return step % self.t_cfg.eval_every_steps == 0 or step == self.last_step

    def evaluate(self, step, state, writer):
        row = _evaluate(self.program, state.params, self.eval_batches, self.eval_sources)
        if self.baseline is not None:
            row["eval/most_frequent_token_accuracy"] = self.baseline
        if self.downstream is not None and self.downstream.due(step):  # before meter.start: not train time
            row.update(self.downstream(step, state.params))
        writer.write(step, row)
        self.last_metrics.update(row)
        floor = "" if self.baseline is None else f" (MLM always-most-frequent-token: {self.baseline:.4f})"
        logging.info("eval step %d | %s%s", step, harness.headline(row, "eval", self.objective.headline), floor)
        for name, _ in self.eval_sources:
            logging.info("eval step %d | source %s | %s", step, name,
                         harness.headline(row, f"eval/{name}", self.objective.headline))
        writer.plot(self.headline)
        self.meter.start(step)  # eval time is not train time
        return False

    def saves_at(self, step):
        return step % self.config.checkpoint.every_steps == 0

    def saved(self, step, writer):
        pass

    def closing(self, writer):
        writer.plot(self.headline)

    def data_ended(self, step):
        """A source that stops (config.data.mixture.<name>.on_exhausted="stop") ran out: data/<name>/exhausted = 1
        in the last step's row. Every host is here at once; the one whose share ran out names the source."""
        names = self.train_iter.names
        if not self.train_iter.ended:  # another host's share ended: this one's last batch was drawn, not trained
            self.train_iter.forget_last_batch()
        index = names.index(self.train_iter.ended) if self.train_iter.ended else len(names)
        if jax.process_count() > 1:
            index = int(np.min(multihost_utils.process_allgather(np.int32(index))))
        name = names[index]
        logging.warning("source %r ran out after step %d (config.data.mixture.%s.on_exhausted='stop'): "
                        "the run ends at step %d, its last full batch", name, step, name, step)
        row = {f"data/{name}/exhausted": 1.0}
        self.last_metrics.update(row)
        return row


def _meter(config, program) -> perf.PerfMeter:
    """The run's meter: its FLOPs per step and its peak, each found once, here, before the step compiles."""
    flops = perf.step_flops(program, config)
    peak, peak_source = perf.peak_flops_per_device(config.logging.peak_flops_per_device)
    logging.info("%.3g FLOPs/step (%s); peak %.3g FLOP/s/device (%s)", flops, perf.FORMULA, peak, peak_source)
    return perf.PerfMeter(flops, counters.tokens_per_step(config),
                          peak * jax.device_count(), config.train.num_steps, peak_source)


def _evaluate(program, params, eval_batches, eval_sources=()) -> dict:
    """eval/<metric> over all batches; with eval_sources, (name, its number of batches) in the
    batches' order (a mixture's), also eval/<name>/<metric> per source."""
    def add(a, b):
        return b if a is None else jax.tree.map(np.add, a, b)

    objective, frozen = program.objective, program.load_frozen()
    sums = weights = None
    per_source = {}
    ends = np.cumsum([count for _, count in eval_sources])
    for index, batch in enumerate(eval_batches):
        s, w = program.eval_step(params, batch, index, frozen)
        sums, weights = add(sums, s), add(weights, w)
        if eval_sources:
            name = eval_sources[int(np.searchsorted(ends, index, side="right"))][0]
            source_sums, source_weights = per_source.get(name, (None, None))
            per_source[name] = (add(source_sums, s), add(source_weights, w))
    row = {f"eval/{k}": float(v) for k, v in jax.device_get(objective.metrics(sums, weights)).items()}
    for name, (s, w) in per_source.items():
        row.update({f"eval/{name}/{k}": float(v) for k, v in jax.device_get(objective.metrics(s, w)).items()})
    return row


def _data_metrics(train_iter, share: int) -> dict:
    """A mixture's data/<name>/sequences, tokens (cumulative, summed over the data's shares), fraction and epochs
    (the most any share completed); {} otherwise. `share`: the stream this process reads (host_data_share)."""
    if not isinstance(train_iter, mixing.SourceCountingIterator):
        return {}
    counts = np.stack([train_iter.sequences, train_iter.tokens, train_iter.epochs])
    if jax.process_count() > 1:  # every process logs the same steps, so every one joins this gather
        gathered = np.asarray(multihost_utils.process_allgather(counts))
        shares = np.asarray(multihost_utils.process_allgather(np.int32(share)))
        counts = summed_over_shares(gathered, shares)
    return mixing.count_metrics(train_iter.names, counts[0], counts[1], counts[2])


def summed_over_shares(gathered: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """[process, 3, source] counts (sequences, tokens, epochs) -> [3, source]: sequences and tokens summed over one
    process of each share (processes of one share read the same stream: summed, each counted twice), epochs the
    most any share completed."""
    first = [int(np.flatnonzero(shares == share)[0]) for share in np.unique(shares)]
    one_each = gathered[first]
    return np.concatenate([one_each[:, :2].sum(axis=0), one_each[:, 2:].max(axis=0)])
