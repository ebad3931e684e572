"""SpanBERT-base (Joshi et al. 2020): BERT-base's shape, span masking and the span boundary objective (SBO), no NSP.

    bert-jax pretrain --config=configs/spanbert_base.py --workdir=gs://BUCKET/spanbert_base \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export --workdir=gs://BUCKET/spanbert_base --out=spanbert_hf` writes a BertForMaskedLM folder
(`transformers.AutoModelForMaskedLM` loads it), the SBO head left out as in SpanBERT's released checkpoints.

The paper's recipe (§3.3 and Appendix B; facebookresearch/SpanBERT's pretraining command), kept here: cased
WordPiece of 28996, single contiguous segments of up to 512 tokens with no NSP (`full_sentences`), 15 % of
tokens masked in spans of whole words whose lengths are geometric (p = 0.2, at most 10 words; a mean of 3.8
words), 80/10/10 decided once per span; loss = MLM + SBO, the SBO predicting each span token from the two
tokens around the span and a 200-wide embedding of its position in the span (up to 15 tokens); batch 256,
2.4M steps, Adam (eps 1e-8) at lr 1e-4, 10K warmup, linear decay, weight decay 0.01, clipping at 1.0,
dropout 0.1. The ablation arms of docs/results/spanbert.md are overrides: `--config.model.sbo_loss_weight=0`
(span masking alone) and `--config.data.masking=token` (BERT's masking).

Tiny variant: 400 steps of batch 16 x 64 tokens on the embedded corpus, a WordPiece of 2048 trained first;
about 2 minutes on the busy 2-core CPU:

    bert-jax pretrain --config=configs/spanbert_base.py:tiny --workdir=runs/spanbert_tiny

Its progress line shows `sbo_accuracy` beside `mlm_accuracy`; metrics.jsonl holds `train/sbo_loss` and
`eval/sbo_loss`.
"""
from bert_jax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.model.family = "spanbert"
    c.model.vocab_size = 28996
    c.model.type_vocab_size = 2
    # The SBO (bert_jax/objectives/span_boundary.py): SpanBERT's --max-pair-targets 15, its 200-wide position
    # embeddings, --pair-loss-weight 1.0 (0: span masking alone, the head still logged).
    c.model.sbo_max_span_tokens = 15
    c.model.sbo_position_size = 200
    c.model.sbo_loss_weight = 1.0

    c.data.tokenizer.lowercase = False  # SpanBERT is cased
    c.data.example_builder = "full_sentences"  # single segments, no NSP (§3.3)
    c.data.masking = "span"
    c.data.span_p = 0.2
    c.data.max_span_length = 10
    c.data.span_boundaries = True  # the masker adds each prediction's span boundaries and offset
    c.data.max_seq_length = 512

    c.train.global_batch_size = 256
    c.train.num_steps = 2_400_000
    c.train.learning_rate = 1e-4
    c.train.warmup_steps = 10_000
    c.train.eps = 1e-8
    c.train.weight_decay = 0.01
    c.train.max_grad_norm = 1.0
    c.checkpoint.every_steps = 10_000
    if arg == "tiny":
        shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/spanbert_base.py:{arg}: the only variant is 'tiny'")
    return c


def shrink_to_tiny(c) -> None:
    """A 2-layer, 64-wide model on the embedded corpus: two minutes on 2 CPU cores, every code path."""
    c.model.vocab_size = 2048
    c.model.hidden_size = 64
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.intermediate_size = 256
    c.model.max_position_embeddings = 64
    c.model.sbo_position_size = 32  # 200 would outweigh the two 64-wide boundary states
    c.model.dtype = "float32"  # bf16 matmuls are slow on CPU
    c.model.scan_layers = False
    c.model.dropout_rate = 0.0
    c.model.attention_dropout_rate = 0.0
    c.data.source = "embedded"
    c.data.max_seq_length = 64
    c.train.global_batch_size = 16
    c.train.num_steps = 400
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 40
    c.train.log_every_steps = 50
    c.train.eval_every_steps = 200
    c.checkpoint.every_steps = 200
