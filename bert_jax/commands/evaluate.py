r"""Fine-tunes a battery of tasks (GLUE, STS) over seeds, and retrieves zero-shot (BEIR); writes a scoreboard.

    bert-jax evaluate --checkpoint=runs/bert_base --suite=glue --glue_dir=data/glue \
        --out=runs/bert_base/glue [--tasks=sst2,cola] [--seeds=5]
    bert-jax evaluate --checkpoint=runs/sbert --suite=retrieval --beir_dir=data/beir --out=runs/sbert/beir

--checkpoint: a pre-training workdir (its newest step, DIR:STEP, or DIR:STEP:ema for its EMA weights), an exported
Hugging Face folder, or any folder `transformers` loads of a registered family (a sentence-transformers folder
too). --suite: glue, smoke, retrieval, embeddings (configs/suites/) or a suite file. --beir_dir: BEIR-layout
datasets, one per subfolder (corpus.jsonl, queries.jsonl, qrels/test.tsv), for a suite with a retrieval section:
each subfolder is a task, its nDCG@10 the median (OUT/retrieval/<name>/ holds its metrics and run).
OUT gets scoreboard.json, .csv, .md (median, min–max, n, best lr per task, its chance and an "at chance" mark, its
runs' own diagnoses where they say "learns nothing" or "chaotic"; the average of the medians and how many tasks are at
chance or learned nothing) and scoreboard.png; the runs live in
OUT/runs/<task>/lr=<lr>/seed=<s>, each task's rows in OUT/data/<task>/ (a capped task's a seeded sample,
stratified by label: sample.json). Rerun the same command after a kill: runs with DONE are kept (each named), the
interrupted one resumes.

--executor=local (default) fine-tunes the runs here, one after another. --executor=ray submits each as a
`ray-tpu --command=bert_jax.finetune` job on a Ray cluster of TPU slices (launch/executors.py, as
`sweep run --executor=ray` does its points), a wave at a time: the runs that start from the checkpoint,
then those that start from another task's run (start_from_mnli); --address, --tpu, --max_wait, --python as
for the sweep. OUT must then be a bucket (gs://, s3://) unless each slice is one host.
"""
import argparse
import sys

from absl import app, flags

from bert_jax.run import command_line
from bert_jax.run.refusal import raised_on_purpose, reraise
from bert_jax.run.log_filter import log_info_quietly

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Pre-training workdir (DIR, DIR:STEP, DIR:STEP:ema) or Hugging "
                                  "Face folder.")
_SUITE = flags.DEFINE_string("suite", "glue", "A suite name (glue, smoke, retrieval, embeddings: configs/suites/) "
                             "or a suite .py file.")
_GLUE_DIR = flags.DEFINE_string("glue_dir", "", "GLUE's directory layout: SST-2/train.tsv, SST-2/dev.tsv, ...")
_BEIR_DIR = flags.DEFINE_string("beir_dir", "", "BEIR-layout datasets, one per subfolder: corpus.jsonl, "
                                "queries.jsonl, qrels/test.tsv (suites with retrieval).")
_TFDS_DATA_DIR = flags.DEFINE_string("tfds_data_dir", "", "Read TFDS's prepared glue/* here instead of --glue_dir.")
_TASKS = flags.DEFINE_string("tasks", "", "Comma-separated tasks of the suite to run (default: all).")
_SEEDS = flags.DEFINE_integer("seeds", None, "Seeds per task (0..N-1; default: the suite's).")
_OUT = flags.DEFINE_string("out", None, "Output directory: data/, runs/, scoreboard.*.")
_EXECUTOR = flags.DEFINE_enum("executor", "local", ["local", "ray"], "local: the runs here, one after another; "
                              "ray: each a `ray-tpu` job on a Ray cluster (launch/executors.py).")
_ADDRESS = flags.DEFINE_string("address", "", "ray: the cluster's HEAD_IP:PORT.")
_TPU = flags.DEFINE_string("tpu", "v4-8", "ray: the slice type each run gets.")
_MAX_WAIT = flags.DEFINE_float("max_wait", 86400.0, "ray: seconds a run waits for a free slice.")
_PYTHON = flags.DEFINE_string("python", "python3", "ray: the interpreter on the hosts.")
flags.mark_flags_as_required(["checkpoint", "out"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    # Loaded once the flags parsed: --help and a bad flag answer without loading JAX and the fine-tuning code.
    from bert_jax.finetune import battery, scoreboard
    from bert_jax.run import process_setup
    from bert_jax.configs.suites import load_suite
    from bert_jax.launch import executors

    checkpoint, out = _CHECKPOINT.value, _OUT.value
    try:
        args = argparse.Namespace(address=_ADDRESS.value, tpu=_TPU.value, max_wait=_MAX_WAIT.value,
                                  python=_PYTHON.value)
        chosen = executors.executor(_EXECUTOR.value)
        chosen.check(args, out, "--out")
        checkpoint, out, executor = chosen.battery(args, checkpoint, out)
        suite = load_suite(_SUITE.value)
        process_setup.setup_process(battery.process_config(suite))  # before JAX starts its backend
        board = battery.evaluate(checkpoint, suite, out, _GLUE_DIR.value, _TFDS_DATA_DIR.value, _TASKS.value,
                                 _SEEDS.value, executor=executor, beir_dir=_BEIR_DIR.value)
    except ValueError as e:  # what the suite, the battery and the executor refuse: bad input, named before any
        reraise(e)  # training, with nothing half-written in --out; a fault keeps its traceback
    except RuntimeError as e:  # a run the executor started that did not finish: its log says why (an XLA error
        if not raised_on_purpose(e):  # inside a run here is no such thing, and keeps its traceback)
            raise
        sys.exit(f"evaluate: {e}")
    if board is None:
        print("[evaluate] a run was preempted: run the same command again to go on")
        return
    print(scoreboard.markdown(board), end="")
    print(f"[evaluate] wrote {', '.join(scoreboard.FILES)} in {_OUT.value}")


def main() -> None:
    command_line.run(_main)


if __name__ == "__main__":
    main()
