"""extend-vocab: a model and its tokenizer, grown by a domain's most fragmented words, as a new HF folder.

Works on Hugging Face folders, whatever the family: the tokenizer gains the words
(data_pipelines.tokenizers.extension), and every tensor indexed by token id gains their rows
(bert_jax.vocab.rows), in the main folder and in any subfolder (ELECTRA's and DeBERTa-v3's
generator). A workdir is exported first. The folder then continues pre-training through
`config.init_from_hf`, like any other.
"""
import dataclasses
import json
import tempfile

import ml_collections
from absl import logging

from bert_jax import UserError
from bert_jax.progress import progress
from bert_jax.train import export
from bert_jax.hf import folder as hf_folder
from bert_jax.vocab import rows as vocab_rows
from bert_jax.families import family_of_hf_config
from bert_jax.run.refusal import refusal
from bert_jax.storage import paths
from data_pipelines.shards import prepare
from data_pipelines.sources import documents as sources, file_listing
from data_pipelines.tokenizers import extension as tokenizer_extension
from bert_jax.vocab import mining as vocab_mining
from data_pipelines.tokenizers.tokenizer import load_tokenizer

REPORT_FILE = "extend_vocab_report.json"
REPORT_TABLE = "extend_vocab_report.md"


@dataclasses.dataclass(frozen=True)
class ExtendRequest:
    source: str  # an HF folder or a pre-training workdir
    corpus: str  # a file, folder, glob or bucket path of text / jsonl / parquet, or "embedded"
    out: str
    add: int | None = None
    min_saving: int | None = None
    init: str = "fvt"
    seed: int = 0
    corpus_source: str = ""  # text | jsonl | parquet; "" guesses from the path's extension
    field: str = "text"  # jsonl field / parquet column
    overwrite: bool = False


def corpus_config(corpus: str, source: str = "", field: str = "text") -> ml_collections.ConfigDict:
    """The `config.data` block sources.iter_documents reads `corpus` with, one segment per line."""
    if not source:
        source = ("embedded" if corpus == "embedded" else "jsonl" if corpus.endswith((".jsonl", ".jsonl.gz"))
                  else "parquet" if corpus.endswith(".parquet") else "text")
    return ml_collections.ConfigDict(dict(source=source, path=corpus, field=field,
                                          segmenter="line", max_line_bytes=1_000_000))


def corpus_segments(data_cfg: ml_collections.ConfigDict, desc: str = "extend-vocab: corpus"):
    """The corpus's segments, a progress bar over its text bytes (a rate alone where the size is unknown)."""
    bar = progress(total=file_listing.text_bytes(sources.check_source(data_cfg)), desc=desc, unit="B", unit_scale=True)
    for document in sources.iter_documents(data_cfg):
        bar.update(prepare.document_bytes(document))
        yield from document
    bar.close()


def _check_out(out: str, overwrite: bool) -> None:
    target = paths.path(out)
    taken = any(target.iterdir()) if target.is_dir() else target.exists()  # an empty folder is free
    if taken:
        if not overwrite:
            raise UserError(f"--out={out} already exists; pass --overwrite to replace it")
        target.rmtree() if target.is_dir() else target.unlink()


def _is_workdir(source: str) -> bool:
    return (paths.path(source) / "checkpoints").is_dir()


def _check_from(source: str) -> None:
    if not (paths.path(source) / "config.json").exists():  # a workdir's and an HF folder's alike
        raise UserError(f"--from={source} is neither a pre-training workdir (config.json, checkpoints/) nor a "
                        f"Hugging Face folder (config.json, model.safetensors)")


def _check_corpus(corpus: str, data_cfg) -> None:
    try:
        sources.check_source(data_cfg)
    except (ValueError, FileNotFoundError) as error:  # named by its config key; here the user gave a flag
        if refusal(error) is None:  # a fault reading the corpus keeps its traceback
            raise
        raise UserError(f"--corpus={corpus}: {error}") from error


def extend_vocab(request: ExtendRequest) -> dict:
    """Writes the extended HF folder to request.out, with its report (REPORT_FILE, REPORT_TABLE); returns the report."""
    if request.init not in vocab_rows.INITS:
        raise UserError(f"--init={request.init!r}; expected one of {vocab_rows.INITS}")
    vocab_mining.check_choice(request.add, request.min_saving)  # every input checked before --out is touched
    data_cfg = corpus_config(request.corpus, request.corpus_source, request.field)
    _check_corpus(request.corpus, data_cfg)
    _check_from(request.source)
    _check_out(request.out, request.overwrite)
    with tempfile.TemporaryDirectory() as scratch:
        hf_dir = request.source
        if _is_workdir(request.source):
            hf_dir = f"{scratch}/exported"
            step = export.export(request.source, hf_dir)
            logging.info("exported step %d of the workdir %s", step, request.source)
        return _extend_folder(request, hf_dir, data_cfg, scratch)


