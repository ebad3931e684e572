"""How big a source is, for sampling a mixture by temperature (mixture.py: p_i proportional to n_i ** alpha).

A source's size is its number of documents, held-out ones included (each source holds out the same share, so the
shares do not move). A source read by index knows it without reading anything: prepared shards from their
manifest's count, the embedded corpus and TFDS from their tables. A source of files (text, jsonl, parquet) is
counted by one pass over its documents (a document at a time: bounded memory, bad records skipped as the loader
skips them). The size of a document is not weighed: XLM-R's and mmBERT's shares are of the data a language holds,
and a mixture here hands out whole sequences, so documents are its measure. A user who knows better sizes (tokens,
bytes) sets `config.data.mixture.<name>.size`, and no pass is made.
"""

from __future__ import annotations

import ml_collections

from data_pipelines.sources import documents as sources


def source_size(data_cfg: ml_collections.ConfigDict) -> tuple[int, str]:
    """(documents the source holds, how that was known) of one source's config.data."""
    source = sources.source_of(data_cfg)
    files = source.check()
    if isinstance(source, sources.TableSource):
        # A prepared directory's table is its manifest's count (PreparedDocuments reads no record for len()).
        return len(source.table(sources.SkipStats())), "its manifest" if source.sharded else "its table"
    count = sum(1 for _ in source.documents(0, 1, sources.SkipStats()))
    return count, f"a counting pass over {len(files)} file{'s' * (len(files) != 1)}"
