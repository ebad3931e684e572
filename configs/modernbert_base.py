"""ModernBERT-base (Warner et al. 2024): 22 layers, 768 wide, GeGLU, rotary positions, a global layer
every 3rd and a 128-token window elsewhere; 149,655,232 params (as ModernBertForMaskedLM).

    bert-jax pretrain --config=configs/modernbert_base.py --workdir=gs://BUCKET/modernbert_base \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export --workdir=gs://BUCKET/modernbert_base --out=modernbert_hf` writes a
folder `transformers.AutoModelForMaskedLM` / `AutoModel` / `AutoTokenizer` load. The plain config is the
released model's shape and settings (global RoPE theta 160K) trained in one run.

The paper's recipe is three runs, each a variant here, the later two branches of the one before
(bert_jax/train/branch.py; docs/guides/recipes.md runs the chain in miniature):

    bert-jax pretrain --config=configs/modernbert_base.py:pretrain --workdir=gs://BUCKET/mb_stable \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'
    bert-jax pretrain --config=configs/modernbert_base.py:context_extension --workdir=gs://BUCKET/mb_ctx \
        --config.branch_from=gs://BUCKET/mb_stable:last \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'
    bert-jax pretrain --config=configs/modernbert_base.py:decay --workdir=gs://BUCKET/mb_decay \
        --config.branch_from=gs://BUCKET/mb_ctx:last \
        --config.data.source=text --config.data.path='gs://BUCKET/annealing/*.txt'

- `pretrain`: 1.719T tokens at sequence 1024, RoPE theta 10K in every layer, 30 % masking, a batch that
  ramps from 768 to 4,608 sequences over the first 50B tokens, peak lr 8e-4 after 3B tokens of warmup and
  then constant (no decay: the decays are branches); a checkpoint every 4,000 steps, all kept.
- `context_extension`: 250B more tokens at sequence 8192, global RoPE theta 160K (local stays 10K), a batch
  of 72 sequences, lr 3e-4 constant; the step counter, the moments and the schedule go on from the parent.
- `decay`: 50B more tokens at 8192, the learning rate from the parent's (3e-4) to 0 along a 1-sqrt curve.
- `context_32k`: a branch of the context extension (or of its decay) at 32,768 tokens, each sequence split over the
  `context` mesh axis (config.mesh.context; docs/guides/long-context.md): global RoPE theta scaled by NTK-aware
  interpolation for the 4x longer window, 160K x 4^(64/62) = 669K (Peng et al. 2023, YaRN, arXiv 2309.00071,
  section 3.1: b' = b s^(|D|/(|D|-2)), head dim |D| = 64); ModernBERT's own 8x extension raised it 16x, which
  at 4x (640K) agrees within 5 %. Local layers keep 10K: their 128-token window does not grow. 16 sequences
  (524K tokens) a step in 4 accumulation steps (one per v5e chip), lr 3e-4 constant, the splash kernel over the
  all-gathered keys. The context axis is set for a v5e-16 slice (context 4: fsdp 4 x context 4); on 8 x H100 add
  `--config.mesh.context=8 --config.model.attention_impl=xla` (one sequence over the node's NVLink).
  `bert-jax plan` says whether a step fits.
- `mask_annealing`: mmBERT's masking (30 % -> 15 % -> 5 % over its 2.3T / 0.6T / 0.1T-token phases) as
  one run's mask-rate schedule; Ettin anneals 30 % -> 15 %.
- `clm`: causal language modelling on the same architecture (config.model.objective='clm'): Ettin's decoders
  (Weller et al. 2025, "Seq vs Seq: An Open Suite of Paired Encoders and Decoders", JHU-CLSP/ettin-encoder-vs-decoder),
  every layer causal, a local layer looking back over half the encoder's window; it exports as transformers'
  `ModernBertDecoderForCausalLM` and logs train/clm_loss, eval/clm_loss and eval/perplexity.
- `biphasic`: a causal phase, then a masked one, in one run on one schedule (Gisserot-Boukhlef et al. 2025, "Should
  We Still Pretrain Encoders with Masked Language Modeling?", arXiv 2507.00994: under a fixed compute budget, CLM
  then MLM beats MLM alone). The split is config.train.objective_switch.fraction, the share of the steps trained
  causally: 0.25 by default (BIPHASIC_CLM_FRACTION; the abstract names no split, the issue's study runs 0.25 and
  0.5). It exports as `ModernBertForMaskedLM`.
Variants combine with commas: `:tiny,pretrain`. Here AdamW stands in for StableAdamW (neither optax nor any
well-kept JAX library provides it, see docs/guides/families.md); the token budgets are steps computed for
the batches above.

Tiny variant: 2 layers (one global, one local with a 16-token window), 64 wide, 400 steps on
the embedded corpus with a 2048-token BPE trained first; with a phase, the chain's miniature (200 steps
of stable phase, 60 of context extension at sequence 256, 40 of decay):

    bert-jax pretrain --config=configs/modernbert_base.py:tiny --workdir=runs/modernbert_tiny
    bert-jax pretrain --config=configs/modernbert_base.py:tiny,clm --workdir=runs/modernbert_tiny_clm
    bert-jax pretrain --config=configs/modernbert_base.py:tiny,biphasic --workdir=runs/modernbert_tiny_biphasic \
        --config.train.objective_switch.fraction=0.5
"""
import ml_collections

