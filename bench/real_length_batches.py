"""Batches of real-length documents, packed or padded, for bench/accelerator_throughput.py's packing section.

Pre-training corpora are mostly short: a Wikipedia paragraph or a web page's text
block runs to a few hundred tokens, far below 512, with a long tail. Document lengths
here are log-normal (median `median_tokens`, log-space sigma `sigma`), drawn from a
fixed seed, so both layouts see the same documents:

  packed   config.data.example_builder=packed: several documents per row, segment_ids
           1, 2, ... and positions restarting, so attention stays inside each document
  padded   doc_sentences: one document per row, padding to max_seq_length (documents
           longer than a row split into row-sized pieces, as packing does)

Rows are built by the pipeline's own builders (data_pipelines/examples/packing.py) and masked by
its MaskBatch, so the batches are exactly what pre-training would feed the step.
"""
import dataclasses

import numpy as np

from data_pipelines.examples import builders
from data_pipelines.loader import masking, pipeline
from data_pipelines.tokenizers.tokenizer import SpecialIds

LAYOUTS = {"packed": "packed", "padded": "doc_sentences"}  # layout -> config.data.example_builder


@dataclasses.dataclass
class LayoutBatches:
    batches: list[dict]  # batch_spec layout, numpy
    real_tokens: list[int]  # non-pad tokens per batch

    @property
    def fill(self) -> float:
        """Share of the batches' positions that hold real tokens."""
        total = sum(b["attention_mask"].size for b in self.batches)
        return sum(self.real_tokens) / total


def document_lengths(count: int, median_tokens: float, sigma: float, seed: int = 0) -> np.ndarray:
    """[count] int lengths in tokens, log-normal, at least 8."""
    rng = np.random.default_rng(seed)
    return np.maximum(np.rint(rng.lognormal(np.log(median_tokens), sigma, count)), 8).astype(np.int64)


def special_ids(model_cfg) -> SpecialIds:
    """Ids 0..4 for the specials, with padding where the model's position scheme expects it."""
    pad = model_cfg.get("pad_token_id", 0)
    others = iter(i for i in range(6) if i != pad)
    return SpecialIds(pad=pad, unk=next(others), cls=next(others), sep=next(others), mask=next(others))


def layout_batches(data_cfg, model_cfg, layout: str, lengths: np.ndarray, batch_size: int,
                   num_batches: int, seed: int = 0) -> LayoutBatches:
    """The first `num_batches` full batches that `layout` builds from documents of `lengths` tokens."""
    cfg = data_cfg.copy_and_resolve_references()
    cfg.example_builder = LAYOUTS[layout]
    ids = special_ids(model_cfg)
    builder = builders.make_builder(cfg, ids)
    mask_batch = pipeline.MaskBatch(
        masking.Masker(masking.MaskingSpec.from_config(cfg), ids), builders.example_keys(cfg), ids.pad,
    )
    rng = np.random.default_rng(seed)
    rows, batches, real = [], [], []
    for length in lengths:
        rows += builder.add_document([rng.integers(6, cfg.vocab_size, length, dtype=np.int32)], rng)
        while len(rows) >= batch_size:
            stacked = builder.stack(rows[:batch_size])
            rows = rows[batch_size:]
            batch = mask_batch.random_map(stacked, rng)
            batches.append(batch)
            real.append(int(batch["attention_mask"].sum()))
            if len(batches) == num_batches:
                return LayoutBatches(batches, real)
    raise ValueError(
        f"{len(lengths)} documents fill only {len(batches)} of {num_batches} {layout} batches of {batch_size}; "
        "draw more documents"
    )
