r"""Look inside a model: fill-mask candidates and attention maps for one sentence, what each head looks at across
a corpus; or inside a run: its goodput.

    bert-jax inspect --from=runs/tiny --text="the cat sat on the [MASK]." --mode=fill_mask --top_k=5
    bert-jax inspect --from=/path/to/hf_folder --text="the cat sat on the mat." \
        --mode=attention --out=attention.png
    bert-jax inspect --from=runs/tiny --mode=heads --out=runs/tiny/heads [--corpus=FILE]
    bert-jax inspect --from=runs/tiny --mode=goodput
    bert-jax inspect --from=runs/tiny_clm --mode=generate --text="the cat" [--temperature=0.8 --max_new_tokens=32]

`--mode=generate` continues `--text` with a causally trained checkpoint (config.model.objective='clm', or a
ModernBertDecoderForCausalLM folder): greedy, or sampled at `--temperature` (bert_jax/inspect/generate.py).

`--mode=heads` measures every layer's and head's attention to [CLS], [SEP] and punctuation, to the previous, next
and same token, and its entropy, averaged over a corpus's sentences (`--corpus`, a sentence per line; default: the
run's own eval split), and writes a grid per statistic and a table into `--out` (bert_jax/inspect/heads.py).

`--mode=goodput` reads a workdir's goodput records (DIR/goodput/, one per start of the run) and prints where its
wall time went across every start, preemption and restart: productive steps against start-up, compiles, restores,
checkpoint saves, replayed steps, the time between starts, data waits and evaluation (bert_jax/run/goodput.py names
each category's counterpart in ML Goodput Measurement). Its last line is `goodput NN.N %`. It loads no model.

`--from` is a pre-training workdir (its newest checkpoint; `DIR:STEP` for another) or a Hugging
Face folder of any registered family, read as fine-tuning reads `config.init_from`. The mask is
written `[MASK]` or `<mask>`, whatever the tokenizer calls it. A workdir that is a branch or an averaged run
first prints where it came from (its lineage, its sources). The attention view runs the
reference (`xla`) kernel, which sows its probabilities into the `intermediates` collection;
only this tool makes that collection mutable, so training never pays for it ("What does BERT
look at?", Clark et al. 2019, reads the same maps).
"""
from collections.abc import Iterator

from absl import app, flags

from bert_jax.inspect import generate, heads, views
from bert_jax.run import command_line, goodput

GOODPUT = "goodput"


def _define_flags():
    flags.DEFINE_string("from", None, "A pre-training workdir (DIR or DIR:STEP) or a Hugging Face model folder.")
    flags.DEFINE_string("text", None, "The sentence; fill_mask: with [MASK] or <mask> where words are hidden. Not "
                        "for goodput.")
    flags.DEFINE_enum("mode", "fill_mask", [*views.MODES, heads.MODE, GOODPUT, generate.MODE], "fill_mask: top-k "
                      "tokens per mask; attention: a PNG grid; heads: what each head looks at across a corpus (grids "
                      "and a table); goodput: a run's wall time by category across its restarts (--from=DIR); "
                      "generate: a causally trained checkpoint continues --text.")
    flags.DEFINE_integer("max_new_tokens", 32, "generate: tokens to add at most (it stops earlier at [SEP]).")
    flags.DEFINE_float("temperature", 0.0, "generate: 0 = greedy; > 0 samples from softmax(logits / temperature).")
    flags.DEFINE_integer("seed", 0, "generate: the sampling seed.")
    flags.DEFINE_integer("top_k", 5, "fill_mask: candidates per mask.")
    flags.DEFINE_string("out", "attention.png", "attention: where to write the PNG; heads: the directory for the "
                        "grids and the table (local or a bucket).")
    flags.DEFINE_string("corpus", None, "heads: a text file, a sentence per line; default: the run's eval split.")
    flags.DEFINE_integer("max_sentences", 1000, "heads: the corpus's first sentences measured, at most.")
    flags.mark_flags_as_required(["from"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    if f.mode in (*views.MODES, generate.MODE) and f.text is None:
        raise app.UsageError(f"--mode={f.mode} needs --text")
    if f.mode == generate.MODE and (f.max_new_tokens < 1 or f.temperature < 0):
        raise app.UsageError(f"--mode=generate needs --max_new_tokens >= 1 (got {f.max_new_tokens}) and "
                             f"--temperature >= 0 (got {f.temperature})")
    if f.mode == heads.MODE:
        if not f["out"].present:
            raise app.UsageError("--mode=heads needs --out=DIR, the directory for the grids and the table")
        if f.max_sentences < 1:
            raise app.UsageError(f"--max_sentences={f.max_sentences}: measure at least 1")
    for line in inspect(f["from"].value, f.mode, text=f.text, top_k=f.top_k, out=f.out, corpus=f.corpus,
                        max_sentences=f.max_sentences, max_new_tokens=f.max_new_tokens, temperature=f.temperature,
                        seed=f.seed):
        print(line, flush=True)


def inspect(source: str, mode: str, text: str | None = None, top_k: int = 5, out: str = "attention.png",
            corpus: str | None = None, max_sentences: int = 1000, max_new_tokens: int = 32,
            temperature: float = 0.0, seed: int = 0) -> Iterator[str]:
    """The command's lines for `mode` on `source`, its files written as they come: the command without its flags,
    which tests of every family call in-process (tests/test_family_commands.py)."""
    if mode == GOODPUT:
        yield from goodput.report(source)
        return
    if mode == heads.MODE:
        heads.check_corpus(source, corpus)
    inspector = views.load(source)
    yield from views.provenance(source)  # a branch's ancestors, an averaged run's sources
    if mode == heads.MODE:
        sentence_ids = heads.sentences(source, corpus, inspector.tokenizer, inspector.max_length, max_sentences)
        stats, count = heads.measure(inspector, sentence_ids)
        written = heads.write(stats, count, corpus or f"the eval split of {source}", out)
        layers, num_heads = stats["cls"].shape
        yield f"heads: {layers} layers x {num_heads} heads over {count} sentences: {len(written)} files in {out}"
    elif mode == generate.MODE:
        generate.check_causal(inspector, source)
        continuation, ids = generate.generate(inspector, text, max_new_tokens, temperature, seed)
        yield f"generated {len(ids)} tokens ({'greedy' if temperature == 0 else f'temperature {temperature}'}):"
        yield text + continuation
    elif mode == "fill_mask":
        for i, candidates in enumerate(views.fill_mask(inspector, text, top_k)):
            yield f"mask {i + 1}: " + ", ".join(f"{token} {p:.3f}" for token, p in candidates)
    else:
        tokens, probs = views.attention_maps(inspector, text)
        views.plot_attention(tokens, probs, out)
        yield f"attention of {probs.shape[0]} layers x {probs.shape[1]} heads over {len(tokens)} tokens: {out}"


def main() -> None:
    _define_flags()
    command_line.run(_main)


if __name__ == "__main__":
    main()
