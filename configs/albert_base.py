"""ALBERT-base (Lan et al. 2020): BERT-base's encoder shape with 128-dim factorised embeddings and
all 12 layers sharing one set of parameters; MLM + SOP; 11.8M params (as AlbertForPreTraining).

    bert-jax pretrain --config=configs/albert_base.py --workdir=gs://BUCKET/albert_base \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export --workdir=gs://BUCKET/albert_base --out=albert_hf` writes a
folder `transformers.AutoModelForMaskedLM` / `AutoTokenizer` load (spiece.model).

The paper's recipe (§4.1), kept here: SentencePiece unigram vocabulary of 30K, SOP pairs,
n-gram masking (n <= 3, p(n) ∝ 1/n), sequences of 512 (10% shorter), 20 predictions per
sequence, batch 4096, LAMB at lr 0.00176 for 125K steps (3125 warmup), no dropout (v2).
At batch 4096 x 512 this needs a pod slice (the paper used TPU v3-64 to v3-512).

Tiny variant: 400 steps on the embedded corpus, a SentencePiece unigram of 2048 pieces
trained first; about a minute on a quiet 2-core CPU (3m25s measured on a busy one):

    bert-jax pretrain --config=configs/albert_base.py:tiny --workdir=runs/albert_tiny

The train loss (MLM + SOP) falls from ~7.9 (step 50) to ~6.7; eval MLM accuracy ~0.054 vs
the always-most-frequent-token floor of ~0.049, SOP still at chance (loss ~0.69). It
exercises every code path of the family, export included; it is not meant to learn much.
"""
from bert_jax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.model.family = "albert"
    c.model.vocab_size = 30000
    c.model.embedding_size = 128
    c.model.num_hidden_groups = 1  # all layers share one group's parameters
    c.model.hidden_act = "gelu_new"  # tanh-approximate GELU, as albert-*-v2
    c.model.pad_token_id = 0  # SentencePiece <pad>
    c.model.dropout_rate = 0.0
    c.model.attention_dropout_rate = 0.0

    c.data.tokenizer.kind = "unigram"
    c.data.tokenizer.lowercase = True
    c.data.example_builder = "sop"
    c.data.masking = "ngram"
    c.data.max_ngram = 3
    c.data.max_seq_length = 512
    # max_predictions_per_seq stays auto (77 at 15 % of 512). ALBERT's release capped it at 20, i.e. about
    # 4 % of a 512-token row; --config.data.mask_rate=0.039 trains at that rate, and says so.
    c.data.short_seq_prob = 0.1

    c.train.optimizer = "lamb"
    c.train.global_batch_size = 4096
    c.train.num_steps = 125_000
    c.train.learning_rate = 0.00176
    c.train.warmup_steps = 3_125
    c.train.weight_decay = 0.01
    c.checkpoint.every_steps = 5_000
    if arg == "tiny":
        shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/albert_base.py:{arg}: the only variant is 'tiny'")
    return c


def shrink_to_tiny(c) -> None:
    """A 64-wide, 4-layer (one shared group) model on the embedded corpus: a minute on 2 CPU cores."""
    c.model.vocab_size = 2048
    c.model.embedding_size = 32
    c.model.hidden_size = 64
    c.model.num_layers = 4
    c.model.num_hidden_groups = 1
    c.model.num_heads = 2
    c.model.intermediate_size = 256
    c.model.max_position_embeddings = 64
    c.model.dtype = "float32"  # bf16 matmuls are slow on CPU
    c.model.scan_layers = False
    c.data.source = "embedded"
    c.data.max_seq_length = 64
    c.train.optimizer = "adamw"  # LAMB's layer-wise trust ratio pays off at large batches only
    c.train.global_batch_size = 16
    c.train.num_steps = 400
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 40
    c.train.log_every_steps = 50
    c.train.eval_every_steps = 200
    c.checkpoint.every_steps = 200
