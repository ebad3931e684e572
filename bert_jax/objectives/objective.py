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
    # Each loss term's scale in the loss, in `loss_terms` order; empty: all 1 (a plain sum). Distillation
    # weighs its KL, MLM and cosine terms by config.
    loss_weights: tuple[float, ...] = ()

    def loss(self, sums: Sums, weights: Sums) -> jax.Array:
        ratio = lambda k: sums[k] / jax.numpy.maximum(weights[k], 1e-9)  # noqa: E731
        if not self.loss_weights:
            return sum(ratio(k) for k in self.loss_terms)
        return sum(scale * ratio(k) for k, scale in zip(self.loss_terms, self.loss_weights, strict=True))

    def metrics(self, sums: Sums, weights: Sums) -> dict[str, jax.Array]:
        """Ratios of every metric, plus `loss` (the sum of the loss terms)."""
        out = {k: sums[k] / jax.numpy.maximum(weights[k], 1e-9) for k in sums}
        out["loss"] = self.loss(sums, weights)
        return out