from bert_jax.configs import base


VARIANTS = ("tiny", "pretrain", "context_extension", "decay", "context_32k", "mask_annealing", "clm", "biphasic")
# The biphasic variant's share of the steps trained causally before the switch to MLM.
BIPHASIC_CLM_FRACTION = 0.25

# The paper's phases in steps of this config's batches (Warner et al. 2024, Table 3 and the released
# yamls/modernbert/modernbert-base-pretrain.yaml): tokens / (batch x sequence), the batch ramp counted.
PRETRAIN_STEPS = 382_742  # 1.719T tokens: 50B over the ramp's 29,035 steps, then 4,608 x 1,024 per step
PRETRAIN_WARMUP_STEPS = 3_815  # 3B tokens at the ramp's first batch, 768 x 1,024
CONTEXT_EXTENSION_STEPS = 423_855  # 250B tokens / (72 x 8,192)
DECAY_STEPS = 84_771  # 50B tokens / (72 x 8,192)
# context_32k: NTK-aware scaling of the 8k extension's global theta for 4x the length, head dim 64 (YaRN, sec. 3.1).
CONTEXT_32K_GLOBAL_ROPE_THETA = round(160_000.0 * 4 ** (64 / 62))
CONTEXT_32K_STEPS = 10_000  # 5.2B tokens at 16 x 32,768: a long-document branch, not a paper's phase


def get_config(arg: str | None = None):
    words = [word for word in (arg or "").split(",") if word]
    unknown = [word for word in words if word not in VARIANTS]
    if unknown:
        raise ValueError(f"--config=configs/modernbert_base.py:{arg}: unknown variant {unknown[0]!r}; the variants "
                         f"are {', '.join(VARIANTS)} (combined with commas: tiny,pretrain)")
    c = base.get_config()
    set_modernbert(c)
    c.model.num_layers = 22
    c.model.hidden_size = 768
    c.model.num_heads = 12
    c.model.intermediate_size = 1152
    tiny = "tiny" in words
    if tiny:
        shrink_to_tiny(c)
    for phase in ("pretrain", "context_extension", "decay", "context_32k", "mask_annealing"):
        if phase in words:
            PHASES[phase](c, tiny)
    if "clm" in words and "biphasic" in words:
        raise ValueError(f"--config=configs/modernbert_base.py:{arg}: clm and biphasic are two arms; pick one")
    if "clm" in words:
        c.model.objective = "clm"
    if "biphasic" in words:
        c.model.objective = "clm"
        c.train.objective_switch.fraction = BIPHASIC_CLM_FRACTION
        c.train.objective_switch.to = "mlm"
    return c


def pretrain(c, tiny: bool) -> None:
    """The stable phase: warmup, then the peak for good; its checkpoints are what the branches start from."""
    c.model.global_rope_theta = 10_000.0
    c.train.schedule = "constant"
    if tiny:
        c.train.num_steps, c.train.warmup_steps = 200, 20
        c.train.batch_size_warmup.start_batch_size = 4
        c.train.batch_size_warmup.tokens = 40 * 16 * 128  # 4, 8, 12, then 16 sequences from step 100
        c.train.batch_size_warmup.max_changes = 3
        c.checkpoint.every_steps, c.checkpoint.keep_every_steps = 50, 100
        c.train.eval_every_steps = 100
        return
    c.train.num_steps, c.train.warmup_steps = PRETRAIN_STEPS, PRETRAIN_WARMUP_STEPS
    c.train.batch_size_warmup.start_batch_size = 768  # 8 GPUs x the yaml's batch_size_warmup_min_size of 96
    c.train.batch_size_warmup.tokens = 50e9
    c.train.batch_size_warmup.max_changes = 8
    c.checkpoint.every_steps, c.checkpoint.keep_every_steps = 4_000, 4_000  # the paper kept every one
    c.seed = 17


