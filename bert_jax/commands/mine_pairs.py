"""Mines contrastive training pairs, a BEIR-layout retrieval set and a stand-in STS set from a corpus without labels.

    bert-jax mine-pairs --corpus=embedded --out=data/mined [--max_documents=300] [--sentences=3]

The weakly-supervised stage after MLM (nomic's contrastors, GTE, E5): neighbouring passages of one document are
a positive pair (bert_jax/finetune/mining.py). --corpus: `embedded` (the text every Python interpreter ships,
configs/tiny.py's corpus) or a text file, one sentence per line and a blank line between documents. OUT gets
pairs.jsonl ({"sentence1", "sentence2"}: the training file of configs/finetune/sentence_embedding.py), beir/mined/
(a BEIR set from held-out documents: `bert-jax evaluate --suite=retrieval --beir_dir=OUT/beir`) and
glue/STS-B/ (neighbours scored 5, strangers 0: the `embeddings` suite's STS-B, a stand-in for the real one).
"""
import json

from absl import app, flags

from bert_jax import MissingPathError, UserError
from bert_jax.run import command_line, process_setup

_CORPUS = flags.DEFINE_string("corpus", "embedded", "`embedded`, or a text file: a sentence per line, a blank line "
                              "between documents.")
_OUT = flags.DEFINE_string("out", None, "Output directory: pairs.jsonl, beir/mined/, glue/STS-B/.")
_MAX_DOCUMENTS = flags.DEFINE_integer("max_documents", 0, "Read at most this many documents (0: all).")
_SENTENCES = flags.DEFINE_integer("sentences", 3, "Sentences per passage.")
_EVAL_FRACTION = flags.DEFINE_float("eval_fraction", 0.2, "Share of documents held out for the retrieval set.")
_MAX_QUERIES = flags.DEFINE_integer("max_queries", 500, "At most this many retrieval queries (0: all).")
flags.mark_flags_as_required(["out"])


def _documents(corpus: str, limit: int) -> list[list[str]]:
    from bert_jax.storage import paths  # noqa: PLC0415
    from data_pipelines.sources.corpus import embedded_documents  # noqa: PLC0415

    if corpus == "embedded":
        documents = embedded_documents()
    else:
        if not paths.path(corpus).exists():
            raise MissingPathError(f"--corpus={corpus!r} does not exist (`embedded`, or a text file)")
        text = paths.path(corpus).read_text(encoding="utf-8")
        documents = ([s.strip() for s in block.splitlines() if s.strip()] for block in text.split("\n\n"))
    out = []
    for d in documents:
        if d:
            out.append(d)
        if limit and len(out) == limit:
            break
    return out


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    process_setup.setup_process(join_run=False)  # before JAX starts its backend
    if _SENTENCES.value < 1:
        raise UserError(f"--sentences={_SENTENCES.value}: at least 1")
    if not 0.0 < _EVAL_FRACTION.value < 1.0:
        raise UserError(f"--eval_fraction={_EVAL_FRACTION.value}: a share strictly between 0 and 1")
    from bert_jax.finetune import mining  # noqa: PLC0415
    from bert_jax.progress import progress  # noqa: PLC0415
    from bert_jax.storage import paths  # noqa: PLC0415

    documents = _documents(_CORPUS.value, _MAX_DOCUMENTS.value)
    train, held_out = mining.split(documents, _EVAL_FRACTION.value)
    pairs = list(mining.neighbour_pairs(progress(train, desc="mine-pairs", unit="doc"), _SENTENCES.value))
    if not pairs or not held_out:
        raise UserError(f"--corpus={_CORPUS.value!r}: {len(documents)} documents give {len(pairs)} pairs and "
                        f"{len(held_out)} held-out documents; give more documents (or a lower --sentences)")
    out = paths.path(_OUT.value)
    paths.write_atomically(out / "pairs.jsonl", "".join(json.dumps(p) + "\n" for p in pairs))
    queries = mining.write_beir(held_out, str(out / "beir" / "mined"), _SENTENCES.value, _MAX_QUERIES.value)
    sts = mining.write_sts(held_out, str(out / "glue"), sentences=_SENTENCES.value)
    print(f"[mine-pairs] {len(pairs)} pairs from {len(train)} documents in {out / 'pairs.jsonl'}; {queries} queries "
          f"over {len(held_out)} held-out documents in {out / 'beir' / 'mined'}; {sts} STS rows in "
          f"{out / 'glue' / 'STS-B'}")


def main() -> None:
    command_line.run(_main)


if __name__ == "__main__":
    main()
