"""Cramming (Geiping & Goldstein 2022, "Cramming: Training a Language Model on a Single GPU in One Day",
arXiv:2212.14034): a BERT-base-sized encoder trained for one day on one GPU, every choice made for throughput.

    bert-jax pretrain --config=configs/crammed.py --workdir=runs/crammed --config.train.budget=24h \
        --config.data.source=text --config.data.path='CORPUS/*.txt'

runs for a day of step time (the default budget, the paper's), then saves, evaluates and writes DONE;
`bert-jax export --workdir=runs/crammed --out=crammed_hf` writes a folder that transformers'
`AutoModelForMaskedLM` loads as a `ModernBertForMaskedLM`, unchanged: the recipe is the modernbert family with
every layer global, which is pre-LN, bias-free, GeGLU and dropout-free already. What a day buys on a card:

    bert-jax plan --config=configs/crammed.py --gpu=h100 --num_devices=1 --budget=24h

prints 9.1 to 9.5 GiB per device in each of the ramp's 9 stages (its micro-batch stays 128; cuDNN attention on
packed rows) and at most 647,143 steps, 8.8e10 tokens, in a day (a roofline bound; XLA's GPU compiler without a
GPU, 2026-12-04).

The budget runs the schedule as written over the share of the day spent (bert_jax/train/budget.py): its first
start times 20 steps and records the speed (train.budget_step_s), so a relaunch trains the same steps. The
schedule's length, train.num_steps, is a day as Cramming's data configs size it (35M sequences of 128 tokens,
cramming/config/data/*.yaml) in the steps of this batch ramp; `--config.train.budget=''` trains those steps.

Each choice and where it lives here (§ of the paper; the released recipe is the repository's
cramming/config/arch/crammed-bert.yaml and train/bert-o4.yaml):
- pre-LN layers (§4.2): the family's layers; a final norm after the last layer (§4.2) too;
- no biases in the attention and feed-forward linears, nor in the decoder (§4.2): attention_bias, mlp_bias,
  decoder_bias False;
- gated GELU in the feed-forward block (§4.2): the family's GeGLU, 2 x 1536 wide (the yaml's 3072, halved by
  the gate);
- no dropout (§4.3), in the embeddings, layers and attention;
- the prediction head over the masked positions only (§4.2, "sparse token prediction"): every family here
  gathers the masked positions before the head (data.max_predictions_per_seq);
- MLM alone on packed rows, no NSP (§4.3): data.example_builder packed, 15 % masked, 80/10/10;
- Adam(W), betas (0.9, 0.98), eps 1e-12, weight decay 0.01 off biases and norms, clipping at 0.5 (§4.3);
- a triangular (one-cycle) learning rate, peak 1e-3 (§4.3): train.schedule onecycle, from 0.25 x the peak up
  to it at 75 % of the run, then down to 0 (bert-o4's budget-triangle2);
- the batch ramped by accumulation (§4.3): micro-batches of 128 sequences, accumulated into batches growing
  from 128 to 4,096 linearly in the tokens seen (the time spent), full from 60 % of them (bert-o4's
  batch_size_ramp); train.batch_size_warmup with accumulate=True;
- sequence length 128 (§4), WordPiece of 2^15 = 32,768 tokens, lower-cased (§4.4).
Where the transformers class fixes the choice: rotary positions stand for the paper's scaled sinusoidal ones
(§4.2), and ModernBERT's head keeps its dense, GELU and norm before the decoder, which the paper drops (§4.2).
The paper's 16 layers of 768 with 12 heads are crammed-bert.yaml's.

Tiny variant: 2 layers, 64 wide, a 2,048-token WordPiece on the embedded corpus, micro-batches of 8 accumulated
into batches of 8, 16 and 32, 375 steps with no budget: about a minute of CPU time on 2 cores (57 s user; 5m19s of
wall time under a load average of 28 from other work), final eval MLM accuracy 0.153 against 0.050 for always
guessing the most frequent token:

    bert-jax pretrain --config=configs/crammed.py:tiny --workdir=runs/crammed_tiny
"""
import math

from bert_jax.configs import base

VARIANTS = ("tiny",)

# A day of Cramming's data: its data configs' max_seq_in_tokenized_dataset, "slightly more than budget x 3600 x
# tokens/s" for 24 hours, of 128-token sequences.
DAY_SEQUENCES = 35_000_000
RAMP_SHARE = 0.6  # the share of the tokens over which the batch ramps (bert-o4's batch_size_ramp)


