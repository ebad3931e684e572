"""`bert-jax inspect --mode=heads`: what every attention head looks at across a corpus (Clark et al. 2019, §3).

    bert-jax inspect --mode=heads --from=runs/tiny --out=runs/tiny/heads               # the run's eval split
    bert-jax inspect --mode=heads --from=/path/to/hf_folder --corpus=sentences.txt --out=heads

A sentence is a line of `--corpus` (a text file, local or in a bucket; blank lines skipped) or, by default, a
segment of a held-out document of the run's own eval split (each source's, in turn, for a mixture: the documents the
run evaluates on, read by the loader's own feed). It runs as `[CLS] sentence [SEP]`, cut to the model's
positions. The probabilities are the ones the attention view reads (views.batch_attention: the reference kernel
sows them), so any registered family's heads are measured the same way; head_statistics.py holds the formulas.

OUT gets one grid per statistic (heads_<name>.png: layers down, heads across, each cell's value written in it) and
the table, a row per (layer, head): heads.csv, heads.md and heads.json (with the sentence count and the corpus).
"""
from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterable, Iterator

import jax.numpy as jnp
import numpy as np

from bert_jax import UserError
from bert_jax.checkpoint import reference
from bert_jax.inspect import head_statistics, views
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from data_pipelines.loader import pipeline
from data_pipelines.sources import documents as sources, mixture
from data_pipelines.tokenizers.tokenizer import special_ids

MODE = "heads"
BATCH_SIZE = 16  # sentences per forward pass
MIN_LENGTH = 8  # a batch is padded to a power of two from here (or the model's positions): few shapes to compile


def check_corpus(source: str, corpus: str | None) -> None:
    """Fails naming --corpus (or --from) before anything is read or written: a file that is not there, or no
    corpus for a Hugging Face folder (it has no eval split)."""
    if corpus is not None:
        if not paths.path(corpus).is_file():
            raise UserError(f"--corpus={corpus}: no such file; give a text file, a sentence per line")
        return
    if not Workdir(reference.split(source)[0]).holds_a_run():
        raise UserError(f"--from={source} is no pre-training run (no config.json and checkpoints/), so it has no "
                        "eval split to default to: give --corpus=FILE, a text file with a sentence per line")


def _file_sentences(corpus: str, tokenizer) -> Iterator[np.ndarray]:
    with paths.path(corpus).open() as lines:  # a line at a time: a corpus of any size
        for line in lines:
            if line.strip():
                yield tokenizer.encode_ids([line.strip()])[0]


def _eval_split_sentences(workdir: str, tokenizer) -> Iterator[np.ndarray]:
    """The segments of the run's held-out documents in the loader's eval order; a mixture's sources in turn."""
    data_cfg = Workdir(workdir).config().data
    cfgs = list(mixture.source_configs(data_cfg).values()) if mixture.has_mixture(data_cfg) else [data_cfg]
    feeds = [pipeline.document_feed(cfg, tokenizer, split="eval", shuffle_seed=None, shard_index=0,
                                    shard_count=1, stats=sources.SkipStats()).open(0, 0) for cfg in cfgs]
    segments = [(segment for _, document in feed for segment in document) for feed in feeds]
    for turn in itertools.zip_longest(*segments):  # round robin over the sources
        yield from (segment for segment in turn if segment is not None)


def sentences(source: str, corpus: str | None, tokenizer, max_length: int,
              max_sentences: int) -> list[np.ndarray]:
    """Up to `max_sentences` sentences as ids [length] int32: [CLS] sentence [SEP], at most `max_length` long."""
    specials = special_ids(tokenizer)
    pieces = (_file_sentences(corpus, tokenizer) if corpus is not None
              else _eval_split_sentences(reference.split(source)[0], tokenizer))
    out = []
    for ids in pieces:
        if len(ids):
            out.append(np.asarray([specials.cls, *np.asarray(ids)[:max_length - 2], specials.sep], np.int32))
            if len(out) == max_sentences:
                break
    if not out:
        raise UserError(f"--corpus={corpus} holds no sentence" if corpus is not None else
                        f"--from={source}: the run's eval split holds no sentence; give --corpus=FILE")
    return out


