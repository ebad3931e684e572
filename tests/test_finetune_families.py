"""Fine-tuning reaches every family's encoder: a random tiny transformers model of each family, saved as a Hugging
Face folder, fine-tunes a classifier through bert_jax.finetune with finite losses, and the export gives
transformers' logits where the family's HF task class takes our head (else it fails naming why)."""
import inspect
import json
import os

import numpy as np
import pytest

import configs.finetune.classification
import finetune_data as fd
from bert_jax.checkpoint import hf_deberta_v3, hf_distilbert, hf_electra, hf_modernbert
from bert_jax.finetune.hf_export import export, load_finetuned
from bert_jax.finetune.run import finetune
from conftest import small_model_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numerics import TRANSFORMERS, relative_error  # noqa: E402

LENGTH = 32
SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64,
             dropout_rate=0.0, attention_dropout_rate=0.0, pad_token_id=0)

# family -> (config.model overrides, converter's hf_config, the transformers class a released checkpoint is)
FAMILIES = {
    "modernbert": (dict(local_attention=16, global_attn_every_n_layers=2, layer_norm_eps=1e-5),
                   hf_modernbert.hf_config, "ModernBertForMaskedLM"),
    "electra": (dict(embedding_size=16, generator_size_ratio=0.5, hidden_act="gelu"),  # E != H: the projection
                hf_electra.hf_config, "ElectraForPreTraining"),
    "deberta_v3": (dict(type_vocab_size=0, layer_norm_eps=1e-7, position_buckets=16, max_relative_positions=64),
                   hf_deberta_v3.hf_config, "DebertaV2Model"),
    "distilbert": (dict(hidden_act="gelu"), hf_distilbert.hf_config, "DistilBertForMaskedLM"),
}
EXPORTS = {"electra", "deberta_v3", "distilbert"}  # modernbert's HF heads are not ours: its export fails, saying so


def write_tiny_hf_folder(family: str, out: str) -> str:
    """A random-init transformers model of `family` (2 layers, hidden 32) with the made data's WordPiece tokenizer."""
    fd.write_tiny_hf_bert(out)  # the tokenizer; the BERT weights are replaced below
    vocab = json.load(open(os.path.join(out, "config.json")))["vocab_size"]
    overrides, hf_config, class_name = FAMILIES[family]
    model_cfg = small_model_config(**SIZES, family=family, vocab_size=vocab, **overrides)
    hf_cfg = hf_config(model_cfg)
    for name in os.listdir(out):
        if name in ("config.json", "model.safetensors"):
            os.remove(os.path.join(out, name))
    torch.manual_seed(0)
    model_class = getattr(transformers, class_name)
    model_class(model_class.config_class(**hf_cfg)).save_pretrained(out)
    return out


def micro_config(init_from: str, files: dict, workdir_steps: int = 4):
    c = configs.finetune.classification.get_config()
    c.init_from = init_from
    c.data.train, c.data.test = files["train.csv"], files["test.csv"]
    c.data.max_seq_length = LENGTH
    c.model.dropout_rate = 0.0
    c.train.batch_size = 8
    c.train.learning_rate = 1e-3
    c.train.epochs = workdir_steps * c.train.batch_size / 32  # 32 training rows: a few steps
    c.train.log_every_steps = 1
    c.checkpoint.async_save = False
    c.checkpoint.every_steps = 1000  # at the end only
    c.logging.plots = False
    return c


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("families_data")
    return {"train.csv": fd.write_csv(d / "train.csv", fd.sentiment_rows(32, 0)),
            "test.csv": fd.write_csv(d / "test.csv", fd.sentiment_rows(8, 1))}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_fine_tunes_from_its_hf_folder_and_exports_with_transformers_logits(family, files, tmp_path,
                                                                                      xla_compile_cache):
    hf_dir = write_tiny_hf_folder(family, str(tmp_path / "hf"))
    workdir = str(tmp_path / "run")
    finetune(micro_config(hf_dir, files), workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    config = json.load(open(os.path.join(workdir, "config.json")))
    print(f"{family}: train losses {np.round(losses, 4).tolist()}")
    assert config["model"]["family"] == family
    assert len(losses) >= 3 and np.all(np.isfinite(losses))
    out = str(tmp_path / "exported")
    if family not in EXPORTS:
        with pytest.raises(ValueError, match=rf"family='{family}'.*does not export"):
            export(workdir, out)
        return
    export(workdir, out)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    enc = tokenizer(["good fine the a", "bad awful of to in with the", "happy"], padding=True, return_tensors="np")
    enc = {k: v for k, v in enc.items() if k in inspect.signature(model.forward).parameters}  # DistilBERT: no types
    with torch.no_grad():
        theirs = model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()
    model_ours, params, _, _ = load_finetuned(workdir)
    ours = np.asarray(model_ours.apply({"params": params}, enc, deterministic=True)["logits"])
    diff = relative_error(ours, theirs)
    print(f"{family}: {type(model).__name__} relative logit error {diff:.2e}")
    assert diff <= TRANSFORMERS