def get_config(arg: str | None = None):
    words = [word for word in (arg or "").split(",") if word]
    unknown = [word for word in words if word not in VARIANTS]
    if unknown:
        raise ValueError(f"--config=configs/crammed.py:{arg}: unknown variant {unknown[0]!r}; the only variant is "
                         f"'tiny'")
    c = base.get_config()
    m = c.model
    m.family = "modernbert"  # ModernBertForMaskedLM is the transformers class that loads the recipe unchanged
    m.num_layers, m.hidden_size, m.num_heads = 16, 768, 12
    m.intermediate_size = 1536  # each half of the gated GELU (crammed-bert.yaml's intermed_size 3072)
    m.vocab_size = 32768
    m.max_position_embeddings = 128
    m.hidden_act = "gelu"  # gated: the family's Wi projects to 2 x intermediate_size, gelu(x) * gate
    m.global_attn_every_n_layers = 1  # every layer attends globally, as BERT and Cramming
    m.local_attention = 128  # unused with every layer global; the family checks it against the sequence
    m.global_rope_theta = m.local_rope_theta = 10_000.0
    m.attention_bias = m.mlp_bias = False  # §4.2: no QKV, output or feed-forward biases
    m.decoder_bias = False  # §4.2 (crammed-bert.yaml decoder_bias: False)
    m.classifier_bias = False
    m.norm_bias = True  # Cramming's LayerNorms keep their bias
    m.layer_norm_eps = 1e-12  # crammed-bert.yaml norm_eps
    m.initializer_range = 0.02
    m.initializer_cutoff_factor = 2.0  # ModernBERT's truncation; Cramming draws a plain normal
    m.dropout_rate = m.attention_dropout_rate = 0.0  # §4.3: dropout off for a single epoch
    m.pad_token_id = 0  # the WordPiece kind's [PAD]

    d = c.data
    d.tokenizer.kind = "wordpiece"  # §4.4: BERT's WordPiece, lower-cased
    d.tokenizer.lowercase = True
    d.max_seq_length = 128  # §4: 128 throughout (the data configs' seq_length)
    d.example_builder = "packed"  # §4.3: MLM alone on fully packed rows
    d.masking = "token"  # 80/10/10 (bert-o4's use_80_20_rule)
    d.mask_rate = 0.15  # §4.3: 15 %; bert-o4 raised it to 0.25 with a batch of 8192

    t = c.train
    t.optimizer = "adamw"
    t.learning_rate = 1e-3  # §4.3: the one-cycle's peak
    t.b1, t.b2, t.eps = 0.9, 0.98, 1e-12
    t.weight_decay = 0.01
    t.max_grad_norm = 0.5  # bert-o4's gradient_clipping
    t.schedule = "onecycle"
    t.warmup_steps = 0  # the triangle's rise is the warmup
    t.onecycle_peak_fraction = 0.75  # budget-triangle2: falloff 0.25
    t.onecycle_start_factor = 0.25  # budget-triangle2: base_percentage 0.25
    t.end_learning_rate = 0.0
    micro_batch = 128  # bert-o4's comment: mbs=128 at seq 128
    t.global_batch_size = 4096  # §4.3: the final batch on the larger cards
    ramp = t.batch_size_warmup
    ramp.start_batch_size = micro_batch  # one micro-batch, then more of them accumulated
    t.grad_accum_steps = 1  # in the first stage; each later stage accumulates batch / micro_batch of them
    ramp.accumulate = True
    ramp.max_changes = 8  # a compiled step per batch: 128, 512, 1024, ... 4096
    day = DAY_SEQUENCES * d.max_seq_length
    ramp.tokens = RAMP_SHARE * day
    t.num_steps = steps_for_tokens(day, ramp.tokens, micro_batch, t.global_batch_size, d.max_seq_length,
                                   ramp.max_changes)
    t.budget = "24h"  # the paper's day on one GPU (cramming/config/cfg_pretrain.yaml budget: 24)
    t.log_every_steps = 100
    t.eval_every_steps = 1_000
    c.checkpoint.every_steps = 1_000
    if "tiny" in words:
        shrink_to_tiny(c)
    return c


def shrink_to_tiny(c) -> None:
    """2 layers x 64 on the embedded corpus, the same recipe: the ramp (8 -> 32 by accumulation) and the triangle."""
    m, d, t = c.model, c.data, c.train
    m.num_layers, m.hidden_size, m.num_heads, m.intermediate_size = 2, 64, 2, 96
    m.vocab_size = 2048
    m.dtype = "float32"  # bf16 matmuls are slow on CPU
    m.scan_layers = False
    d.source = "embedded"
    d.num_eval_batches = 3
    t.budget = ""  # steps: the same run on any machine
    # 2 layers of 64 take a larger peak than the paper's 1e-3 at BERT-base's size: eval MLM accuracy after the 375
    # steps 0.085 at 2e-3, 0.153 at 5e-3; 1e-2 was behind 5e-3 at step 300 (0.107 against 0.126).
    t.learning_rate = 5e-3
    t.global_batch_size = 32
    t.batch_size_warmup.start_batch_size = 8
    t.batch_size_warmup.max_changes = 2  # 8, 16, then 32 sequences: 3 compiled steps
    sequences = 6_000  # about a minute of CPU time on 2 cores
    t.batch_size_warmup.tokens = RAMP_SHARE * sequences * d.max_seq_length
    t.num_steps = steps_for_tokens(sequences * d.max_seq_length, t.batch_size_warmup.tokens, 8, 32,
                                   d.max_seq_length, t.batch_size_warmup.max_changes)
    t.log_every_steps = 25
    # Each stage ends with a checkpoint and an eval (steps 150 and 300); the run with one more.
    t.eval_every_steps = c.checkpoint.every_steps = t.num_steps


def steps_for_tokens(tokens: float, ramp_tokens: float, first: int, final: int, length: int,
                     max_changes: int) -> int:
    """The steps that train `tokens` under a batch ramp from `first` to `final` sequences over `ramp_tokens`
    (bert_jax/train/stages.py's thresholds: batch j from the step after which tokens x (m_j - 1) / (k - 1) are
    seen), then the final batch."""
    k = final // first
    n = min(k - 1, max_changes)
    multiples = [1 + (k - 1) * j // n for j in range(n + 1)]
    steps, seen = 0, 0.0
    for m, following in zip(multiples, multiples[1:]):
        threshold = ramp_tokens * (following - 1) / (k - 1)
        taken = max(0, math.ceil((threshold - seen) / (first * m * length)))
        steps, seen = steps + taken, seen + taken * first * m * length
    return steps + max(0, math.ceil((tokens - seen) / (final * length)))
