"""configs/sweeps/mup_transfer.py's points in one process, each width compiled once: the transfer table on a CPU.

    python bench/mup_transfer.py --out=/tmp/mup_transfer [--sweep=configs/sweeps/mup_transfer.py]

`bert-jax sweep run` starts one process per point; on a small CPU shared with other jobs each one's start-up
(imports, the data pipeline, compiling the step and the eval) costs minutes while its 150 steps cost seconds. This
runs the same points, with the same configs (launch/sweep.py's resolution of the sweep file), the same tokenizer,
data, init, step and eval code, in one process: the points that differ only in their learning rate share one
compiled step, built with a peak rate of 1 (the schedule's shape) and applied as
params + rate x (params after the step - params), which is the step at that rate (Adam's direction, clipping and
moments do not depend on the rate; the decoupled weight decay is in the update it scales). Each point restarts
from the same init and the same batches. Writes results.json and transfer.md (held-out MLM loss per point, the best
rate per width marked) and transfer.png into --out.
"""
import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.families import get_family, model_for, mup_multipliers
from bert_jax.launch import sweep as sweep_lib
from bert_jax.train.config_validation import check_config
from bert_jax.train.optimizer import make_optimizer
from bert_jax.train.state import make_init_fn
from bert_jax.train.step import make_eval_step, make_train_step
from data_pipelines.loader import pipeline
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

RATE = "train.learning_rate"


class Arm:
    """The compiled programs of one group of points (all keys but the learning rate equal)."""

    def __init__(self, config, tokenizer):
        family = get_family(config.model.family)
        self.config, self.objective = config, family.objective_for(config.model)
        model, mup = model_for(config.model), mup_multipliers(config.model)
        unit = config.train.copy_and_resolve_references()
        unit.learning_rate = 1.0  # the schedule's shape; each point scales the update by its own rate
        tx = make_optimizer(unit, None if mup is None else mup.learning_rate)
        self.init = jax.jit(make_init_fn(model, tx, config.data, config.seed,
                                         init_multipliers=None if mup is None else mup.init))
        train_step = make_train_step(model, self.objective, tx, 1)

        @jax.jit
        def step(state, batch, rate):
            moved, metrics = train_step(state, batch)
            params = jax.tree.map(lambda p, q: p + rate * (q - p), state.params, moved.params)
            return moved.replace(params=params), metrics

        self.step, self.eval_step = step, jax.jit(make_eval_step(model, self.objective, config.seed))
        host = dict(seed=config.seed, per_host_batch_size=config.train.global_batch_size)
        self.eval_batches = pipeline.build_eval_sets(config.data, tokenizer, **host)[0][1]
        iterator = pipeline.build_train_iterator(config.data, tokenizer, **host)
        self.batches = [next(iterator) for _ in range(config.train.num_steps)]

    def run(self, rate: float) -> dict:
        state = self.init()
        for batch in self.batches:
            state, metrics = self.step(state, batch, jnp.float32(rate))
        sums, weights = None, None
        for index, batch in enumerate(self.eval_batches):
            s, w = jax.device_get(self.eval_step(state.params, batch, index))
            sums = s if sums is None else jax.tree.map(np.add, sums, s)
            weights = w if weights is None else jax.tree.map(np.add, weights, w)
        evals = {k: float(v) for k, v in self.objective.metrics(sums, weights).items()}
        return {"eval/" + k: v for k, v in evals.items()} | {"train/loss": float(metrics["loss"])}


def table(results: list[dict], key: str) -> str:
    rates = sorted({r["rate"] for r in results})
    lines = ["| parametrization | width | " + " | ".join(f"{r:.4g}" for r in rates) + " | best |",
             "|---|---|" + "---|" * (len(rates) + 1)]
    for parametrization in ("standard", "mup"):
        for width in sorted({r["width"] for r in results}):
            row = {r["rate"]: r[key] for r in results if r["width"] == width and r["parametrization"] == parametrization}
            if not row:
                continue
            finite = {k: v for k, v in row.items() if np.isfinite(v)}
            best = min(finite, key=finite.get) if finite else None
            cells = [("**%.3f**" if k == best else "%.3f") % row[k] if k in row else "" for k in rates]
            lines.append(f"| {parametrization} | {width} | " + " | ".join(cells) + f" | {best:.4g} |")
    return "\n".join(lines)


def plot(results: list[dict], key: str, path: str) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    widths = sorted({r["width"] for r in results})
    for ax, parametrization in zip(axes, ("standard", "mup")):
        for i, width in enumerate(widths):
            points = sorted((r["rate"], r[key]) for r in results
                            if r["width"] == width and r["parametrization"] == parametrization)
            if points:
                ax.plot(*zip(*points), marker="o", label=f"width {width}", color=plt.cm.viridis(i / len(widths)))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate")
        ax.set_title(parametrization)
        ax.legend(fontsize=8)
    axes[0].set_ylabel(f"held-out {key}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep", default="configs/sweeps/mup_transfer.py")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sweep = sweep_lib.load_sweep(args.sweep)
    groups: dict[str, list[dict]] = {}
    for point in sweep_lib.sweep_points(sweep):
        key = json.dumps({k: v for k, v in point.items() if k != RATE}, sort_keys=True)
        groups.setdefault(key, []).append(point)
    tokenizer, results, started = None, [], time.time()
    for key, points in groups.items():
        config = check_config(sweep_lib.resolved_config(sweep["config"], {**sweep.get("overrides", {}), **points[0]}))
        if tokenizer is None:  # the points' data and tokenizer settings are one (the sweep shares one tokenizer)
            tokenizer = tokenizer_lib.prepare_tokenizer(config.data, os.path.join(args.out, "tokenizer"))
        arm = Arm(config, tokenizer)
        for point in points:
            row = {"parametrization": config.model.parametrization, "width": config.model.hidden_size,
                   "rate": point[RATE], **arm.run(point[RATE]), "elapsed_s": round(time.time() - started)}
            results.append(row)
            print(json.dumps(row), flush=True)
            with open(os.path.join(args.out, "results.json"), "w") as f:
                json.dump(results, f, indent=1)
    key = "eval/mlm_loss" if "eval/mlm_loss" in results[0] else "eval/loss"
    with open(os.path.join(args.out, "transfer.md"), "w") as f:
        f.write(f"held-out {key}, best per row in bold\n\n{table(results, key)}\n")
    plot(results, key, os.path.join(args.out, "transfer.png"))
    print(table(results, key))


if __name__ == "__main__":
    main()