def _extend_folder(request: ExtendRequest, hf_dir: str, data_cfg, scratch: str) -> dict:
    where = f"--from={request.source}"
    hf_cfg = hf_folder.read_hf_config(hf_dir)
    family = family_of_hf_config(hf_cfg, where)
    tensors = vocab_rows.vocab_tensors(family)
    tokenizer = load_tokenizer(hf_dir)
    tokenizer_extension.check_extendable(tokenizer, where)

    before = vocab_mining.count_corpus(tokenizer, corpus_segments(data_cfg))
    chosen = vocab_mining.choose(vocab_mining.rank_candidates(tokenizer, before.word_counts), request.add,
                                 request.min_saving)
    if not chosen:
        raise UserError(f"--corpus={request.corpus}: no word of two or more pieces to add (it holds "
                         f"{len(before.word_counts)} distinct words)")
    words = [c.word for c in chosen]
    extended = tokenizer_extension.extend_tokenizer(tokenizer, words)
    first_new_id = tokenizer.get_vocab_size()
    pieces = [[int(i) for i in ids] for ids in tokenizer.encode_ids(words)]

    tokenizer_dir = f"{scratch}/tokenizer"
    extended.save(tokenizer_dir)
    new_vocab_size = None
    for folder, names in tensors.items():
        src = str(paths.path(hf_dir) / folder) if folder else hf_dir
        if folder and not (paths.path(src) / "config.json").exists():
            continue  # a folder without its generator (a released DeBERTa-v3): nothing to extend there
        cfg = hf_folder.read_hf_config(src)
        state = vocab_rows.extend_state(hf_folder.read_hf_state(src), names, first_new_id, pieces, request.init,
                                        request.seed, float(cfg.get("initializer_range", 0.02)), where=src)
        new_vocab_size = state[names[0]].shape[0]
        cfg = {**cfg, "vocab_size": new_vocab_size}
        dst = str(paths.path(request.out) / folder) if folder else request.out
        hf_folder.write_hf_folder(dst, state, cfg, tokenizer_dir)

    after = vocab_mining.count_corpus(load_tokenizer(request.out), corpus_segments(data_cfg, "extend-vocab: recount"),
                                      with_words=False)
    report = _report(request, family.name, tokenizer.kind, chosen, pieces, first_new_id, new_vocab_size, before,
                     after)
    paths.write_atomically(paths.path(request.out) / REPORT_FILE, json.dumps(report, indent=2) + "\n")
    paths.write_atomically(paths.path(request.out) / REPORT_TABLE, report_table(report))
    return report


def _report(request, family: str, kind: str, chosen, pieces, first_new_id: int, new_vocab_size: int,
            before: vocab_mining.CorpusCount, after: vocab_mining.CorpusCount) -> dict:
    saved = sum(c.saving for c in chosen)
    return {
        "from": request.source, "corpus": request.corpus, "family": family, "tokenizer_kind": kind,
        "init": request.init, "first_new_id": first_new_id, "vocab_size": new_vocab_size,
        "words": [{"word": c.word, "id": first_new_id + i, "frequency": c.frequency, "old_pieces": list(c.pieces),
                   "old_ids": ids, "tokens_saved": c.saving}
                  for i, (c, ids) in enumerate(zip(chosen, pieces))],
        "corpus_words": before.words,
        "tokens_before": before.tokens, "tokens_per_word_before": before.tokens_per_word,
        # Predicted: each added word's occurrences become one token, nothing else changes.
        "tokens_predicted": before.tokens - saved,
        "tokens_per_word_predicted": (before.tokens - saved) / max(before.words, 1),
        # Measured: the corpus re-tokenized by the written folder's tokenizer. It differs from the prediction
        # only where an added word also starts a longer word, which WordPiece and SentencePiece then cut anew.
        "tokens_after": after.tokens, "tokens_per_word_after": after.tokens_per_word,
        "continue_with": (f"--config.init_from_hf={request.out} --config.model.vocab_size={new_vocab_size} "
                          f"--config.train.new_rows_start={first_new_id}"),
    }


def report_table(report: dict) -> str:
    lines = [f"# extend-vocab: {len(report['words'])} words added to {report['from']} ({report['family']}, "
             f"{report['tokenizer_kind']} tokenizer, init {report['init']})", "",
             f"corpus {report['corpus']}: {report['corpus_words']} words; tokens per word "
             f"{report['tokens_per_word_before']:.4f} before, {report['tokens_per_word_predicted']:.4f} predicted, "
             f"{report['tokens_per_word_after']:.4f} measured after", "",
             f"continue: bert-jax pretrain --config=... {report['continue_with']}", "",
             "| id | word | frequency | old pieces | tokens saved |", "|---|---|---|---|---|"]
    lines += [f"| {w['id']} | {w['word']} | {w['frequency']} | {' '.join(w['old_pieces'])} | {w['tokens_saved']} |"
              for w in report["words"]]
    return "\n".join(lines) + "\n"
