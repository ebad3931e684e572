"""DistilBERT-base (Sanh et al. 2019): 6 layers, hidden 768, 12 heads, MLP 3072, vocab 30522; 66.99M params
(as DistilBertForMaskedLM).

Distilled from a BERT-base teacher (a pre-training workdir or a Hugging Face folder), its
embeddings and every other layer copied into the student first, as in the paper:

    bert-jax pretrain --config=configs/distilbert_base.py --workdir=gs://BUCKET/distilbert \\
        --config.distill.teacher=gs://BUCKET/bert_base --config.data.source=text \\
        --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export --workdir=gs://BUCKET/distilbert --out=distilbert_hf` writes a
`DistilBertForMaskedLM` folder with the teacher's tokenizer. Without `distill.teacher` it
pre-trains a DistilBERT-shaped model by MLM alone.

The paper's recipe, kept here: MLM without NSP, dynamic masking, batches of ~4K sequences,
Adam lr 5e-4 (warmup 5%), loss 5.0 * T^2 * KL + 2.0 * MLM + 1.0 * cosine at T = 2.

Tiny variant: a 2-layer, 64-wide student of a teacher you name, on the embedded corpus:

    bert-jax pretrain --config=configs/tiny.py --workdir=runs/tiny4 \\
        --config.model.num_layers=4                                              # the teacher
    bert-jax pretrain --config=configs/distilbert_base.py:tiny --workdir=runs/distil_tiny \\
        --config.distill.teacher=runs/tiny4

It copies the teacher's tokenizer; with a teacher of hidden size 128 (configs/tiny.py) set
--config.model.hidden_size=128 --config.model.intermediate_size=512 to keep the cosine loss and
--config.distill.init_student_from_teacher=every_other_layer to start from its layers.
"""
from bert_jax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.model.family = "distilbert"
    c.model.num_layers = 6
    c.model.hidden_act = "gelu"
    c.model.layer_norm_eps = 1e-12  # transformers hard-wires it
    c.model.pad_token_id = 0

    c.data.example_builder = "full_sentences"
    c.data.masking = "token"

    c.train.global_batch_size = 4096
    c.train.num_steps = 100_000
    c.train.learning_rate = 5e-4
    c.train.warmup_steps = 5_000
    c.train.weight_decay = 0.0
    c.train.max_grad_norm = 5.0
    c.checkpoint.every_steps = 5_000
    c.distill.init_student_from_teacher = "every_other_layer"  # used once a teacher is named
    if arg == "tiny":
        shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/distilbert_base.py:{arg}: the only variant is 'tiny'")
    return c


def shrink_to_tiny(c) -> None:
    """A 2-layer, 64-wide model on the embedded corpus: a minute or two on 2 CPU cores."""
    c.model.vocab_size = 8192  # configs/tiny.py's, so a tiny BERT can teach it
    c.model.hidden_size = 64
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.intermediate_size = 256
    c.model.max_position_embeddings = 128
    c.model.dtype = "float32"  # bf16 matmuls are slow on CPU
    c.model.scan_layers = False
    c.model.dropout_rate = 0.0
    c.model.attention_dropout_rate = 0.0
    c.data.source = "embedded"
    c.data.max_seq_length = 128
    c.train.global_batch_size = 32
    c.train.num_steps = 400
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 40
    c.train.log_every_steps = 50
    c.train.eval_every_steps = 200
    c.checkpoint.every_steps = 200
    c.distill.cosine_weight = 0.0  # a 64-wide student of a 128-wide teacher: no cosine term
    c.distill.init_student_from_teacher = ""  # nor layers of its width to copy
