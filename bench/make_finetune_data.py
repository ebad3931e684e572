"""Makes the bigram-shift sentence-classification set of bench/finetune_vs_torch.py: CSVs we can ship.

    python bench/make_finetune_data.py --out=/tmp/bigram_shift [--seed=0] [--train=2000 --validation=500 --test=500]

Bigram shift (Conneau et al. 2018, "What you can cram into a single vector", SentEval's BShift):
a sentence from the embedded corpus (the documentation every Python interpreter ships), either
as written ("original") or with two adjacent words swapped ("shifted"). The label is word order
alone: vocabulary, length and topic are the same in both classes, so a model must read syntax.
Pre-trained encoders learn it well but not at once (BERT-base probes reach ~0.9), which makes it
a fine-tuning benchmark where the epochs matter. Every source sentence is used once, in one
split, either way round, so no split holds another's sentence. Deterministic by seed (and the
interpreter's version, which fixes the corpus); no download.

`--perturbation=shuffle` shuffles all of a sentence's words instead: an easier task (3 epochs of
MiniLM at lr 2e-5 on 512 bigram-shift sentences stayed at chance; see docs/results/benchmarks.md).

Writes OUT/train.csv, OUT/validation.csv and OUT/test.csv with columns `sentence,label`.
"""
import csv
import io
import random
import re
import sys

from absl import app, flags

from bert_jax.storage import paths
from data_pipelines.sources import corpus

LABELS = ("original", "shifted")
SPLITS = ("train", "validation", "test")
_WORD = re.compile(r"^[A-Za-z][A-Za-z'-]*[,;:.]?$")


def prose_sentences(min_words: int = 8, max_words: int = 24) -> list[str]:
    """Sentences of plain words (no code, no symbols) from the embedded corpus, each once, in corpus order."""
    seen, out = set(), []
    for document in corpus.embedded_documents():
        for sentence in document:
            words = sentence.split()
            if not min_words <= len(words) <= max_words or not all(_WORD.match(w) for w in words):
                continue
            if sentence not in seen:
                seen.add(sentence)
                out.append(sentence)
    return out


def shift_bigram(sentence: str, rng: random.Random) -> str:
    """The sentence with two adjacent, different words swapped (punctuation stays where it was)."""
    words = sentence.split()
    # The final word keeps its full stop: swap the bare words only.
    bare = [w.rstrip(",;:.") for w in words]
    tails = [w[len(b):] for w, b in zip(words, bare)]
    candidates = [i for i in range(len(words) - 1) if bare[i].lower() != bare[i + 1].lower()]
    i = rng.choice(candidates)
    bare[i], bare[i + 1] = bare[i + 1], bare[i]
    if i == 0:  # keep the capital where a sentence starts
        bare[0], bare[1] = bare[0][:1].upper() + bare[0][1:], bare[1][:1].lower() + bare[1][1:]
    return " ".join(b + t for b, t in zip(bare, tails))


def shuffle_words(sentence: str, rng: random.Random) -> str:
    """The sentence's words in another order (the easier task: any word may move)."""
    words = sentence.split()
    shuffled = words[:]
    while shuffled == words:
        rng.shuffle(shuffled)
    return " ".join(shuffled)


PERTURBATIONS = {"bigram_shift": shift_bigram, "shuffle": shuffle_words}


def make_splits(seed: int, sizes: dict[str, int], perturbation: str = "bigram_shift") -> dict[str, list[tuple[str, str]]]:
    """{split: [(sentence, label)]}, balanced per split."""
    if perturbation not in PERTURBATIONS:
        raise ValueError(f"--perturbation={perturbation!r}; expected one of {sorted(PERTURBATIONS)}")
    perturb = PERTURBATIONS[perturbation]
    rng = random.Random(seed)
    sentences = prose_sentences()
    total = sum(sizes.values())
    if total > len(sentences):
        raise ValueError(f"the corpus has {len(sentences)} usable sentences; {total} were asked for")
    rng.shuffle(sentences)
    splits, start = {}, 0
    for name in SPLITS:
        chosen = sentences[start:start + sizes[name]]
        start += sizes[name]
        rows = [(perturb(s, rng), LABELS[1]) if i % 2 else (s, LABELS[0]) for i, s in enumerate(chosen)]
        rng.shuffle(rows)
        splits[name] = rows
    return splits


def write_csv(path, rows: list[tuple[str, str]]) -> None:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(["sentence", "label"])
    writer.writerows(rows)
    paths.write_atomically(path, text.getvalue())


def read_csv(path: str, text_fields: tuple[str, ...] = ("sentence",),
             label_field: str = "label") -> tuple[list, list[str]]:
    """(texts, labels) of a CSV with a header: a text per row, or a tuple of texts per row with two text fields."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if len(text_fields) == 1:
        texts = [r[text_fields[0]] for r in rows]
    else:
        texts = [tuple(r[t] for t in text_fields) for r in rows]
    return texts, [r[label_field] for r in rows]


def make(out: str, seed: int = 0, train: int = 2000, validation: int = 500, test: int = 500,
         perturbation: str = "bigram_shift") -> dict[str, str]:
    """Writes the three CSVs into `out`; returns {split: path}."""
    splits = make_splits(seed, {"train": train, "validation": validation, "test": test}, perturbation)
    files = {}
    for name, rows in splits.items():
        files[name] = str(paths.path(out) / f"{name}.csv")
        write_csv(files[name], rows)
    return files


def _main(argv) -> None:
    del argv
    f = flags.FLAGS
    files = make(f.out, f.seed, f.train, f.validation, f.test, f.perturbation)
    print(" ".join(f"{k}={v}" for k, v in files.items()))


if __name__ == "__main__":
    flags.DEFINE_string("out", None, "Directory for train.csv, validation.csv and test.csv.")
    flags.DEFINE_integer("seed", 0, "Which sentences, and which get shifted.")
    flags.DEFINE_integer("train", 2000, "Training examples.")
    flags.DEFINE_integer("validation", 500, "Validation examples.")
    flags.DEFINE_integer("test", 500, "Test examples.")
    flags.DEFINE_enum("perturbation", "bigram_shift", list(PERTURBATIONS), "How a 'shifted' sentence is made.")
    flags.mark_flags_as_required(["out"])
    sys.exit(app.run(_main))