def _padded_length(longest: int, max_length: int) -> int:
    return min(max_length, max(MIN_LENGTH, 1 << (longest - 1).bit_length()))


def measure(inspector: views.Inspector, sentence_ids: Iterable[np.ndarray],
            batch_size: int = BATCH_SIZE) -> tuple[dict[str, np.ndarray], int]:
    """({statistic: [layers, heads]}, sentences measured) of the sentences (ids with [CLS] and [SEP])."""
    tokenizer = inspector.tokenizer
    specials = special_ids(tokenizer)
    punctuation_ids: dict[int, bool] = {}
    totals = head_statistics.HeadStatistics()
    sentence_ids = list(sentence_ids)
    for first in range(0, len(sentence_ids), batch_size):
        rows = sentence_ids[first:first + batch_size]
        lengths = np.array([len(r) for r in rows])
        ids = np.full((len(rows), _padded_length(int(lengths.max()), inspector.max_length)), specials.pad, np.int32)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
        real = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        for token in np.unique(ids):
            if int(token) not in punctuation_ids:
                punctuation_ids[int(token)] = head_statistics.is_punctuation(tokenizer.id_to_token(int(token)) or "")
        probs = views.batch_attention(inspector, {
            "input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray(real.astype(np.int32)),
            "token_type_ids": jnp.zeros_like(ids)})
        punctuation = np.vectorize(punctuation_ids.get, otypes=[bool])(ids)
        totals.add(head_statistics.sentence_statistics(probs, lengths, ids == specials.cls, ids == specials.sep,
                                                       punctuation))
    return totals.means(), totals.sentences


def table_rows(stats: dict[str, np.ndarray]) -> list[dict]:
    """A row per (layer, head): {"layer", "head", statistic: value, ...}."""
    layers, heads = next(iter(stats.values())).shape
    return [{"layer": layer, "head": head, **{name: float(stats[name][layer, head]) for name in stats}}
            for layer in range(layers) for head in range(heads)]


def _csv(rows: list[dict]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows)
    return text.getvalue()


def _markdown(rows: list[dict], caption: str) -> str:
    names = [k for k in rows[0] if k not in ("layer", "head")]
    lines = [caption, "", "| layer | head | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    lines += [f"| {r['layer']} | {r['head']} | " + " | ".join(f"{r[n]:.4f}" for n in names) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_grid(values: np.ndarray, title: str) -> bytes:
    """A PNG of one statistic: a cell per head (layers down, heads across), its value written in it."""
    # matplotlib costs about half a second to load, and only plots need it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"), so no display is needed

    layers, heads = values.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 1.5 + 0.6 * heads), max(3.0, 1.2 + 0.45 * layers)))
    image = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=9)
    middle = (values.max() + values.min()) / 2
    for layer, head in itertools.product(range(layers), range(heads)):
        ax.text(head, layer, f"{values[layer, head]:.3f}", ha="center", va="center", fontsize=6,
                color="black" if values[layer, head] > middle else "white")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return png.getvalue()


def write(stats: dict[str, np.ndarray], count: int, corpus: str, out: str) -> list[str]:
    """Writes the grids and the table into `out` (local or a bucket); returns the files written."""
    out_dir = paths.path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = table_rows(stats)
    written = {}
    for name, values in stats.items():
        title = f"{head_statistics.STATISTICS[name]}\nmean over {count} sentences"
        written[f"heads_{name}.png"] = plot_grid(values, title)
    written["heads.csv"] = _csv(rows)
    written["heads.md"] = _markdown(rows, f"What each head looks at, mean over {count} sentences of {corpus} "
                                          "(Clark et al. 2019; `bert-jax inspect --mode=heads`).")
    written["heads.json"] = json.dumps({"sentences": count, "corpus": corpus,
                                        "statistics": dict(head_statistics.STATISTICS),
                                        "heads": rows}, indent=1) + "\n"
    for name, data in written.items():
        paths.write_atomically(out_dir / name, data)
    return [str(out_dir / name) for name in written]
