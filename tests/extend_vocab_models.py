"""Tiny Hugging Face folders of every family, with a trained tokenizer of the family's kind, for the extend-vocab
tests; and the domain corpus they are extended on."""
import numpy as np
from conftest import random_batch, small_model_config
from hf_parity import random_params

from bert_jax.families import get_family
from data_pipelines.sources import corpus
from data_pipelines.tokenizers.kinds import get_kind

# family -> (config.model overrides as each family's HF parity test has them, tokenizer kind, the transformers
# classes of the main folder and of `generator/`, or None)
FAMILIES = {
    "bert": (dict(), "wordpiece", "BertForPreTraining", None),
    "roberta": (dict(type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1), "bpe", "RobertaForMaskedLM", None),
    "albert": (dict(embedding_size=16, num_layers=3, num_hidden_groups=2, hidden_act="gelu_new", pad_token_id=0),
               "unigram", "AlbertForPreTraining", None),
    "electra": (dict(embedding_size=16, generator_size_ratio=0.25, hidden_act="gelu", pad_token_id=0),
                "wordpiece", "ElectraForPreTraining", "ElectraForMaskedLM"),
    "deberta_v3": (dict(type_vocab_size=0, layer_norm_eps=1e-7, position_buckets=8, max_relative_positions=16,
                        pad_token_id=0, generator_num_layers=1), "unigram", "DebertaV2Model", "DebertaV2ForMaskedLM"),
    "modernbert": (dict(num_layers=3, layer_norm_eps=1e-5, local_attention=8, global_attn_every_n_layers=3,
                        global_rope_theta=160_000.0, local_rope_theta=10_000.0, attention_bias=False, mlp_bias=False,
                        norm_bias=False, decoder_bias=True, classifier_bias=False, hidden_act="gelu", pad_token_id=1,
                        type_vocab_size=None), "bpe", "ModernBertForMaskedLM", None),
    "distilbert": (dict(type_vocab_size=1, hidden_act="gelu", pad_token_id=0), "wordpiece", "DistilBertForMaskedLM",
                   None),
}
# Padding rows a model may hold past its tokenizer (vocab_size rounded up): ModernBERT's folder has some, so the
# extension reuses them before it grows the table.
PADDING_ROWS = {"modernbert": 3}

# A pharmacology corpus, unlike the Python documentation the tokenizers learned from.
DRUGS = ("acetaminophen", "ibuprofen", "hepatotoxicity", "pharmacokinetics", "thrombocytopenia", "nephrotoxicity")
FILLER = ("the patient", "was given", "after", "because of", "and", "with", "showed", "reduced")


def general_texts(count: int = 200) -> list[str]:
    return [" ".join(document) for document, _ in zip(corpus.embedded_documents(), range(count))]


def domain_lines(count: int = 60, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    weights = np.array([6, 5, 4, 3, 2, 1], float)
    return [" ".join(f"{rng.choice(FILLER)} {rng.choice(DRUGS, p=weights / weights.sum())}" for _ in range(4))
            for _ in range(count)]


def train_tokenizer(kind: str, vocab_size: int = 400):
    return get_kind(kind).train(general_texts(), vocab_size)


def model_config(family: str, vocab_size: int):
    overrides, *_ = FAMILIES[family]
    values = dict(family=family, vocab_size=vocab_size + PADDING_ROWS.get(family, 0), dropout_rate=0.0,
                  attention_dropout_rate=0.0, attention_impl="xla", scan_layers=False, **overrides)
    cfg = small_model_config(**{k: v for k, v in values.items() if v is not None})
    if overrides.get("type_vocab_size", 0) is None:
        del cfg["type_vocab_size"]
    return cfg


def write_family_folder(family: str, tokenizer_dir: str, vocab_size: int, out: str, seed: int = 0):
    """A random-weight HF folder of `family` (and its generator/) with the tokenizer in tokenizer_dir."""
    model_cfg = model_config(family, vocab_size)
    params = random_params(get_family(family).build_model(model_cfg), random_batch(0), seed=seed)
    get_family(family).hf.to_hf(params, model_cfg).write(out, tokenizer_dir)
    return model_cfg
