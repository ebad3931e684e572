"""Shared defaults of the fine-tuning configs (the recipe of the field); not run on its own.

Every key can be overridden: `--config.train.learning_rate=3e-5 --config.seeds=0,1,2`.
"""
import ml_collections

from bert_jax.finetune import diagnosis
from bert_jax.parallel import distributed
from bert_jax.run import lease


def get_config(kind: str) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # The license of the fine-tuned model, a Hub license id: its export's model card (bert_jax/train/model_card.py).
    c.license = "unknown"
    # "0,1,2": one run per seed in DIR/seed_<s>, then the mean ± std of their metrics (DIR/seeds.json).
    c.seeds = ""
    # A pre-training workdir (its newest checkpoint, or DIR:STEP) or a Hugging Face folder of a registered family.
    c.init_from = ""
    # `bert-jax finetune` keeps XLA's compiled programs here (JAX's persistent compilation cache), so
    # the next run of the same shapes (another seed, another learning rate) skips compiling. "" = off.
    c.compilation_cache_dir = "~/.cache/bert_jax/xla"

    c.task = ml_collections.ConfigDict()
    c.task.kind = kind  # classification | regression | token_classification | span_qa | sentence_embedding
    c.task.text_fields = "sentence"  # one column, or two for sentence pairs: "sentence1,sentence2"
    c.task.label_field = "label"
    c.task.labels = ""  # "neg,pos": the label order; "" = the training file's labels, sorted
    c.task.pooling = "cls"  # cls | mean (sequence tasks)
    c.task.word_column = 0  # CoNLL: the column holding the word
    c.task.tag_column = -1  # CoNLL: the column holding the tag
    c.task.tagging = "bio"  # bio: entity F1 per type | pos: token accuracy
    c.task.max_answer_length = 30  # span_qa: the longest answer in tokens
    # sentence_embedding: ranking (in-batch negatives on pairs) | cosine (regression on scored pairs) |
    # softmax (a classifier over (u, v, |u-v|) on labelled pairs, NLI-style); evaluation: Spearman on score_field.
    c.task.embedding_loss = "ranking"
    c.task.score_field = "score"
    # ranking: the negatives are every other pair of the global batch (all devices and hosts); with
    # train.grad_accum_steps > 1 the batch goes through the encoder in that many chunks by GradCache, the gradient
    # still the whole batch's. temperature: of the cosine similarities (0.05 = SBERT's scale 20), learnt from that
    # start with learn_temperature (CLIP's logit scale). negative_field: a column of hard negatives (a text, or a
    # JSON list of num_negatives texts). matryoshka_dims: "256,64": the loss summed over the first d dimensions too.
    c.task.temperature = 0.05
    c.task.learn_temperature = False
    c.task.negative_field = ""
    c.task.num_negatives = 1
    c.task.matryoshka_dims = ""

    c.data = ml_collections.ConfigDict()
    c.data.format = "csv"  # csv | tsv | jsonl | conll | squad | tfds
    c.data.train = ""  # a file (tfds: a split name)
    c.data.validation = ""  # "" = a held-out validation_fraction of train
    c.data.test = ""  # its predictions go to DIR/predictions.jsonl
    c.data.validation_fraction = 0.1
    c.data.split_seed = 0
    c.data.max_seq_length = 128
    # Pack each batch's examples end to end into rows of max_seq_length for the encoder (exact: every example
    # attends only to itself, positions from 0), so it computes tokens rather than padding. A batch takes at least
    # the rows a typical full batch needs, rounded up to pack_rows_multiple, so a run compiles a shape or two.
    # False: pad every example to max_seq_length.
    c.data.packing = True
    c.data.pack_rows_multiple = 2
    c.data.doc_stride = 64  # span_qa: tokens two windows of a long context share
    c.data.tfds_name = ""
    c.data.tfds_data_dir = ""

    # How to run the encoder; its sizes come from config.init_from.
    c.model = ml_collections.ConfigDict()
    c.model.dtype = "float32"
    c.model.param_dtype = "float32"
    c.model.scan_layers = True  # one layer body to compile: ~30 % less compile time, the same step time on CPU
    c.model.remat_policy = "none"
    c.model.attention_impl = "auto"
    c.model.dropout_rate = 0.1
    c.model.attention_dropout_rate = 0.0

    c.train = ml_collections.ConfigDict()
    c.train.batch_size = 32
    c.train.epochs = 3.0
    c.train.learning_rate = 2e-5
    c.train.warmup_fraction = 0.1
    c.train.weight_decay = 0.01
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.eps = 1e-8
    c.train.max_grad_norm = 1.0
    c.train.layer_lr_decay = 1.0  # < 1: lower layers learn slower (e.g. 0.9)
    c.train.freeze_embeddings = False
    c.train.freeze_layers = 0  # freeze the embeddings and the first N layers
    c.train.reinit_pooler = False
    # standard: one learning rate for all, the head initialised N(0, initializer_range). mup (an encoder pre-trained
    # under μP only): μP's per-role learning rates for the encoder and the head, the head's classifier initialised
    # and updated x 1/m (bert_jax/finetune/parametrization.py). Either way the encoder keeps its μP forward pass.
    c.train.parametrization = "standard"
    c.train.log_every_steps = 10  # or more often, to log at least once per validation
    # Validation (bert_jax/finetune/cadence.py): before the first update, then every eval_every_steps, or with 0 at
    # least evals_per_run times, evenly spaced, whatever the run's length: enough points for the diagnosis.
    c.train.eval_every_steps = 0
    c.train.evals_per_run = 10
    c.train.nan_policy = "stop"
    c.train.max_steps_ahead = 2  # dispatched steps the host may run ahead of the device (bert_jax/run/harness.py)
    c.train.grad_accum_steps = 1
    # A profiler window, as pre-training's (configs/base.py, bert_jax/run/profile_window.py): 0 steps = off.
    c.train.profile = ml_collections.ConfigDict(dict(start_step=0, num_steps=0, hosts="first"))

    # Early stopping on a validation metric ("" = off; the last step's params are the result).
    c.early_stopping = ml_collections.ConfigDict()
    c.early_stopping.metric = ""  # e.g. "accuracy", "loss", "entity_f1"
    c.early_stopping.patience = 0  # evaluations without improvement before stopping; 0 = never stop early

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 0  # 0 = once per epoch
    c.checkpoint.max_to_keep = 2
    c.checkpoint.async_save = True

    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (-1, 1, 1)
    c.mesh.dcn_shape = (1, 1, 1)
    c.mesh.rules = "fsdp_tp"

    # GPU only: XLA's --xla_gpu_deterministic_ops, as in pre-training (configs/base.py).
    c.deterministic_gpu_ops = False
    # TPU only: flags for the TPU compiler (LIBTPU_INIT_ARGS), as in pre-training (configs/base.py).
    c.libtpu_init_args = ""
    # Multi-host, as in pre-training: each host feeds its share of every batch (bert_jax/run/harness.py).
    c.distributed = distributed.default_config()
    # One live run per workdir (bert_jax/run/lease.py): process 0 holds WORKDIR/LEASE with a heartbeat;
    # a second run there stops before step 0, naming the holder; a lease silent for timeout_s is taken over.
    c.lease = lease.default_config()

    c.logging = ml_collections.ConfigDict()
    c.logging.wandb_mode = "disabled"
    c.logging.wandb_project = "bert_jax"
    c.logging.wandb_run_name = ""
    c.logging.wandb_group = ""  # runs in one wandb group, as in pre-training
    c.logging.tensorboard = False
    c.logging.plots = True

    # The learning-curve diagnoser's thresholds (bert_jax/finetune/diagnosis.py).
    c.diagnosis = diagnosis.default_config()
    return c
