"""RoBERTa-base (Liu et al. 2019): BERT-base's shape, byte-level BPE, MLM only; 124.7M params
(as RobertaForMaskedLM).

    bert-jax pretrain --config=configs/roberta_base.py --workdir=gs://BUCKET/roberta_base \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export --workdir=gs://BUCKET/roberta_base --out=roberta_hf` writes a
folder `transformers.AutoModelForMaskedLM` / `AutoTokenizer` load.

The paper's recipe (Table 9), kept here: batch 8K sequences of 512 tokens, 500K steps, Adam
(b2 0.98, eps 1e-6), peak lr 6e-4, 24K warmup steps, linear decay, weight decay 0.01,
dropout 0.1, FULL-SENTENCES inputs (no NSP), masks drawn afresh every time a sequence is
seen. At 8K x 512 this needs a pod slice (e.g. v4-128); on fewer chips keep the
global batch with --config.train.grad_accum_steps.

Tiny variant: 400 steps on the embedded corpus, a byte-level BPE of 2048 tokens trained
first; about a minute on a quiet 2-core CPU (1m50s measured on a busy one):

    bert-jax pretrain --config=configs/roberta_base.py:tiny --workdir=runs/roberta_tiny

The train loss falls from ~7.6 (step 10) to ~6.3 (eval 6.2); MLM accuracy stays near the
always-most-frequent-token floor (~0.04). It exercises every code path of the family,
export included; it is not meant to learn much.
"""
from bert_jax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.model.family = "roberta"
    c.model.vocab_size = 50265
    c.model.max_position_embeddings = 514  # 512 tokens; rows 0 and 1 belong to padding (fairseq positions)
    c.model.type_vocab_size = 1
    c.model.layer_norm_eps = 1e-5
    c.model.pad_token_id = 1  # byte-level BPE's <pad>; positions start at pad_token_id + 1

    c.data.tokenizer.kind = "bpe"
    c.data.example_builder = "full_sentences"
    c.data.masking = "token"
    c.data.max_seq_length = 512

    c.train.global_batch_size = 8192
    c.train.num_steps = 500_000
    c.train.learning_rate = 6e-4
    c.train.warmup_steps = 24_000
    c.train.b2 = 0.98
    c.train.eps = 1e-6
    c.train.weight_decay = 0.01
    c.checkpoint.every_steps = 5_000
    if arg == "tiny":
        shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/roberta_base.py:{arg}: the only variant is 'tiny'")
    return c


def shrink_to_tiny(c) -> None:
    """A 2-layer, 64-wide model on the embedded corpus: a minute on 2 CPU cores, same code paths."""
    c.model.vocab_size = 2048
    c.model.hidden_size = 64
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.intermediate_size = 256
    c.model.max_position_embeddings = 64 + 2
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
