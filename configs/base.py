"""Shared defaults for every pre-training config; not run on its own.

Other configs start from `get_config()` here and change what differs. Every key
can be overridden on the command line: `--config.train.learning_rate=2e-4`.
"""
import ml_collections
from ml_collections import config_dict

from bert_jax.parallel import distributed
from bert_jax.run import lease, spike


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # The license the run's exports are given under, a Hub license id ("apache-2.0", "mit", "cc-by-4.0", ...): the
    # `license` of every export's model card (OUT/README.md, bert_jax/train/model_card.py).
    c.license = "unknown"
    # A Hugging Face folder of config.model.family's kind (config.json, model.safetensors, tokenizer
    # files) to start from instead of a random init, e.g. a BertModel-only checkpoint (its missing
    # MLM/NSP heads stay random), a RobertaForMaskedLM or an AlbertForPreTraining folder.
    # Used only when the workdir holds no checkpoint; its tokenizer replaces training one.
    c.init_from_hf = ""
    # DIR:STEP[:ema] of a smaller pre-training run of the same family to grow this deeper and/or wider model
    # from ("" = off): its weights tiled from the middle, its layers repeated (bert_jax/train/growth.py, as
    # ModernBERT-large grew from base), its tokenizer kept. Used only when the workdir holds no checkpoint.
    c.grow_from = ""
    # A resume whose tokenizer or data changed since the run started stops, naming what changed
    # (bert_jax/run/run_identity.py); True goes on anyway and logs it.
    c.allow_data_change = False
    # A resume whose config changes the experiment (model, data, masking, optimizer, schedule, stages) stops,
    # naming the keys (bert_jax/run/experiment.py); the keys named here, comma-separated ("data.masking,
    # train.num_steps"), go on, each change recorded in DIR/config_history.jsonl.
    c.accept_changes = ""
    # GPU only: XLA's --xla_gpu_deterministic_ops (no autotuning, no atomics), so that the same
    # command gives the same losses on a GPU too, at a cost in speed (bench/deterministic_ops_cost.py).
    c.deterministic_gpu_ops = False
    # TPU only: flags for the TPU compiler (LIBTPU_INIT_ARGS), set by pretrain and by `plan --tpu` alike.
    c.libtpu_init_args = ""
    # JAX's persistent compilation cache for the run's programs ("" = off), set up by the harness as for
    # fine-tuning (bert_jax/run/harness.py): a relaunch of the same shapes skips compiling.
    c.compilation_cache_dir = ""
    # A branch (bert_jax/train/branch.py, docs/guides/recipes.md): a new workdir that starts from another run's
    # checkpoint DIR:STEP (STEP a number or `last`) with its parameters, optimizer state, step counter and data
    # position, and trains on with this config (a new schedule, data, sequence length, masking, batch; model keys
    # that keep every parameter's shape). The parent is only read. Used only when the workdir holds no checkpoint.
    c.branch_from = ""
    c.branch = ml_collections.ConfigDict()
    c.branch.reset_optimizer = False  # fresh Adam moments (the schedule still goes on from the branch's step)
    c.branch.reset_step = False  # count from 0: the schedule starts again
    # The data order after the branch point: auto (the parent's position when the data config is unchanged, else
    # a new seeded order) | continued | reseeded. Resolved and recorded by the config check.
    c.branch.data = "auto"
    # Resolved with the above (-1 until then): the seed the branch's data iterators are drawn from and the step its
    # first one starts at (bert_jax/train/branch.py iterator_origin).
    c.branch.seed_base = -1
    c.branch.first_step = -1

    c.model = ml_collections.ConfigDict()
    c.model.family = "bert"
    # The objective trained, by name: "" = the family's own (MLM, MLM + NSP, RTD, ...); "clm" = causal LM on the same
    # module where the family registers it (modernbert: bert_jax/families.py). A stage may change it
    # (config.train.stages): the attention mask and the pipeline's targets follow (config.data.objective).
    c.model.objective = ""
    c.model.vocab_size = 30522
    c.model.hidden_size = 768
    c.model.num_layers = 12
    c.model.num_heads = 12
    c.model.intermediate_size = 3072
    c.model.max_position_embeddings = 512
    c.model.type_vocab_size = 2
    c.model.dropout_rate = 0.1
    # Attention-probability dropout is 0, as in ModernBERT, MosaicBERT and Cramming: the fused
    # kernels (cudnn, splash) cannot apply it. Devlin et al. used 0.1;
    # --config.model.attention_dropout_rate=0.1 reproduces them exactly, and `auto` then picks xla.
    c.model.attention_dropout_rate = 0.0
    c.model.layer_norm_eps = 1e-12
    # The feed-forward activation, a key of bert_jax/models/layers.py's ACTIVATIONS (Hugging Face's names: "gelu" is
    # the exact GELU, "gelu_new" the tanh approximation).
    c.model.hidden_act = "gelu"
    c.model.initializer_range = 0.02
    c.model.scan_layers = True
    c.model.scan_unroll = 1  # layers per iteration of the scanned loop (nn.scan unroll)
    # An NVIDIA GPU target without remat runs a scan_unroll of 1 as the whole stack, parameters still stacked: a rolled
    # scan's saved residuals cost a third of BERT-base's bytes per step there (models/transformer.py's
    # layers_per_iteration). The default rests on XLA's GPU compiler's count alone (docs/results/gpu.md): the first
    # GPU run must check that the unrolled step's losses equal the rolled one's (bench/gpu_kernel_checks.py) and the
    # ELECTRA step's peak, +15 % by that count.
    c.model.unroll_on_gpu = True
    # none | full | dots | dots_no_batch | auto (none where the compiled step fits the device, else full: the run and
    # `bert-jax plan` compile it to see; bert_jax/train/remat_auto.py)
    c.model.remat_policy = "none"
    # Hidden dropout's masks: per_layer (drawn in each layer) | per_step (all layers' in one draw before the stack:
    # the same keep rate, other masks; families on models/transformer.py's stack: bert, roberta, electra, distilbert).
    c.model.dropout_masks = "per_layer"
    # Post-LN's LayerNorm(x + dropout(h)) as one custom VJP whose backward re-draws the mask from its key instead of
    # keeping it (bert_jax/kernels/dropout_add_layer_norm.py): the same values, gradients and masks.
    c.model.fused_dropout_norm = False
    # query, key and value as one matmul against their three kernels side by side (models/attention.py): the same
    # parameters; x read once, one input-gradient matmul in the backward.
    c.model.fused_qkv = False
    # Attention kernel (bert_jax/models/attention.py): auto | xla | cudnn | splash. auto: splash on
    # TPU, cudnn on NVIDIA GPUs (bf16), xla otherwise or when attention dropout is on; the one line
    # logged at start-up names the kernel and why.
    c.model.attention_impl = "auto"
    c.model.splash_interpret = False  # run splash in Pallas interpret mode off TPU (slow: tests)
    # standard | mup: μP (bert_jax/models/parametrization.py, docs/guides/sweep-small-train-large.md), under which a
    # learning rate swept at hidden size mup_base_width holds at wider ones; μP equals standard at that width.
    c.model.parametrization = "standard"
    c.model.mup_base_width = 0  # μP's base hidden size: divides hidden_size, a multiple of num_heads
    # Resolved by the config check under μP (read only): the width multiplier, the attention logits' factor and each
    # parameter role's init and learning-rate factors, as the run applies them.
    c.model.mup_multipliers = ml_collections.ConfigDict()
    c.model.dtype = "bfloat16"  # compute dtype
    c.model.param_dtype = "float32"

    c.data = ml_collections.ConfigDict()
    # Sources (data_pipelines/sources/documents.py): embedded | text | jsonl | parquet | tfds | prepared.
    c.data.source = "embedded"
    c.data.path = ""  # text/jsonl/parquet: file, directory or glob (.gz ok); prepared: its out dir
    c.data.field = "text"  # jsonl field / parquet column / tfds feature holding a document
    c.data.tfds_name = ""  # e.g. "wikipedia/20230601.en", built with file_format="array_record"
    c.data.tfds_split = "train"
    c.data.tfds_data_dir = ""  # "" = TFDS's default (~/tensorflow_datasets)
    c.data.segmenter = "line"  # line | blank_line | sentence: how a document splits into segments
    c.data.max_line_bytes = 1_000_000  # longer lines / records are skipped and counted
    # prepared shards in a bucket are copied to $BERT_JAX_CACHE_DIR as a host first reads them;
    # least recently used files are evicted to stay within this many bytes (0 = no bound)
    c.data.shard_cache_bytes = 64 * 2**30
    # A mixture of named sources (data_pipelines/sources/mixture.py, docs/guides/data.md); empty = the one
    # source above. e.g. dict(books=dict(source="text", path="gs://b/books/*.txt", weight=0.7),
    # web=dict(source="jsonl", path="gs://b/web/*.jsonl.gz", weight=0.3)); a source's unset keys are these.
    c.data.mixture = ml_collections.ConfigDict()
    # Weights by step: ((step, dict(name=weight, ...)), ...), each stage from that step's batch on.
    c.data.mixture_schedule = ()
    # Weights from the sources' sizes instead, sampled by temperature (a source then sets no weight): p_i ~ n_i **
    # alpha, n_i the documents it holds (XLM-R: 0.3; 1 = the sizes' shares, 0 = uniform); None = off. Each size is
    # counted (or read from a prepared manifest) once and recorded as config.data.mixture.<name>.size.
    c.data.mixture_alpha = config_dict.placeholder(float)
    # alpha by step: ((step, alpha), ...), each a stage from that step's batch on (mmBERT: 0.7 -> 0.5 -> 0.3).
    c.data.mixture_alpha_schedule = ()
    # Tokenizer (data_pipelines/tokenizers/tokenizer.py): trained once per workdir unless `path` is set.
    c.data.tokenizer = ml_collections.ConfigDict()
    c.data.tokenizer.kind = "wordpiece"  # wordpiece | bpe (RoBERTa) | unigram | sentencepiece_bpe (ALBERT)
    c.data.tokenizer.path = ""  # vocab.txt / tokenizer.json / .model, or a directory holding one
    c.data.tokenizer.sample_bytes = 100_000_000  # text streamed into training, at most
    # which files give the sample: drawn across all files (and mixture sources) from this seed (tokenizer/sample.json)
    c.data.tokenizer.sample_seed = 0
    c.data.tokenizer.lowercase = True
    c.data.tokenizer.min_frequency = 2  # wordpiece / bpe
    c.data.tokenizer.special_tokens = ""  # "" = the kind's; else "pad,unk,cls,sep,mask" names
    c.data.vocab_size = c.model.get_ref("vocab_size")
    c.data.objective = c.model.get_ref("objective")  # causal: batches unmasked (bert_jax/objective_names.py)
    c.data.max_seq_length = 128
    c.data.mask_rate = 0.15  # share of non-special tokens predicted (15-40% are sensible)
    # The mask rate by step, ((step, rate), ...), steps ascending in [0, train.num_steps): data.mask_rate from each
    # step on (a step-0 entry sets the first stage's); stages of the run (bert_jax/train/stages.py), each
    # re-deriving max_predictions_per_seq (auto). mmBERT: ((0, 0.3), (S1, 0.15), (S2, 0.05)). () = data.mask_rate.
    c.data.mask_rate_schedule = ()
    # Masked positions per row, the width of the MLM head's gather. auto = ceil(mask_rate x max_seq_length),
    # so a mask-rate sweep trains at the rate it names (train/masked_fraction shows it); a set number
    # below that is refused, naming the value that fits (bert_jax/train/config_validation.py).
    c.data.max_predictions_per_seq = ml_collections.FieldReference("auto", field_type=object)
    # How masking differs from transformers' DataCollatorForLanguageModeling, key by key (docs/guides/parity.md).
    # mask_count: exact (round(mask_rate x maskable tokens) per row, BERT's create_pretraining_data) | bernoulli
    # (each token, or whole word, with probability mask_rate, as the collator; max_predictions_per_seq auto becomes
    # max_seq_length). random_tokens: ordinary (ids of the tokenizer that are not specials) | any (every id of the
    # tokenizer, as the collator's randint(len(tokenizer))). The shares of the selected tokens made [MASK] and made
    # a random token (the collator's mask_replace_prob, random_replace_prob; its whole-word mode uses 1.0, 0.0).
    c.data.mask_count = "exact"
    c.data.random_tokens = "ordinary"
    c.data.mask_token_share = 0.8
    c.data.random_token_share = 0.1
    c.data.short_seq_prob = 0.1
    c.data.nsp_random_prob = 0.5
    # Examples (data_pipelines/examples/builders.py, packing.py): nsp (BERT) | sop (ALBERT) |
    # full_sentences (RoBERTa) | doc_sentences | packed (several documents per row, segment_ids).
    c.data.example_builder = "nsp"
    c.data.nsp_reservoir_docs = 100  # NSP's random B comes from this many recent documents
    # Masking (data_pipelines/loader/masking.py): token (80/10/10) | whole_word | span (SpanBERT) | ngram (ALBERT).
    c.data.masking = "token"
    c.data.span_p = 0.2  # span: geometric length parameter
    c.data.max_span_length = 10  # span: lengths (in words) truncated here
    c.data.max_ngram = 3  # ngram: n in 1..max_ngram with p(n) ∝ 1/n
    c.data.shuffle_window = 1024  # examples shuffled together after building (1 = off)
    c.data.eval_fraction = 0.05
    c.data.num_eval_batches = 4
    # grain worker processes; auto = min(8, cores - 1), 0 below 2 (data_pipelines/loader/workers.py). The batches
    # depend on the number: a run records it in config.json and a resume keeps it on any host; pin a number
    # for the same batches on hosts of fewer than 9 cores.
    c.data.worker_count = ml_collections.FieldReference("auto", field_type=object)
    c.data.prefetch_buffer_size = 2

    c.train = ml_collections.ConfigDict()
    c.train.global_batch_size = 256
    c.train.grad_accum_steps = 1
    c.train.num_steps = 1_000_000
    # A budget instead of a step count (bert_jax/train/budget.py, docs/guides/budget.md): "" (off) | wall-clock time
    # ("8m", "24h") | tokens ("2e9tokens") | FLOPs ("3e18flops"). num_steps stays the schedule's length as written;
    # the run trains the steps the budget buys, every schedule running over the fraction of it spent.
    c.train.budget = ""
    # Wall-clock budgets: seconds per step of stage 0; 0 = timed over budget_calibration_steps steps at the run's
    # first start and recorded in DIR/config.json (set it to repeat a run exactly in a new workdir).
    c.train.budget_step_s = 0.0
    c.train.budget_calibration_steps = 20
    # Resolved from budget, never set by hand: ((run step, schedule step, budget spent), ...) at each stage's end.
    c.train.budget_clock = ()
    c.train.optimizer = "adamw"  # adamw | lamb
    c.train.learning_rate = 1e-4
    c.train.warmup_steps = 10_000
    c.train.end_learning_rate = 0.0
    # Learning-rate schedule (bert_jax/train/optimizer.py), all after a linear warmup: linear | wsd
    # (warmup-stable-decay, 1-sqrt decay over the last decay_fraction of num_steps) | cosine | constant (the
    # stable phase a recipe branches its decays from) | decay (a decay branch: see decay_steps) | onecycle (a
    # triangle: Cramming's, configs/crammed.py; no warmup, the rise is one).
    c.train.schedule = "linear"
    c.train.decay_fraction = 0.1  # wsd only
    # onecycle only: the share of num_steps over which the rate rises to the peak, and the first step's rate as a
    # share of the peak (then linear down to end_learning_rate at the last step).
    c.train.onecycle_peak_fraction = 0.75
    c.train.onecycle_start_factor = 0.25
    # decay (a decay branch): from decay_from_learning_rate at step decay_from_step to end_learning_rate over
    # decay_steps; on a branch the two `from` keys resolve to the branch step and the parent's rate there (-1 =
    # resolve), and train.num_steps to decay_from_step + decay_steps (0 = decay to num_steps).
    c.train.decay_steps = 0
    c.train.decay_shape = "1-sqrt"  # 1-sqrt | linear
    c.train.decay_from_step = -1
    c.train.decay_from_learning_rate = -1.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.eps = 1e-6
    c.train.weight_decay = 0.01
    c.train.max_grad_norm = 1.0
    # Adam's moments over one flattened buffer (optax.flatten) rather than per leaf: the same numbers in a few
    # large kernels; replicated, so for one-device runs (bert_jax/train/optimizer.py, docs/results/gpu.md).
    c.train.flat_moments = False
    # The PRNG dropout draws from (bert_jax/train/step.py): threefry (the default: the same masks on any
    # sharding) | rbg | unsafe_rbg (cheaper bits on GPUs; masks of the same statistics, not the same masks).
    c.train.dropout_prng = "threefry"
    c.train.log_every_steps = 100
    c.train.eval_every_steps = 10_000
    c.train.nan_policy = "stop"  # stop: raise with the step number
    # Loss spikes (bert_jax/run/spike.py), off by default: with factor k > 1, a step whose loss exceeds k x the median
    # of the `window` step losses before it, or is not finite, restores the last checkpoint before it and skips the
    # batches that led to it, as PaLM's training did (Chowdhery et al. 2022, §5.1); counted in train/rollbacks.
    c.train.spike = spike.default_config()
    # A profiler window (bert_jax/run/profile_window.py): a jax.profiler trace of num_steps steps from start_step (steps
    # count from 1; skip the first few, whose compile fills a trace) in DIR/profile/, for XProf; 0 steps = off.
    # hosts: first (process 0) | all. Changing it on a resume changes no experiment.
    c.train.profile = ml_collections.ConfigDict()
    c.train.profile.start_step = 0
    c.train.profile.num_steps = 0
    c.train.profile.hosts = "first"
    # An exponential moving average of the params, kept in the train state (ema = d*ema + (1-d)*params after each
    # applied update) and read as `DIR:STEP:ema` by export, fine-tuning and evaluation; 0 = off.
    c.train.ema_decay = 0.0
    # Dispatched steps the host may run ahead of the device (bert_jax/run/harness.py's StepsAhead): a SIGTERM's save
    # waits for at most this many. 0: every step waits for its own result.
    c.train.max_steps_ahead = 2
    # Stages of the run (bert_jax/train/stages.py): ((dict(start=STEP, data=dict(max_seq_length=512)), ...):
    # from each start on, the keys it changes (sequence length, batch size, masking); one schedule spans them.
    c.train.stages = ()
    # The objective switch (bert_jax/train/stages.py): after `fraction` of train.num_steps (0 = off) the run trains
    # config.model.objective=`to` on the same parameters, optimizer state and schedule: a stage of its own. A
    # biphasic run (configs/modernbert_base.py:biphasic): objective="clm", fraction=0.25, to="mlm".
    c.train.objective_switch = ml_collections.ConfigDict()
    c.train.objective_switch.fraction = 0.0
    c.train.objective_switch.to = ""
    # Batch-size warm-up (bert_jax/train/stages.py): the global batch grows from start_batch_size (which must divide
    # global_batch_size; 0 = off) to global_batch_size as the run's tokens (batch x max_seq_length per step) grow to
    # `tokens`, linearly, in at most max_changes steps of change, each batch a multiple of the start batch. Expands
    # into stages. ModernBERT: start_batch_size=768, global_batch_size=4608, tokens=50e9. A ramp the run ends
    # before finishing stops at the batch it reached.
    c.train.batch_size_warmup = ml_collections.ConfigDict()
    c.train.batch_size_warmup.start_batch_size = 0
    c.train.batch_size_warmup.tokens = 0.0  # float: 50e9 on a command line
    c.train.batch_size_warmup.max_changes = 8
    # True: the micro-batch stays start_batch_size / grad_accum_steps and each larger batch accumulates more of them
    # (Cramming's ramp, configs/crammed.py); False: grad_accum_steps stays and the micro-batch grows with the batch.
    c.train.batch_size_warmup.accumulate = False
    # After extend-vocab: train only the new tokens' rows (ids from new_rows_start on) for this many steps first.
    c.train.new_rows_warmup_steps = 0
    c.train.new_rows_start = 0

    # A downstream probe at eval steps (bert_jax/finetune/downstream_probe.py): a small suite (configs/suites/)
    # fine-tuned from the current params, logged as downstream/<task>/<metric>. Built by `bert_jax.commands.pretrain`.
    c.eval = ml_collections.ConfigDict()
    c.eval.downstream_suite = ""  # smoke | glue | a suite file; "" = no probe
    c.eval.downstream_data_dir = ""  # the suite's GLUE-layout directory (SST-2/train.tsv, ...)
    c.eval.downstream_tasks = ""  # some of the suite's tasks ("" = all)
    # 0: at the run's last step only; N: every N steps (a multiple of train.eval_every_steps) and at the last.
    c.eval.downstream_every_steps = 0
    c.eval.downstream_seed = 0

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 10_000
    c.checkpoint.max_to_keep = 3
    # Every Nth step's checkpoint is kept for good beside the rolling max_to_keep (a branch point, an
    # average's source); 0 = off. A multiple of every_steps.
    c.checkpoint.keep_every_steps = 0
    c.checkpoint.async_save = True

    c.mesh = ml_collections.ConfigDict()
    # (data, fsdp, tensor) inside one slice (ICI); one -1 is filled with the remaining devices.
    # One override switches strategy: (-1,1,1) DP, (1,-1,1) FSDP, (1,-1,4) FSDP + 4-way TP.
    c.mesh.shape = (-1, 1, 1)
    # (data, fsdp, tensor) across slices (DCN, multi-slice TPU; one process per node on GPUs),
    # e.g. (2,1,1): data parallel over 2 slices. The mesh is shape * dcn_shape.
    c.mesh.dcn_shape = (1, 1, 1)
    # Context parallelism: each sequence split over this many devices of a slice (the logical `length`
    # axis on the `context` mesh axis); the -1 above takes what is left (xla kernel only).
    # docs/guides/long-context.md.
    c.mesh.context = 1
    # How global attention layers see the other devices' keys under context > 1: all_gather (every
    # device gathers the whole sequence's keys and values, MaxText's default) | ring (each device's
    # block passed round the axis, N-1 permutes overlapped with the compute; no attention dropout).
    # Windowed layers whose window fits in a shard exchange only their neighbours' halo either way.
    c.mesh.context_attention = "all_gather"
    # Logical axis -> mesh axes preset (bert_jax/parallel/mesh.py RULE_PRESETS):
    # dp | fsdp | tp | fsdp_tp (splits by whichever axes are > 1) | custom (logical_axis_rules below).
    c.mesh.rules = "fsdp_tp"
    # Used only with rules=custom. The model names only logical axes.
    c.mesh.logical_axis_rules = (
        ("batch", ("data", "fsdp")),
        ("length", "context"),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv", None),
        ("mlp", "tensor"),
        ("vocab", "tensor"),
        ("layers", None),
    )

    # Multi-host (bert_jax/parallel/distributed.py): one process per host (TPU VM worker, or GPU
    # node under SLURM). Explicit coordinator for localhost; auto-detected on TPU VMs and SLURM.
    c.distributed = distributed.default_config()
    # One live run per workdir (bert_jax/run/lease.py): process 0 holds WORKDIR/LEASE with a heartbeat;
    # a second run there stops before step 0, naming the holder; a lease silent for timeout_s is taken over.
    c.lease = lease.default_config()

    # Knowledge distillation (bert_jax/train/teacher.py, bert_jax/objectives/distillation.py): a
    # frozen teacher runs in the same jitted step, and the loss becomes kl_weight * T^2 * KL(teacher ||
    # student) at the masked positions + mlm_weight * the student's MLM loss + cosine_weight * (1 - cos)
    # of the last hidden states. Off while `teacher` is "".
    c.distill = ml_collections.ConfigDict()
    c.distill.teacher = ""  # a pre-training workdir or a Hugging Face folder of any registered family
    c.distill.temperature = 2.0
    c.distill.kl_weight = 5.0  # Sanh et al.'s alpha_ce, alpha_mlm, alpha_cos
    c.distill.mlm_weight = 2.0
    c.distill.cosine_weight = 1.0  # needs equal hidden sizes; 0 otherwise
    # "" (the student's own init) | every_other_layer: the teacher's embeddings, layers 1, 3, 5, ...
    # and MLM head, copied into a fresh student
    c.distill.init_student_from_teacher = ""

    c.logging = ml_collections.ConfigDict()
    c.logging.wandb_mode = "disabled"  # disabled | offline | online
    c.logging.wandb_project = "bert_jax"
    c.logging.wandb_run_name = ""  # "" = the workdir's name; the run's id is DIR/wandb_id, one per workdir
    c.logging.wandb_group = ""  # a sweep sets it to the sweep's name
    c.logging.tensorboard = True
    c.logging.plots = True
    # Peak FLOP/s of one device for MFU; 0 = look up the device kind, else measure a matmul.
    c.logging.peak_flops_per_device = 0.0
    return c
