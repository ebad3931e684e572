r"""`prepare` on Apache Beam: the same shards and manifest (data_pipelines/shards/prepare_beam.py).

    bert-jax prepare-beam --config=configs/tiny.py --out=/tmp/corpus_prepared \
        --config.data.source=text --config.data.path='/data/wiki/*.txt.gz' --num_shards=64 \
        [--runner=DirectRunner --direct_num_workers=8 --direct_running_mode=multi_processing]

Every flag this module does not define is a Beam pipeline option.
"""
import time
from collections.abc import Sequence

from absl import app, flags, logging

from bert_jax.run import command_line
from data_pipelines.shards import prepare as prepare_lib
from data_pipelines.shards import prepare_beam as beam


def _define_flags():
    from ml_collections import config_flags  # noqa: PLC0415

    config_flags.DEFINE_config_file("config", None, "Config file; its data block names the source; `bert-jax show-config --config=FILE` prints its keys.")
    flags.DEFINE_string("out", None, "Output directory (shards, tokenizer/, manifest.json); may be gs:// or s3://.")
    flags.DEFINE_integer("num_shards", 64, "ArrayRecord shards; a document's shard is a hash of its record.")
    flags.DEFINE_integer("num_parts", 0, "Parts the source is read in; 0 = one per file (16 otherwise).")
    flags.DEFINE_bool("overwrite", False, "Replace an output prepared with other settings.")
    flags.mark_flags_as_required(["config", "out"])
    return flags.FLAGS


def _run(argv: Sequence[str], flag_values) -> None:
    started = time.perf_counter()
    manifest = beam.prepare_beam(
        flag_values.config.data,
        flag_values.out,
        argv[1:],
        num_shards=flag_values.num_shards,
        num_parts=flag_values.num_parts,
        overwrite=flag_values.overwrite,
    )
    logging.info("%s; fingerprint %s", prepare_lib.summary(manifest, time.perf_counter() - started),
                 manifest["fingerprint"])


def main() -> None:
    """Console-script entry point (`bert-jax prepare-beam ...`); unknown flags go to Beam."""
    flag_values = _define_flags()
    command_line.run(lambda argv: _run(argv, flag_values), known_only=True)


if __name__ == "__main__":
    main()
