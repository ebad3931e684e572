"""What the train step needs to know about an objective.

Every metric is a ratio `sum / weight`. The objective returns the numerators from
the model outputs and the denominators from the batch alone, so the step can total
the denominators over the whole global batch (and all accumulation micro-steps)
before dividing: the loss then does not depend on how the batch is split.
"""
import dataclasses
from typing import Callable

import jax

Sums = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Objective:
    # (outputs, batch) -> {metric name: numerator}; scalar float32 each.
    sums: Callable[[dict, dict], Sums]
    # batch -> {metric name: denominator}; same keys as `sums`.
    weights: Callable[[dict], Sums]
    # Metrics whose ratios add up to the training loss.
    loss_terms: tuple[str, ...]
    # The metrics the progress line, the eval line and the plots show besides the loss: an
    # objective without an MLM head (replaced-token detection) names its own.
    headline: tuple[str, ...] = ("mlm_accuracy",)
    # Scale of each loss term in the loss (default 1), e.g. ELECTRA's lambda = 50 on the discriminator's.
    loss_scales: dict[str, float] = dataclasses.field(default_factory=dict)
    # ratios -> further metrics computed from them: a ratio whose denominator the model decides (accuracy
    # on the tokens a generator replaced) is a quotient of two ratios over the same batch-only weight.
    derived: Callable[[dict], dict] | None = None

    def loss(self, sums: Sums, weights: Sums) -> jax.Array:
        return sum(self.loss_scales.get(k, 1.0) * sums[k] / jax.numpy.maximum(weights[k], 1e-9)
                   for k in self.loss_terms)

    def metrics(self, sums: Sums, weights: Sums) -> dict[str, jax.Array]:
        """Ratios of every metric, the `derived` ones, and `loss` (the scaled sum of the loss terms)."""
        out = {k: sums[k] / jax.numpy.maximum(weights[k], 1e-9) for k in sums}
        if self.derived is not None:
            out.update(self.derived(out))
        out["loss"] = self.loss(sums, weights)
        return out