def context_extension(c, tiny: bool) -> None:
    """A branch of the stable phase at 8192 tokens with global RoPE theta 160K: no parameter changes shape."""
    c.branch_from = ml_collections.config_dict.placeholder(str)  # the user names the stable run's checkpoint
    c.model.global_rope_theta = 160_000.0
    c.model.local_rope_theta = 10_000.0
    c.train.schedule = "constant"
    c.train.warmup_steps = 0
    if tiny:
        c.model.max_position_embeddings = 256
        c.data.max_seq_length = 256
        c.train.global_batch_size = 8
        c.train.learning_rate = 1e-3
        c.train.num_steps = 200 + 60
        c.checkpoint.every_steps, c.train.eval_every_steps = 30, 30
        return
    c.data.max_seq_length = 8192
    c.train.global_batch_size = 72
    c.train.learning_rate = 3e-4
    c.train.num_steps = PRETRAIN_STEPS + CONTEXT_EXTENSION_STEPS
    c.checkpoint.every_steps, c.checkpoint.keep_every_steps = 4_000, 20_000
    c.seed = 17


def decay(c, tiny: bool) -> None:
    """A branch of the context extension: its length and theta, the rate from the parent's to 0 (1-sqrt)."""
    context_extension(c, tiny)
    c.train.schedule = "decay"
    c.train.decay_shape = "1-sqrt"
    c.train.end_learning_rate = 0.0
    c.train.decay_steps = 40 if tiny else DECAY_STEPS
    if tiny:
        c.checkpoint.every_steps, c.train.eval_every_steps = 20, 20


def context_32k(c, tiny: bool) -> None:
    """A branch of the 8k extension at 4x its length, each sequence split over the context mesh axis."""
    context_extension(c, tiny)
    c.model.global_rope_theta = float(CONTEXT_32K_GLOBAL_ROPE_THETA)
    c.mesh.shape = (1, -1, 1)  # FSDP over what the context axis leaves
    c.mesh.context = 4
    if tiny:  # 4 x the tiny extension's 256 tokens, split over 4 devices, on the CPU: the xla kernel
        c.model.attention_impl = "xla"
        c.model.max_position_embeddings = c.data.max_seq_length = 1024
        c.train.global_batch_size = 4
        c.train.num_steps = 260 + 20
        return
    c.model.max_position_embeddings = c.data.max_seq_length = 32_768
    # Splash over the all-gathered keys: the v5e-16 plan's step is compute-bound at 1.14 s where the chunked xla
    # kernel's is HBM-bound at 17-22 s (docs/results/tpu-plans.md). A TPU kernel: on GPUs set attention_impl=xla.
    c.model.attention_impl = "splash"
    c.train.global_batch_size = 16
    c.train.grad_accum_steps = 4  # one sequence per v5e chip per micro-batch: the plan fits it (docs/results/tpu-plans.md)
    c.train.num_steps = PRETRAIN_STEPS + CONTEXT_EXTENSION_STEPS + CONTEXT_32K_STEPS
    c.checkpoint.every_steps, c.checkpoint.keep_every_steps = 1_000, 5_000


def mask_annealing(c, tiny: bool) -> None:
    """mmBERT's mask rates over its phases' shares of the tokens (2.3T, 0.6T, 0.1T): 30 %, then 15 %, then 5 %."""
    del tiny
    steps = c.train.num_steps
    c.data.mask_rate = 0.3
    c.data.mask_rate_schedule = ((round(steps * 2.3 / 3.0), 0.15), (round(steps * 2.9 / 3.0), 0.05))


PHASES = {"pretrain": pretrain, "context_extension": context_extension, "decay": decay,
          "context_32k": context_32k, "mask_annealing": mask_annealing}


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
    # No remat where the step fits the device, else full, by the compiler's count (bert_jax/train/remat_auto.py):
    # the phases run 1,024 to 32,768 tokens a row on chips of 16 to 141 GiB.
    c.model.remat_policy = "auto"
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
