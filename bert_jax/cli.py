"""`bert-jax <command> ...`: one console script for the absl entry points.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny
    bert-jax tokenizer --out=/tmp/tok --vocab_size=8192
    bert-jax prepare --config=configs/tiny.py --out=/tmp/prepared --num_workers=2
    bert-jax prepare-beam --config=configs/tiny.py --out=/tmp/prepared --num_shards=8 --direct_num_workers=2
    bert-jax export --workdir=/tmp/bert_tiny --out=/tmp/bert_tiny_hf
    bert-jax extend-vocab --from=/tmp/bert_tiny_hf --corpus=/data/domain.txt --add=500 --out=/tmp/bert_tiny_domain
    bert-jax finetune --config=configs/finetune/classification.py --workdir=/tmp/cls --config.init_from=/tmp/bert_tiny
    bert-jax finetune-export --workdir=/tmp/cls --out=/tmp/cls_hf
    bert-jax inspect --from=/tmp/bert_tiny --text="the [MASK] sat on the mat" --mode=fill_mask
    bert-jax plan --config=configs/bert_large.py --num_devices=16 --hbm_gib=32
    bert-jax sweep run --sweep=configs/sweeps/tiny_lr.py --sweep_dir=runs/tiny_lr
"""
import importlib
import sys

COMMANDS = {
    "pretrain": "bert_jax.pretrain",
    "tokenizer": "data_pipelines.tokenizer",
    "prepare": "data_pipelines.prepare",
    "prepare-beam": "data_pipelines.prepare_beam",
    "export": "bert_jax.export",
    "extend-vocab": "bert_jax.extend_vocab",
    "plan": "bert_jax.plan.__main__",
    "inspect": "bert_jax.inspect",
    "finetune": "bert_jax.finetune.__main__",
    "finetune-export": "bert_jax.finetune.hf_export",
    "sweep": "launch.sweep",
    "tpu-vm": "launch.tpu_vm",
    "slurm": "launch.slurm",
    "local": "launch.local",
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        given = sys.argv[1] if len(sys.argv) > 1 else "(none)"
        sys.exit(f"bert-jax: unknown command {given}; commands: {', '.join(COMMANDS)}")
    command = sys.argv.pop(1)
    sys.argv[0] = f"bert-jax {command}"
    importlib.import_module(COMMANDS[command]).main()


if __name__ == "__main__":
    main()
