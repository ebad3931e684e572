"""`bert-jax <command> ...`: one console script for every command; `bert-jax --help` lists them.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny
    bert-jax show-config --config=configs/roberta_base.py --config.data.mask_rate=0.2
    bert-jax tokenizer --out=/tmp/tok --vocab_size=8192
    bert-jax prepare --config=configs/tiny.py --out=/tmp/prepared --num_workers=2
    bert-jax prepare-beam --config=configs/tiny.py --out=/tmp/prepared --num_shards=8 --direct_num_workers=2
    bert-jax export --workdir=/tmp/bert_tiny --out=/tmp/bert_tiny_hf
    bert-jax extend-vocab --from=/tmp/bert_tiny_hf --corpus=/data/domain.txt --add=500 --out=/tmp/bert_tiny_domain
    bert-jax finetune --config=configs/finetune/classification.py --workdir=/tmp/cls --config.init_from=/tmp/bert_tiny
    bert-jax finetune-export --workdir=/tmp/cls --out=/tmp/cls_hf
    bert-jax evaluate --checkpoint=/tmp/bert_tiny --suite=glue --glue_dir=/data/glue --out=/tmp/bert_tiny_glue
    bert-jax inspect --from=/tmp/bert_tiny --text="the [MASK] sat on the mat" --mode=fill_mask
    bert-jax plan --config=configs/bert_large.py --num_devices=16 --hbm_gib=32
    bert-jax sweep run --sweep=configs/sweeps/tiny_lr.py --sweep_dir=runs/tiny_lr

`bert-jax <command> --help` shows that command's flags. Each command runs exactly as
`python -m <its module>` does (the module is run as __main__), so its help, its flags and its
exit status are the same either way.
"""
import runpy
import sys

# command -> (module run as __main__, what it does). Modules are found by name here, so that
# `bert-jax --help` imports none of them.
COMMANDS = {
    "pretrain": ("bert_jax.pretrain", "pre-trains an encoder; resumes from --workdir if it holds a checkpoint"),
    "show-config": ("bert_jax.show_config", "prints the resolved, validated config of --config and overrides"),
    "tokenizer": ("data_pipelines.tokenizer", "trains a WordPiece / BPE / SentencePiece tokenizer"),
    "prepare": ("data_pipelines.prepare", "tokenizes a corpus into ArrayRecord shards, in parallel"),
    "prepare-beam": ("data_pipelines.prepare_beam", "`prepare` on Apache Beam: the same shards and manifest"),
    "export": ("bert_jax.export", "writes a run's checkpoint as a Hugging Face folder (or params only)"),
    "extend-vocab": ("bert_jax.extend_vocab", "adds a domain's most fragmented words to a model's vocabulary"),
    "plan": ("bert_jax.plan", "compiles the train step ahead of time for N devices or a TPU slice"),
    "inspect": ("bert_jax.inspect", "fill-mask candidates and attention maps for a sentence"),
    "finetune": ("bert_jax.finetune", "fine-tunes from a pre-training run or a Hugging Face folder"),
    "finetune-export": ("bert_jax.finetune.hf_export", "writes a fine-tuned run as a Hugging Face folder"),
    "evaluate": ("bert_jax.evaluate", "fine-tunes a battery of tasks (GLUE) over seeds; writes a scoreboard of medians"),
    "sweep": ("launch.sweep", "one run per point of a grid of overrides; summaries of a sweep"),
    "tpu-vm": ("launch.tpu_vm", "creates Cloud TPU VMs and runs pre-training on every worker"),
    "slurm": ("launch.slurm", "an sbatch script for multi-node GPU pre-training"),
    "local": ("launch.local", "N processes of one command on this machine, joined by jax.distributed"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return ("usage: bert-jax <command> [flags]   (bert-jax <command> --help: its flags)\n\ncommands:\n"
            + "\n".join(lines) + "\n")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    if sys.argv[1] not in COMMANDS:
        sys.exit(f"bert-jax: unknown command {sys.argv[1]!r}\n\n{usage()}")
    module, _ = COMMANDS[sys.argv.pop(1)]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
