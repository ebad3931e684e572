"""Averages checkpoints of one family and shape into a run that exports, fine-tunes and evaluates like any.

    bert-jax average --from=runs/decay_a:last,runs/decay_b:last [--weights=0.5,0.5] --out=runs/merged
    bert-jax average --from=runs/base:9000,runs/base:9500,runs/base:10000 --out=runs/base_lawa

`--from` names the checkpoints as `DIR:STEP` (STEP a number or `last`; `DIR:STEP:ema` for a run's EMA weights,
config.train.ema_decay); `--weights` weighs them (normalised to sum to 1; default: equal). The mean is taken in
float64 and cast back to each parameter's dtype. OUT gets the first source's config.json (plus `averaged_from`: each
source's workdir, step, ema and weight), its tokenizer/, a checkpoint at its step (params: the average; optimizer
state and step: the first source's) and DONE: `bert-jax export --workdir=OUT`, `config.init_from=OUT` and
`bert-jax evaluate --checkpoint=OUT` read it as they read any run; OUT/README.md is its Hub model card (its sources
and weights, bert_jax/train/model_card.py). Checkpoints of different families, or whose
parameter trees or shapes differ, are refused naming the first parameter that differs, before OUT is created.
"""
from absl import app, flags, logging

from bert_jax.checkpoint import averaging
from bert_jax.run import command_line, completion
from bert_jax.run.log_filter import log_info_quietly
from bert_jax.train import model_card


def _define_flags():
    flags.DEFINE_string("from", None, "The checkpoints to average: DIR:STEP,DIR:STEP[,...] (STEP a number or last; "
                                      "DIR:STEP:ema for a run's EMA weights).")
    flags.DEFINE_string("weights", None, "One positive weight per --from checkpoint, comma-separated (normalised); "
                                         "default: equal.")
    flags.DEFINE_string("out", None, "A new (or empty) directory for the averaged run.")
    flags.mark_flags_as_required(["from", "out"])


def average(from_text: str, weights: str | None, out: str,
            command: str = "bert_jax.commands.average.average (a library call)") -> int:
    """Checks everything, then writes the averaged run to `out`, its model card, and marks it DONE; returns its
    step. `command`: what made it, for the card."""
    sources = averaging.check(from_text, weights, out)
    step = averaging.write_average(sources, out)
    model_card.write_card(out, out, step, command)
    completion.write_done(out, step, step, "average")  # last: a reader may take the run as complete
    return step


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    f = flags.FLAGS
    step = average(f["from"].value, f.weights, f.out, command=model_card.command_line("average"))
    logging.info("averaged %s into %s (step %d)", f["from"].value, f.out, step)


def main() -> None:
    # Flags are defined here, not at import, so importing this module never clashes with other entry points'.
    _define_flags()
    command_line.run(_main)


if __name__ == "__main__":
    main()
