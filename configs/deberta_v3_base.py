"""DeBERTa-v3-base (He et al. 2023): 12 layers, hidden 768, 12 heads, MLP 3072, disentangled attention
with 256 log-buckets over relative distances up to 512, a 128K SentencePiece vocabulary. The
discriminator is DebertaV2Model's 183.8M params (86M backbone + 98M embeddings) plus a 0.6M
replaced-token head; the 6-layer generator is a 142.0M DebertaV2ForMaskedLM sharing its table.

    bert-jax pretrain --config=configs/deberta_v3_base.py --workdir=gs://BUCKET/deberta_v3_base \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

It trains by replaced-token detection (He et al. 2023 §3): a generator of the same width and half
the depth fills the masks, the discriminator tells replaced tokens from original ones, loss =
generator MLM + 50 x discriminator BCE, and the discriminator's word table is the generator's behind
a stop-gradient plus its own delta (GDES). The progress line shows the discriminator's accuracy (on
all tokens, replaced ones, original ones) and the generator's MLM accuracy.

Then `bert-jax export --workdir=gs://BUCKET/deberta_v3_base --out=deberta_hf` writes the
discriminator, with the merged table, as a DebertaV2Model folder (config.json, model.safetensors,
DebertaV2Tokenizer files) that `transformers.AutoModel` / `AutoTokenizer` load, as a released
DeBERTa-v3 checkpoint is; `--config.init_from_hf=FOLDER` continues pre-training from one (the
generator starts afresh: checkpoints hold the discriminator only).

The paper's recipe (He et al. 2023, §5 and appendix, as we read it; check it against the paper
before a real run): the 160GB corpus of DeBERTa/RoBERTa, batch 8K sequences of 512 tokens, 500K
steps, AdamW (b1 0.9, b2 0.98, eps 1e-6), 10K warmup steps then linear decay, weight decay 0.01,
gradient clipping 1.0, dropout 0.1 (attention dropout is 0 here as in every config, configs/base.py;
`--config.model.attention_dropout_rate=0.1` restores it, inside the fused kernel on a TPU).

Tiny variant: a 2-layer discriminator and a 1-layer generator, 64 wide, 1500 steps of batch 16 x 64
tokens on the embedded corpus with a 2048-piece unigram tokenizer; about 4-5 minutes on the busy 2-core CPU:

    bert-jax pretrain --config=configs/deberta_v3_base.py:tiny --workdir=runs/deberta_tiny

It takes the tiny ELECTRA's departures from the paper (configs/electra_small.py): 30% masked, samples
at temperature 2; at 15%, temperature 1 and lr 2e-3 the discriminator answered "original" everywhere
from about step 100 (0.8604 = the all-original rate after 400 steps). Measured (test_deberta_v3_pretrain.py,
slow): eval discriminator accuracy 0.7648 against the all-original rate 0.7147 (replaced tokens 0.4128,
original 0.9053), generator MLM accuracy 0.1915 against the most-frequent-token floor 0.0401.
"""
from bert_jax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.model.family = "deberta_v3"
    c.model.vocab_size = 128100
    c.model.type_vocab_size = 0  # DeBERTa-v3 has no token types
    c.model.layer_norm_eps = 1e-7
    c.model.position_buckets = 256
    c.model.max_relative_positions = 512
    c.model.pad_token_id = 0  # the unigram tokenizer's <pad>
    # auto: on a TPU target the fused disentangled-attention Pallas kernel (bert_jax/kernels/disentangled_attention.py,
    # no [batch, heads, q, k] tensor in HBM; attention dropout in its tiles), elsewhere the xla kernel.
    c.model.attention_impl = "auto"
    # The layer loop stays on a GPU too: unrolled, XLA's GPU compiler counted 10 % fewer bytes per step at (512, 32)
    # but 2.3x the peak (14.6 -> 33.5 GiB; docs/results/gpu.md, 2026-12-04).
    c.model.unroll_on_gpu = False
    c.model.generator_num_layers = 6  # half the discriminator's depth, the same width (GDES shares one table)
    c.model.discriminator_loss_weight = 50.0  # lambda (He et al. 2023 §3, after Clark et al. 2020)
    c.model.sampling_temperature = 1.0

    c.data.tokenizer.kind = "unigram"
    c.data.tokenizer.lowercase = False  # DeBERTa-v3's vocabulary is cased
    c.data.example_builder = "full_sentences"
    c.data.masking = "token"
    c.data.max_seq_length = 512

    c.train.global_batch_size = 8192
    c.train.num_steps = 500_000
    c.train.learning_rate = 6e-4
    c.train.warmup_steps = 10_000
    c.train.b2 = 0.98
    c.train.eps = 1e-6
    c.train.weight_decay = 0.01
    c.checkpoint.every_steps = 5_000
    if arg == "tiny":
        shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/deberta_v3_base.py:{arg}: the only variant is 'tiny'")
    return c


def shrink_to_tiny(c) -> None:
    """A 2-layer, 64-wide discriminator and a 1-layer generator on the embedded corpus; 64 tokens over 16
    buckets, so log-bucketing runs."""
    c.model.vocab_size = 2048
    c.model.hidden_size = 64
    c.model.num_layers = 2
    c.model.generator_num_layers = 1
    c.model.num_heads = 2
    c.model.intermediate_size = 256
    c.model.max_position_embeddings = 64
    c.model.position_buckets = 16
    c.model.max_relative_positions = 64
    c.model.dtype = "float32"  # bf16 matmuls are slow on CPU
    c.model.scan_layers = False
    c.model.unroll_on_gpu = True  # configs/base.py's: an unrolled stack has no layer loop to keep (refused otherwise)
    c.model.dropout_rate = 0.0
    c.model.attention_dropout_rate = 0.0
    c.data.source = "embedded"
    c.data.max_seq_length = 64
    # The tiny ELECTRA's recipe (configs/electra_small.py): 30% masked, samples at temperature 2.
    c.data.mask_rate = 0.3
    c.model.sampling_temperature = 2.0
    c.train.global_batch_size = 16
    c.train.num_steps = 1500
    c.train.learning_rate = 1e-3
    c.train.warmup_steps = 100
    c.train.log_every_steps = 50
    c.train.eval_every_steps = 500
    c.checkpoint.every_steps = 500
