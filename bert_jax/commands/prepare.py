r"""Tokenizes a corpus into ArrayRecord shards, in parallel, in bounded memory (data_pipelines/shards/prepare.py).

    bert-jax prepare --config=configs/tiny.py --out=/tmp/corpus_prepared \
        --config.data.source=text --config.data.path='/data/wiki/*.txt.gz' \
        --num_workers=8 --docs_per_shard=10000
"""
import time
from collections.abc import Sequence

from absl import app, flags, logging

from bert_jax.run import command_line, process_setup
from data_pipelines.shards import prepare as prepare_lib


def _define_flags():
    from ml_collections import config_flags  # noqa: PLC0415

    config_flags.DEFINE_config_file("config", None, "Config file; its data block names the source; `bert-jax show-config --config=FILE` prints its keys.")
    flags.DEFINE_string("out", None, "Output directory (shards, tokenizer/, manifest.json).")
    flags.DEFINE_integer("num_workers", 1, "Worker processes; each tokenizes whole parts.")
    flags.DEFINE_integer("docs_per_shard", 10_000, "Documents per ArrayRecord shard, at most.")
    flags.DEFINE_integer("num_parts", 0, "Parts the source is cut into; 0 = from files and workers.")
    flags.mark_flags_as_required(["config", "out"])
    return flags.FLAGS


def _run(argv: Sequence[str], flag_values) -> None:
    del argv
    process_setup.setup_process(flag_values.config, join_run=False)  # before JAX starts its backend
    started = time.perf_counter()
    manifest = prepare_lib.prepare(
        flag_values.config.data,
        flag_values.out,
        num_workers=flag_values.num_workers,
        docs_per_shard=flag_values.docs_per_shard,
        num_parts=flag_values.num_parts,
    )
    logging.info("%s", prepare_lib.summary(manifest, time.perf_counter() - started))


def main() -> None:
    """Console-script entry point (`bert-jax prepare ...`)."""
    flag_values = _define_flags()
    command_line.run(lambda argv: _run(argv, flag_values))


if __name__ == "__main__":
    main()
