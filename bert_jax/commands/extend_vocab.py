"""Adds a domain's most fragmented words to a model's tokenizer and embeddings.

    bert-jax extend-vocab --from=HF_FOLDER_OR_WORKDIR --corpus=PATH --add=N --out=OUT
        [--min_saving=S] [--init=fvt|random|mean_of_all] [--overwrite]

`--corpus`: text (one segment a line), .jsonl (`--field`) or .parquet files, a folder or glob of them,
local or in a bucket, or `embedded`. OUT is a Hugging Face folder (every old id keeps its number and
its rows) with extend_vocab_report.json / .md: the words, their old pieces, and tokens per word
before, predicted and measured after. Continue pre-training with
`bert-jax pretrain --config=... --config.init_from_hf=OUT --config.model.vocab_size=<the report's>`.
The work is bert_jax.vocab.extension's; this is its command line.
"""
from absl import app, flags, logging

from bert_jax.run import command_line, process_setup
from bert_jax.run.refusal import reraise
from bert_jax.vocab.rows import INITS
from bert_jax.run.log_filter import log_info_quietly
from bert_jax.vocab.extension import ExtendRequest, extend_vocab, report_table


def _define_flags():
    # Defined when the command runs, so importing this module beside other entry points cannot clash.
    flags.DEFINE_string("from", None, "The model: a Hugging Face folder or a pre-training workdir.")
    flags.DEFINE_string("corpus", None, "The domain corpus: file, folder, glob or bucket path, or `embedded`.")
    flags.DEFINE_string("corpus_source", "", "text | jsonl | parquet; default: from the path's extension.")
    flags.DEFINE_string("field", "text", "The jsonl field / parquet column holding a document.")
    flags.DEFINE_integer("add", None, "How many words to add (the most tokens saved first).")
    flags.DEFINE_integer("min_saving", None, "Add every word saving at least this many tokens on the corpus.")
    flags.DEFINE_enum("init", "fvt", list(INITS), "New rows: fvt (mean of the old pieces' rows), random, "
                      "mean_of_all (ablations).")
    flags.DEFINE_integer("seed", 0, "Seed of --init=random.")
    flags.DEFINE_string("out", None, "The Hugging Face folder to write.")
    flags.DEFINE_bool("overwrite", False, "Replace --out if it exists.")
    flags.mark_flags_as_required(["from", "corpus", "out"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    process_setup.setup_process(join_run=False)  # before JAX starts its backend
    f = flags.FLAGS
    request = ExtendRequest(source=f["from"].value, corpus=f.corpus, out=f.out, add=f.add, min_saving=f.min_saving,
                            init=f.init, seed=f.seed, corpus_source=f.corpus_source, field=f.field,
                            overwrite=f.overwrite)
    try:
        report = extend_vocab(request)
    except ValueError as e:  # what the family and tokenizer checks refuse in --from: bad input, named; a fault
        reraise(e)  # (a bug, a library's error) keeps its traceback
    logging.info("wrote %s\n%s", f.out, report_table(report))


def main() -> None:
    _define_flags()
    command_line.run(_main)


if __name__ == "__main__":
    main()
