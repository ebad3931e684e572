r"""Trains a WordPiece / BPE / SentencePiece tokenizer and saves it (data_pipelines/tokenizers/).

  bert-jax tokenizer --config=configs/tiny.py --out=/tmp/tok \
      [--config.data.tokenizer.kind=unigram] [--config.data.source=text --config.data.path=...]

It trains the configured kind on a `data.tokenizer.sample_bytes`-capped sample of the source's
training documents (data_pipelines/tokenizers/training.py) and saves it. Without --config it
trains WordPiece on the embedded corpus (`--vocab_size`, `--min_frequency`, `--eval_fraction`).
"""
import time
from collections.abc import Iterable, Sequence

from absl import app, flags, logging

from bert_jax.run import command_line, process_setup
from data_pipelines.tokenizers import tokenizer as tokenizer_lib


def _define_flags():
    # Defined when the command runs rather than at import, so that importing this module
    # next to other entry points (e.g. in one console script) cannot clash on flag names.
    from ml_collections import config_flags  # noqa: PLC0415

    config_flags.DEFINE_config_file("config", None, "Config whose data block says what to train; `bert-jax show-config --config=FILE` prints its keys.")
    flags.DEFINE_string("out", None, "Directory to write the tokenizer files to.")
    flags.DEFINE_integer("vocab_size", 8192, "Without --config: WordPiece vocabulary size.")
    flags.DEFINE_integer("min_frequency", 2, "Without --config: minimum count to enter the vocab.")
    flags.DEFINE_float("eval_fraction", 0.05, "Without --config: share of documents held out.")
    flags.mark_flag_as_required("out")
    return flags.FLAGS


def _run(argv: Sequence[str], flag_values) -> None:
    del argv
    process_setup.setup_process(flag_values.config, join_run=False)  # before JAX starts its backend
    # Here, not at import: they import the sources and the tokenizer libraries, which `--help` does not need.
    from data_pipelines.sources import corpus  # noqa: PLC0415
    from data_pipelines.tokenizers import training as tokenizer_training  # noqa: PLC0415
    from data_pipelines.tokenizers import wordpiece  # noqa: PLC0415

    start = time.perf_counter()
    record = None
    if flag_values.config is not None:
        tokenizer, record = tokenizer_training.train_from_config(flag_values.config.data)
    else:
        texts: Iterable[str] = (
            " ".join(document)
            for index, document in enumerate(corpus.embedded_documents())
            if not corpus.is_eval_document(index, flag_values.eval_fraction)
        )
        tokenizer = wordpiece.train_wordpiece(
            texts, flag_values.vocab_size, flag_values.min_frequency
        )
    tokenizer.save(flag_values.out)
    if record is not None:
        tokenizer_lib.write_sample_record(flag_values.out, record.to_json())
    logging.info(
        "Trained a %d-token %s tokenizer in %.1f s; wrote %s (sha256 %s)",
        tokenizer.get_vocab_size(),
        tokenizer.kind,
        time.perf_counter() - start,
        flag_values.out,
        tokenizer_lib.tokenizer_hash(flag_values.out),
    )


def main() -> None:
    """Console-script entry point."""
    flag_values = _define_flags()
    command_line.run(lambda argv: _run(argv, flag_values))


if __name__ == "__main__":
    main()
