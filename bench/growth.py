"""Does growing a model from a smaller one (`config.grow_from`) save steps? Three runs on configs/tiny.py's corpus:

  small   a tiny BERT (2 layers, hidden 64) pre-trained for --small_steps;
  grown   a deeper and wider one (4 layers, hidden 128, 4 heads, intermediate 512) started from small's last
          checkpoint (weights tiled from the middle, layers repeated: bert_jax/train/growth.py), --steps steps;
  random  the same bigger model from a random init, the same steps, schedule, seed and tokenizer (small's).

Reported: each bigger run's first loss (step 1, before any update has changed much), its last loss (the mean of the
last --window logged losses) and the step at which the grown run's --window-step moving average first reaches the
random run's last loss. Every step is logged (train/loss per step).

    nice python bench/growth.py --out=/tmp/growth_bench [--small_steps=300 --steps=200]

writes OUT/growth.json and prints the table of docs/results/growth.md.
"""
import argparse
import json
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bert_jax.configs import tiny  # noqa: E402
from bert_jax.train.loop import train_and_evaluate  # noqa: E402

SMALL = dict(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=256)
BIG = dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512)


def micro_config(steps: int, model: dict):
    """configs/tiny.py with a 2048-token vocabulary, sequences of 64: minutes on 2 CPU cores."""
    c = tiny.get_config()
    c.model.vocab_size = 2048
    c.model.update(model)
    c.model.max_position_embeddings = c.data.max_seq_length = 64
    c.data.num_eval_batches = 4
    c.train.global_batch_size = 32
    c.train.num_steps = steps
    c.train.warmup_steps = max(steps // 10, 1)
    c.train.learning_rate = 2e-3
    c.train.log_every_steps = 1
    c.train.eval_every_steps = c.checkpoint.every_steps = steps
    c.logging.plots = False
    return c


def losses(workdir: pathlib.Path) -> tuple[list[float], float]:
    """(train/loss per step, the last eval/loss)."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["train/loss"] for r in rows if "train/loss" in r], [r["eval/loss"] for r in rows if "eval/loss" in r][-1]


def steps_to_reach(curve: list[float], target: float, window: int) -> int | None:
    """The first step whose trailing `window`-step mean is at or below `target`; None if never."""
    means = np.convolve(curve, np.ones(window) / window, mode="valid")
    hits = np.nonzero(means <= target)[0]
    return int(hits[0]) + window if len(hits) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--small_steps", type=int, default=300)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--window", type=int, default=10)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seconds = {}

    def run(name: str, config) -> pathlib.Path:
        workdir = out / name
        if not (workdir / "DONE").exists():
            start = time.perf_counter()
            train_and_evaluate(config, str(workdir))
            seconds[name] = round(time.perf_counter() - start, 1)
        return workdir

    small = run("small", micro_config(args.small_steps, SMALL))
    grown_config = micro_config(args.steps, BIG)
    grown_config.grow_from = f"{small}:last"
    grown = run("grown", grown_config)
    random_config = micro_config(args.steps, BIG)
    random_config.data.tokenizer.path = str(small / "tokenizer")  # the grown run's tokens
    random = run("random", random_config)

    curves = {name: losses(out / name) for name in ("small", "grown", "random")}
    last = {name: float(np.mean(curve[-args.window:])) for name, (curve, _) in curves.items()}
    reach = steps_to_reach(curves["grown"][0], last["random"], args.window)
    result = {
        "small": {**SMALL, "steps": args.small_steps, "last_loss": last["small"], "eval_loss": curves["small"][1]},
        "big": {**BIG, "steps": args.steps},
        "grown": {"first_loss": curves["grown"][0][0], "last_loss": last["grown"], "eval_loss": curves["grown"][1]},
        "random": {"first_loss": curves["random"][0][0], "last_loss": last["random"],
                   "eval_loss": curves["random"][1]},
        "grown_steps_to_random_last_loss": reach, "window": args.window, "seconds": seconds,
        "machine": f"{platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores",
    }
    (out / "growth.json").write_text(json.dumps(result, indent=2))
    print(f"| run | first loss | last loss (mean of last {args.window}) | eval loss |")
    print("|---|---|---|---|")
    print(f"| small ({args.small_steps} steps) | {curves['small'][0][0]:.3f} | {last['small']:.3f} | "
          f"{curves['small'][1]:.3f} |")
    for name in ("grown", "random"):
        print(f"| {name} ({args.steps} steps) | {result[name]['first_loss']:.3f} | {last[name]:.3f} | "
              f"{result[name]['eval_loss']:.3f} |")
    print(f"grown run reaches the random init's last loss ({last['random']:.3f}) at step {reach} of {args.steps}")
    print(json.dumps(seconds))


if __name__ == "__main__":
    main()
