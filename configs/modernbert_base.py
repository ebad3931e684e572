"""ModernBERT-base (Warner et al. 2024): 22 layers, 768 wide, GeGLU, rotary positions, a global layer
every 3rd and a 128-token window elsewhere; 149,655,232 params (as ModernBertForMaskedLM).

    bert-jax pretrain --config=configs/modernbert_base.py --workdir=gs://BUCKET/modernbert_base \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export --workdir=gs://BUCKET/modernbert_base --out=modernbert_hf` writes a
folder `transformers.AutoModelForMaskedLM` / `AutoModel` / `AutoTokenizer` load.

The paper's recipe (§2.2, Table 3), kept here: 1.7T tokens at sequence 1024 (RoPE theta 10K
everywhere), then context extension to 8192 (global theta 160K) for 250B tokens, then 50B
tokens of annealing; MLM only at a 30 % mask rate, no NSP; unpadded, packed rows (several
documents per row, attention never crossing them); StableAdamW (b1 0.9, b2 0.98, eps 1e-6,
weight decay 1e-5 decoupled), peak lr 8e-4, a warmup-stable-decay (trapezoidal) schedule with
3B tokens of warmup and a 1-sqrt decay; batch-size warmup; an OLMo-style BPE of 50,368 tokens
with [CLS] [SEP] [MASK] [PAD] [UNK]. Here: sequence 1024 by default, the 8192 stage with
`--config.data.max_seq_length=8192` (and init_from_hf or a resume), WSD by
`config.train.schedule="wsd"`, AdamW in place of StableAdamW (neither optax nor any
well-kept JAX library provides it, see docs/guides/families.md), no batch-size warmup.

Tiny variant: 2 layers (one global, one local with a 16-token window), 64 wide, 400 steps on
the embedded corpus with a 2048-token BPE trained first:

    bert-jax pretrain --config=configs/modernbert_base.py:tiny --workdir=runs/modernbert_tiny

Not yet timed on a quiet machine; its 40-step, 32-wide version in
tests/test_families_pretrain.py (loss 6.93 -> 6.36, then export and reload in transformers)
took 80 s on a 2-core CPU at load average 17.
"""
from bert_jax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    set_modernbert(c)
    c.model.num_layers = 22
    c.model.hidden_size = 768
    c.model.num_heads = 12
    c.model.intermediate_size = 1152
    if arg == "tiny":
        shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/modernbert_base.py:{arg}: the only variant is 'tiny'")
    return c


def set_modernbert(c) -> None:
    """What ModernBERT base and large share: the architecture's keys, the data and the schedule."""
    c.model.family = "modernbert"
    c.model.vocab_size = 50368
    c.model.max_position_embeddings = 8192
    c.model.layer_norm_eps = 1e-5
    c.model.hidden_act = "gelu"
    c.model.dropout_rate = 0.0  # embedding and MLP dropout, as the paper
    c.model.attention_dropout_rate = 0.0
    c.model.initializer_cutoff_factor = 2.0
    c.model.local_attention = 128  # 64 tokens either side
    c.model.global_attn_every_n_layers = 3
    c.model.global_rope_theta = 160_000.0
    c.model.local_rope_theta = 10_000.0
    c.model.attention_bias = False
    c.model.mlp_bias = False
    c.model.norm_bias = False
    c.model.decoder_bias = True
    c.model.classifier_bias = False
    c.model.pad_token_id = 1  # the bpe kind numbers its specials [CLS]=0 [PAD]=1 [SEP]=2 [UNK]=3 [MASK]=4

    c.data.tokenizer.kind = "bpe"
    c.data.tokenizer.special_tokens = "[PAD],[UNK],[CLS],[SEP],[MASK]"
    c.data.tokenizer.lowercase = False
    c.data.example_builder = "packed"
    c.data.masking = "token"
    c.data.mask_rate = 0.3
    c.data.max_seq_length = 1024

    c.train.global_batch_size = 4608  # the paper's final batch, in sequences of 1024
    c.train.num_steps = 360_000
    c.train.schedule = "wsd"
    c.train.decay_fraction = 0.1
    c.train.learning_rate = 8e-4
    c.train.warmup_steps = 3_000
    c.train.b1 = 0.9
    c.train.b2 = 0.98
    c.train.eps = 1e-6
    c.train.weight_decay = 1e-5
    c.checkpoint.every_steps = 5_000


def shrink_to_tiny(c) -> None:
    """A 2-layer, 64-wide model on the embedded corpus: a minute or two on 2 CPU cores, same code paths."""
    c.model.vocab_size = 2048
    c.model.hidden_size = 64
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.intermediate_size = 96
    c.model.max_position_embeddings = 128
    c.model.local_attention = 16
    c.model.dtype = "float32"  # bf16 matmuls are slow on CPU
    c.model.scan_layers = False
    c.data.source = "embedded"
    c.data.max_seq_length = 128
    c.train.global_batch_size = 16
    c.train.num_steps = 400
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 40
    c.train.log_every_steps = 50
    c.train.eval_every_steps = 200
    c.checkpoint.every_steps = 200
