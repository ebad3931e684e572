"""Examples/s of masking + batching, ours vs Hugging Face's DataCollatorForLanguageModeling.

    taskset -c 0 python bench/masking_throughput.py

Both sides get the same 256 rows of token ids per batch (as separate per-example arrays,
as a loader hands them over) and must return a masked [256, L] batch; ours also emits
the gathered-head layout (masked_positions/ids/weights). One thread: the BLAS/OpenMP
env vars are pinned to 1 before numpy loads. Goal: >= 10x the HF collator.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from transformers import BertTokenizerFast, DataCollatorForLanguageModeling  # noqa: E402

from data_pipelines.loader import masking  # noqa: E402
from data_pipelines.tokenizers.tokenizer import SpecialIds  # noqa: E402

VOCAB, BATCH, REPEATS = 8192, 256, 5
SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def _rows(length: int, rng) -> list[np.ndarray]:
    ids = rng.integers(5, VOCAB, (BATCH, length)).astype(np.int64)
    ids[:, 0], ids[:, -1] = SPECIALS.cls, SPECIALS.sep
    return list(ids)


def _rate(fn) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(REPEATS):
        fn()
    return BATCH * REPEATS / (time.perf_counter() - start)


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"t{i}" for i in range(VOCAB - 5)]
        with open(os.path.join(d, "vocab.txt"), "w") as f:
            f.write("\n".join(vocab) + "\n")
        hf = DataCollatorForLanguageModeling(BertTokenizerFast(os.path.join(d, "vocab.txt")),
                                             mlm_probability=0.15, return_tensors="np")
    word_starts = np.random.default_rng(1).random(VOCAB) < 0.7
    rng = np.random.default_rng(0)
    print(f"{'seq':>4} {'mode':>10} {'ours ex/s':>10} {'HF ex/s':>9} {'speed-up':>8}")
    for length in (128, 512):
        rows = _rows(length, rng)
        hf_rate = _rate(lambda: hf([{"input_ids": r} for r in rows]))
        for mode in masking.MASKING_MODES.names():
            spec = masking.MaskingSpec(mode, 0.15, int(length * 0.15) + 4, VOCAB)
            masker = masking.Masker(spec, SPECIALS, word_starts)
            ours = _rate(lambda: masker(np.stack(rows).astype(np.int32), rng))
            print(f"{length:>4} {mode:>10} {ours:>10.0f} {hf_rate:>9.0f} {ours / hf_rate:>7.1f}x")


if __name__ == "__main__":
    main()
