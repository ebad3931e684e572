"""μP's coordinate check: how large activations get in the first training steps, as the model widens.

    python bench/coord_check.py --out=/tmp/coord_check [--widths=64,128,256,512,1024] [--steps=5]

configs/tiny.py's 2-layer BERT (2 heads, FFN 4x the width) at each width, under the standard parametrization and
under μP (base width 64: the two are the same model there), trained --steps steps of Adam at one learning rate by
the run's own code (the family's module and objective, bert_jax.train.state's init, bert_jax.train.optimizer,
bert_jax.train.step), on random tokens. After each step it records the mean |activation| of the embeddings' output,
of each layer's attention and feed-forward outputs (what each layer adds to its residual stream, before the post-LN
LayerNorm, whose output is normalised at any width), and of the MLM logits, as microsoft/mup's `get_coord_data` does. Under μP each should stay about flat across
widths; under standard the updates' effect grows with the width (each coordinate of Wx moves by ~ lr x fan-in).
Writes coord_check.json, coord_check.md (a table per parametrization) and coord_check.png into --out.
"""
import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.configs import tiny
from bert_jax.families import get_family, model_for, mup_multipliers
from bert_jax.train.optimizer import make_optimizer
from bert_jax.train.state import make_init_fn
from bert_jax.train.step import make_train_step
from data_pipelines.loader import pipeline

BASE_WIDTH = 64


def config_at(width: int, parametrization: str, args):
    c = tiny.get_config()
    c.model.update(hidden_size=width, intermediate_size=4 * width, vocab_size=args.vocab_size,
                   parametrization=parametrization, mup_base_width=BASE_WIDTH)
    c.data.max_seq_length = args.seq_length
    c.train.update(learning_rate=args.learning_rate, warmup_steps=0, schedule="constant", num_steps=args.steps)
    return c


def random_batches(config, batch_size: int, steps: int, seed: int = 0) -> list[dict]:
    """`steps` batches shaped as the pipeline's (pipeline.batch_spec), of random tokens and masks."""
    rng = np.random.default_rng(seed)
    spec = pipeline.batch_spec(config.data, batch_size)
    batches = []
    for _ in range(steps + 1):  # the last one measures the params after the last step
        batch = {}
        for name, (shape, dtype) in spec.items():
            if name == "attention_mask" or name == "masked_weights":
                batch[name] = np.ones(shape, dtype)
            elif name == "input_ids" or name == "masked_ids":
                batch[name] = rng.integers(5, config.model.vocab_size, shape).astype(dtype)
            elif name == "masked_positions":
                batch[name] = np.stack([rng.choice(shape[1] * 0 + config.data.max_seq_length, shape[1], replace=False)
                                        for _ in range(shape[0])]).astype(dtype)
            elif name == "position_ids":
                batch[name] = np.broadcast_to(np.arange(shape[1]), shape).astype(dtype)
            else:  # token types, labels: 0/1
                batch[name] = rng.integers(0, 2, shape).astype(dtype)
        batches.append(jax.tree.map(jnp.asarray, batch))
    return batches


def activation_sizes(model, params, batch) -> dict[str, float]:
    """{name: mean |x| (a traced scalar)} of the embeddings, each layer's sublayer outputs and the MLM logits."""
    outputs, state = model.apply({"params": params}, batch, deterministic=True, capture_intermediates=True,
                                 mutable=["intermediates"])
    found = {"logits": jnp.mean(jnp.abs(outputs["mlm_logits"]))}

    def visit(path, leaf):
        keys = [str(getattr(k, "key", k)) for k in path]
        if keys[-2:-1] != ["__call__"]:
            return
        owner = keys[:-2]
        name = None
        if owner[-1:] == ["embeddings"]:
            name = "embeddings"
        elif len(owner) >= 2 and owner[-2].startswith("layers_") and owner[-1] in ("attention", "mlp_output"):
            name = f"{owner[-2]}/{owner[-1]}"
        if name is not None:
            found[name] = jnp.mean(jnp.abs(leaf))

    jax.tree_util.tree_map_with_path(visit, state["intermediates"])
    return found


def check(width: int, parametrization: str, args) -> list[dict]:
    config = config_at(width, parametrization, args)
    family = get_family(config.model.family)
    model, mup = model_for(config.model), mup_multipliers(config.model)
    tx = make_optimizer(config.train, None if mup is None else mup.learning_rate)
    state = jax.jit(make_init_fn(model, tx, config.data, seed=0, init_multipliers=None if mup is None else mup.init))()
    step = jax.jit(make_train_step(model, family.objective_for(config.model), tx, 1))
    measure = jax.jit(lambda params, batch: activation_sizes(model, params, batch))
    batches = random_batches(config, args.batch_size, args.steps)
    rows = []
    for t in range(1, args.steps + 1):
        state, _ = step(state, batches[t - 1])
        sizes = jax.device_get(measure(state.params, batches[t]))
        rows.append({"width": width, "step": t, **{k: float(v) for k, v in sizes.items()}})
    return rows


def table(rows: list[dict], parametrization: str, steps: tuple[int, ...]) -> str:
    names = [k for k in rows[0] if k not in ("width", "step")]
    names = ["embeddings"] + sorted(n for n in names if n.startswith("layers_")) + ["logits"]
    lines = [f"**{parametrization}**", "", "| width | step | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for row in rows:
        if row["step"] in steps:
            lines.append(f"| {row['width']} | {row['step']} | " + " | ".join(f"{row[n]:.3g}" for n in names) + " |")
    return "\n".join(lines)


def plot(results: dict, path: str, steps: int) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    shown = [k for k in next(iter(results.values()))[0] if k not in ("width", "step")]
    fig, axes = plt.subplots(2, len(shown), figsize=(3.2 * len(shown), 6), sharex=True)
    for row_axes, (parametrization, rows) in zip(axes, results.items()):
        for ax, name in zip(row_axes, shown):
            for t in range(1, steps + 1):
                points = sorted((r["width"], r[name]) for r in rows if r["step"] == t)
                ax.plot(*zip(*points), marker="o", label=f"step {t}", color=plt.cm.viridis(t / (steps + 1)))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{parametrization}: {name}", fontsize=9)
            ax.set_xlabel("width")
    axes[0][0].set_ylabel("mean |activation|")
    axes[1][0].set_ylabel("mean |activation|")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=72)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for coord_check.json, .md and .png")
    parser.add_argument("--widths", default="64,128,256,512,1024")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--learning_rate", type=float, default=1e-2)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--seq_length", type=int, default=64)
    parser.add_argument("--vocab_size", type=int, default=2048)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {}
    for parametrization in ("standard", "mup"):
        rows = []
        for width in (int(w) for w in args.widths.split(",")):
            rows += check(width, parametrization, args)
            print(f"{parametrization} width {width}: " + ", ".join(f"{k} {v:.3g}" for k, v in rows[-1].items()
                                                                  if k not in ("width", "step")), flush=True)
        results[parametrization] = rows
    with open(os.path.join(args.out, "coord_check.json"), "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    tables = [table(rows, p, (1, args.steps)) for p, rows in results.items()]
    with open(os.path.join(args.out, "coord_check.md"), "w") as f:
        f.write("\n\n".join(tables) + "\n")
    plot(results, os.path.join(args.out, "coord_check.png"), args.steps)
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
