"""Both splits of a corpus hold a document: checked where a command starts, before anything is written.

The held-out set is chosen by document (corpus.is_eval_document on a document's id), and the `text` source ends a
document at a blank line. So a book with one verse per line and no blank line (a common layout: one sentence per
line) is one document, and one split gets none of it. A run on it failed after its workdir, config.json and tokenizer
were written, with a traceback ("the eval split gave 0 examples", or for prepared shards "shard 0 of 1 holds none of
the split's 0 documents") that named no cause a user could act on. `check_both_splits` reads the source's documents
(ids only: nothing is tokenized) until each split has one, which for any real corpus is its first few dozen, and
otherwise refuses in one line naming the path, its documents and the fix.
"""
from __future__ import annotations

from collections.abc import Iterator

import bert_jax
from data_pipelines.sources import corpus, documents, mixture, prepared
from data_pipelines.sources.readers import DiscardStats


def _document_ids(data_cfg) -> Iterator[int]:
    """The ids corpus.is_eval_document takes, for every document of the source, in file (or table) order."""
    source = documents.source_of(data_cfg)
    if source.tokenized:  # prepared shards: the manifest counts them (nothing opened)
        return iter(range(prepared.read_manifest(data_cfg.path)["documents"]))
    if isinstance(source, documents.TableSource):
        return iter(range(len(source.table(DiscardStats()))))
    return (corpus.file_document_id(file_index, index_in_file)
            for file_index, path in enumerate(source.check())
            for index_in_file, _ in enumerate(source.file_documents([path], DiscardStats())))


def check_both_splits(data_cfg, key: str = "config.data") -> None:
    """Raises bert_jax.UserError, one line, if the train or the eval split of `data_cfg`'s source (each source of a
    mixture) would hold no document."""
    if mixture.has_mixture(data_cfg):
        for name, source_cfg in mixture.source_configs(data_cfg).items():
            check_both_splits(source_cfg, f"config.data.mixture.{name}")
        return
    seen, count = set(), 0
    for count, document_id in enumerate(_document_ids(data_cfg), start=1):
        seen.add(corpus.is_eval_document(document_id, data_cfg.eval_fraction))
        if len(seen) == 2:
            return
    empty = "train" if True in seen else "eval"
    where = data_cfg.path or data_cfg.get("tfds_name", "") or data_cfg.source
    fix = documents.source_of(data_cfg).more_documents.format(where=where)
    raise bert_jax.UserError(
        f"{key}.path={where!r} holds {count} document{'s' if count != 1 else ''}, and "
        f"{key}.eval_fraction={data_cfg.eval_fraction:g} leaves the {empty} split none: {fix}")

