"""Fine-tunes a battery of tasks over seeds from one checkpoint and writes its scoreboard
(bert_jax/finetune/battery.py, bert_jax/finetune/scoreboard.py).

    python -m bert_jax.evaluate --checkpoint=runs/bert_base --suite=glue --glue_dir=/data/glue \
        --out=runs/bert_base/glue [--tasks=sst2,cola] [--seeds=5]

--checkpoint: a pre-training workdir (its newest step, or DIR:STEP), an exported Hugging Face folder, or any
folder `transformers` loads of a registered family. --suite: glue, smoke (configs/suites/) or a suite file.
OUT gets scoreboard.json, .csv, .md (median, min–max, n, best lr per task; the average of the medians) and
scoreboard.png; the runs live in OUT/runs/<task>/lr=<lr>/seed=<s>. Rerun the same command after a kill: runs
with DONE are kept, the interrupted one resumes.
"""
import sys

from absl import app, flags

from bert_jax.train.log_filter import log_info_quietly

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Pre-training workdir (DIR or DIR:STEP) or Hugging Face folder.")
_SUITE = flags.DEFINE_string("suite", "glue", "A suite name (glue, smoke: configs/suites/) or a suite .py file.")
_GLUE_DIR = flags.DEFINE_string("glue_dir", "", "GLUE's directory layout: SST-2/train.tsv, SST-2/dev.tsv, ...")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", "", "Read TFDS's prepared glue/* here instead of --glue_dir.")
_TASKS = flags.DEFINE_string("tasks", "", "Comma-separated tasks of the suite to run (default: all).")
_SEEDS = flags.DEFINE_integer("seeds", None, "Seeds per task (0..N-1; default: the suite's).")
_OUT = flags.DEFINE_string("out", None, "Output directory: data/, runs/, scoreboard.*.")
flags.mark_flags_as_required(["checkpoint", "out"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    # Loaded once the flags parsed: --help and a bad flag answer without loading JAX and the fine-tuning code.
    from bert_jax.finetune import battery, scoreboard
    from bert_jax.train import harness
    from configs.suites import load_suite

    try:
        suite = load_suite(_SUITE.value)
        harness.setup_process(next(iter(suite.tasks.values())).finetune)  # before JAX starts its backend
        board = battery.evaluate(_CHECKPOINT.value, suite, _OUT.value, _GLUE_DIR.value, _TFDS_DATA_DIR.value,
                                 _TASKS.value, _SEEDS.value)
    except ValueError as e:  # bad input: named, before any training, nothing half-written in --out
        sys.exit(f"evaluate: {e}")
    if board is None:
        print("[evaluate] a run was preempted: run the same command again to go on")
        return
    print(scoreboard.markdown(board), end="")
    print(f"[evaluate] wrote {', '.join(scoreboard.FILES)} in {_OUT.value}")


def main() -> None:
    app.run(_main)


if __name__ == "__main__":
    main()
