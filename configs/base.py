"""Shared defaults for every pre-training config; not run on its own.

Other configs start from `get_config()` here and change what differs. Every key
can be overridden on the command line: `--config.train.learning_rate=2e-4`.
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    # A Hugging Face BERT folder (config.json, model.safetensors, vocab.txt) to start from instead
    # of a random init, e.g. a BertModel-only checkpoint (its missing MLM/NSP heads stay random).
    # Used only when the workdir holds no checkpoint; its tokenizer replaces training one.
    c.init_from_hf = ""

    c.model = ml_collections.ConfigDict()
    c.model.family = "bert"
    c.model.vocab_size = 30522
    c.model.hidden_size = 768
    c.model.num_layers = 12
    c.model.num_heads = 12
    c.model.intermediate_size = 3072
    c.model.max_position_embeddings = 512
    c.model.type_vocab_size = 2
    c.model.dropout_rate = 0.1
    c.model.attention_dropout_rate = 0.1
    c.model.layer_norm_eps = 1e-12
    c.model.initializer_range = 0.02
    c.model.scan_layers = True
    c.model.remat_policy = "none"  # none | full | dots | dots_no_batch
    c.model.dtype = "bfloat16"  # compute dtype
    c.model.param_dtype = "float32"

    c.data = ml_collections.ConfigDict()
    c.data.source = "embedded"
    c.data.vocab_size = c.model.get_ref("vocab_size")
    c.data.max_seq_length = 128
    c.data.max_predictions_per_seq = 20
    c.data.mask_rate = 0.15
    c.data.short_seq_prob = 0.1
    c.data.nsp_random_prob = 0.5
    c.data.eval_fraction = 0.05
    c.data.num_eval_batches = 4
    c.data.worker_count = 0
    c.data.prefetch_buffer_size = 2

    c.train = ml_collections.ConfigDict()
    c.train.global_batch_size = 256
    c.train.grad_accum_steps = 1
    c.train.num_steps = 1_000_000
    c.train.optimizer = "adamw"  # adamw | lamb
    c.train.learning_rate = 1e-4
    c.train.warmup_steps = 10_000
    c.train.end_learning_rate = 0.0
    c.train.b1 = 0.9
    c.train.b2 = 0.999
    c.train.eps = 1e-6
    c.train.weight_decay = 0.01
    c.train.max_grad_norm = 1.0
    c.train.log_every_steps = 100
    c.train.eval_every_steps = 10_000
    c.train.nan_policy = "stop"  # stop: raise with the step number

    c.checkpoint = ml_collections.ConfigDict()
    c.checkpoint.every_steps = 10_000
    c.checkpoint.max_to_keep = 3
    c.checkpoint.async_save = True

    c.mesh = ml_collections.ConfigDict()
    # (data, fsdp, tensor); one -1 is filled with the remaining devices.
    c.mesh.shape = (-1, 1, 1)
    # Logical axis -> mesh axes. The model names only logical axes.
    c.mesh.logical_axis_rules = (
        ("batch", ("data", "fsdp")),
        ("length", None),
        ("embed", "fsdp"),
        ("heads", "tensor"),
        ("kv", None),
        ("mlp", "tensor"),
        ("vocab", "tensor"),
        ("layers", None),
    )

    c.logging = ml_collections.ConfigDict()
    c.logging.wandb_mode = "disabled"  # disabled | offline | online
    c.logging.wandb_project = "bert_jax"
    c.logging.wandb_run_name = ""
    c.logging.tensorboard = True
    c.logging.plots = True
    # Peak FLOP/s of one device for MFU; 0 = look up the device kind, else measure a matmul.
    c.logging.peak_flops_per_device = 0.0
    return c
