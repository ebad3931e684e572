"""When a fine-tuning run validates, logs and checkpoints: enough points for the learning curves to be read.

The diagnoser (bert_jax/finetune/diagnosis.py) reads a curve's shape, which takes points: a
3-epoch run validated once per epoch gives 3, too few to tell a saturated curve from a rising
one. So by default a run validates a fixed number of times, evenly spaced whatever its length
(`train.evals_per_run`), and once more before the first update: that point is the untrained
model, the start every "did it learn?" is measured from (a loss that shoots up in the first
steps and comes back has not learned). A validation pass is a forward pass over the validation
split, so the count, not the run's length, bounds its cost. The train loss is logged at least as
often as validation runs, so both curves have as many points. Checkpoints keep their epoch
cadence: more evaluations do not mean more saves.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Cadence:
    num_steps: int
    eval_every: int  # validate at multiples of this, at the last step, and at step 0
    log_every: int  # log the train loss at multiples of this and at the last step
    save_every: int  # checkpoint at multiples of this and at the last step

    def validates_at(self, step: int) -> bool:
        """Whether the run validates after `step` updates (step 0: before the first)."""
        return step % self.eval_every == 0 or step == self.num_steps


def make_cadence(train_cfg, checkpoint_cfg, num_steps: int, steps_per_epoch: int) -> Cadence:
    """`train.eval_every_steps` if set, else at least `train.evals_per_run` evenly spaced evaluations."""
    if train_cfg.eval_every_steps < 0 or train_cfg.evals_per_run < 1:
        raise ValueError(f"config.train.eval_every_steps={train_cfg.eval_every_steps} must be >= 0 (0: use "
                         f"train.evals_per_run) and config.train.evals_per_run={train_cfg.evals_per_run} >= 1")
    eval_every = train_cfg.eval_every_steps or max(1, num_steps // train_cfg.evals_per_run)
    log_every = max(1, min(train_cfg.log_every_steps, eval_every))
    return Cadence(num_steps, eval_every, log_every, checkpoint_cfg.every_steps or steps_per_epoch)
