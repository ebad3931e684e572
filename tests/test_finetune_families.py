"""Fine-tuning reaches every family's encoder: a random tiny transformers model of each family, saved as a Hugging
Face folder, fine-tunes a classifier through bert_jax.finetune with finite losses, and the export gives
transformers' logits where the family's HF task class takes our head (else it fails naming why); and each
folder is a distillation teacher, or fails before compiling saying why not."""
import inspect
import json
import os

import flax.linen as nn
import jax

import numpy as np
import pytest

import bert_jax.configs.distilbert_base
import bert_jax.configs.finetune.classification
import bert_jax.configs.finetune.sentence_embedding
import bert_jax.configs.finetune.span_qa
import bert_jax.configs.finetune.token_classification
import finetune_data as fd
from bert_jax.hf import (deberta_v3 as hf_deberta_v3, distilbert as hf_distilbert, electra as hf_electra,
                         folder as hf_folder, modernbert as hf_modernbert)
from bert_jax.families import get_family
from bert_jax.finetune import hf_heads, init_from
from bert_jax.finetune import hf_export
from bert_jax.finetune.tasks import get_task
from bert_jax.finetune.run import _pretrained, finetune
from bert_jax.train import teacher as teacher_lib
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
# A family whose HF task classes hold heads ours are not (ModernBERT) declares why; its export fails, saying so.
EXPORTS = {f for f in FAMILIES if not get_family(f).hf.task_heads_missing}


def write_tiny_hf_folder(family: str, out: str, tokenizer_dir: str) -> str:
    """A random-init transformers model of `family` (2 layers, hidden 32) with the made data's WordPiece tokenizer
    (the one in `tokenizer_dir`, a tiny BERT folder of finetune_data's)."""
    vocab = json.load(open(os.path.join(tokenizer_dir, "config.json")))["vocab_size"]
    overrides, hf_config, class_name = FAMILIES[family]
    hf_cfg = hf_config(small_model_config(**SIZES, family=family, vocab_size=vocab, **overrides))
    torch.manual_seed(0)
    model_class = getattr(transformers, class_name)
    model_class(model_class.config_class(**hf_cfg)).save_pretrained(out)
    hf_folder.copy_tokenizer_files(tokenizer_dir, out)
    return out


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return fd.write_tiny_hf_bert(str(tmp_path_factory.mktemp("tokenizer")))


TEXTS = ["good fine the a", "bad awful of to in with the", "happy", "the sad dark day"]
NAMES = ["neg", "pos"]


def transformers_logits(folder: str) -> tuple[dict, np.ndarray]:
    """(the tokenized TEXTS, as the exported model takes them; its logits) of an exported classifier folder."""
    model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
    assert [model.config.id2label[i] for i in range(len(NAMES))] == NAMES
    enc = transformers.AutoTokenizer.from_pretrained(folder)(TEXTS, padding="max_length", max_length=LENGTH,
                                                             return_tensors="np")
    enc = {k: v for k, v in enc.items() if k in inspect.signature(model.forward).parameters}  # DistilBERT: no types
    with torch.no_grad():
        return enc, model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()


def random_task_model(family: str, task_config, num_outputs: int, tokenizer_dir: str, tmp_path):
    """(model, params, batch of TEXTS, resolved config) of a task model on the family's random tiny HF folder, its
    head random (a compiled model.init costs more than the rest)."""
    hf_dir = write_tiny_hf_folder(family, str(tmp_path / "hf"), tokenizer_dir)
    c = task_config.get_config()
    c.init_from, c.data.max_seq_length = hf_dir, LENGTH
    source = init_from.resolve(hf_dir, c.model)
    model = get_task(c.task.kind).build_model(source.family, source.model_cfg, c.task, num_outputs,
                                              "pooler" in source.params)
    enc = transformers.AutoTokenizer.from_pretrained(hf_dir)(TEXTS, padding="max_length", max_length=LENGTH,
                                                             return_tensors="np")
    batch = {k: np.asarray(v, np.int32) for k, v in enc.items()}
    pairs = {f"pair_{k}": v for k, v in batch.items()} if c.task.kind == "sentence_embedding" else {}
    shapes = jax.eval_shape(
        lambda: nn.meta.unbox(model.init(jax.random.key(0), batch | pairs, deterministic=True)["params"]))
    rng = np.random.default_rng(0)
    params = _pretrained(jax.tree.map(lambda s: (0.02 * rng.standard_normal(s.shape)).astype(s.dtype), shapes),
                         source, c)
    config = c.copy_and_resolve_references()
    config.model = source.model_cfg
    return model, params, batch, config


def torch_inputs(hf_model, batch: dict) -> dict:
    return {k: torch.tensor(v) for k, v in batch.items() if k in inspect.signature(hf_model.forward).parameters}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_task_model_on_a_family_hf_folder_has_a_finite_loss_and_exports_with_transformers_logits(
        family, tokenizer_dir, tmp_path):
    """The fast part: the encoder read from the folder through `encode`, a random classifier head, its loss
    and the export; training steps are the slow test's below (a train step's compile per family is ~12 s here)."""
    model, params, batch, config = random_task_model(family, bert_jax.configs.finetune.classification, len(NAMES),
                                                     tokenizer_dir, tmp_path)
    assert config.model.family == family
    batch |= {"labels": np.array([1, 0, 1, 0], np.int32), "label_weights": np.ones(4, np.float32)}
    objective = get_task(config.task.kind).objective(config.task)

    @jax.jit
    def forward(params, batch):
        outputs = model.apply({"params": params}, batch, deterministic=True)
        return outputs["logits"], objective.loss(objective.sums(outputs, batch), objective.weights(batch))

    ours, loss = forward(params, batch)
    print(f"{family}: loss of the fresh head {float(loss):.4f}")
    assert abs(float(loss) - np.log(2)) < 0.1  # a head of std 0.02 is all but uniform over two labels

    if family not in EXPORTS:
        with pytest.raises(ValueError, match=rf"family='{family}'.*does not export"):
            hf_export.hf_task_state(params, config, NAMES)
        return
    state_dict, hf_cfg = hf_export.hf_task_state(params, config, NAMES)
    hf_folder.write_hf_folder(str(tmp_path / "exported"), state_dict, hf_cfg, config.init_from)
    _, theirs = transformers_logits(str(tmp_path / "exported"))
    diff = relative_error(np.asarray(ours), theirs)
    print(f"{family}: {hf_cfg['architectures'][0]} relative logit error {diff:.2e}")
    assert diff <= TRANSFORMERS


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("families_data")
    return {"train.csv": fd.write_csv(d / "train.csv", fd.sentiment_rows(32, 0)),
            "test.csv": fd.write_csv(d / "test.csv", fd.sentiment_rows(8, 1))}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_whole_finetuning_run_from_a_family_hf_folder_exports_with_transformers_logits(
        family, tokenizer_dir, files, tmp_path, xla_compile_cache):
    """`python -m bert_jax.finetune`'s run (data files, checkpoints, evaluation) and `hf_export.export`."""
    hf_dir = write_tiny_hf_folder(family, str(tmp_path / "hf"), tokenizer_dir)
    c = bert_jax.configs.finetune.classification.get_config()
    c.init_from = hf_dir
    c.data.train, c.data.test = files["train.csv"], files["test.csv"]
    c.data.max_seq_length, c.model.dropout_rate = LENGTH, 0.0
    c.train.batch_size, c.train.learning_rate, c.train.epochs, c.train.log_every_steps = 8, 1e-3, 1.0, 1
    c.checkpoint.async_save, c.checkpoint.every_steps, c.logging.plots = False, 1000, False
    workdir = str(tmp_path / "run")
    finetune(c, workdir)
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    losses_ = [r["train/loss"] for r in rows if "train/loss" in r]
    print(f"{family}: train losses {np.round(losses_, 4).tolist()}")
    assert json.load(open(os.path.join(workdir, "config.json")))["model"]["family"] == family
    assert len(losses_) == 4 and np.all(np.isfinite(losses_))
    out = str(tmp_path / "exported")
    if family not in EXPORTS:
        with pytest.raises(ValueError, match=rf"family='{family}'.*does not export"):
            hf_export.export(workdir, out)
        return
    hf_export.export(workdir, out)
    enc, theirs = transformers_logits(out)
    model, params, _, names = hf_export.load_finetuned(workdir)
    assert names == NAMES
    ours = np.asarray(model.apply({"params": params}, enc, deterministic=True)["logits"])
    diff = relative_error(ours, theirs)
    print(f"{family}: exported relative logit error {diff:.2e}")
    assert diff <= TRANSFORMERS


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_hf_folder_is_a_distillation_teacher_or_fails_naming_it(family, tokenizer_dir, tmp_path):
    """An MLM family's folder teaches (its mlm_logits and last_hidden_state traced, nothing compiled); a
    replaced-token-detection one (whose forward samples replacements) fails before compiling, naming the path."""
    hf_dir = write_tiny_hf_folder(family, str(tmp_path / "hf"), tokenizer_dir)
    c = bert_jax.configs.distilbert_base.get_config("tiny")
    c.model.update(vocab_size=json.load(open(os.path.join(hf_dir, "config.json")))["vocab_size"], hidden_size=32,
                   num_heads=2, intermediate_size=64, max_position_embeddings=64, num_layers=1)
    c.data.max_seq_length, c.data.max_predictions_per_seq = LENGTH, 4
    c.distill.teacher, c.distill.cosine_weight = hf_dir, 1.0
    if family in ("electra", "deberta_v3"):
        with pytest.raises(ValueError, match=rf"teacher='{hf_dir}' is a {family} model, which does not run as a "
                                             r"frozen teacher"):
            teacher_lib.resolve_teacher(c)
        return
    teacher = teacher_lib.resolve_teacher(c)
    assert teacher.family.name == family and teacher_lib.has_cosine(c, teacher)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["token_classification", "span_qa"])
@pytest.mark.parametrize("family", sorted(EXPORTS))
def test_token_and_span_heads_on_a_family_export_with_transformers_logits(family, kind, tokenizer_dir, tmp_path):
    """HF's ForTokenClassification (`classifier`) and ForQuestionAnswering (`qa_outputs`) heads are every family's
    the same: the family's encoder export and a renaming."""
    names = ["O", "B-PER", "I-PER"] if kind == "token_classification" else []
    task_config = {"token_classification": bert_jax.configs.finetune.token_classification,
                   "span_qa": bert_jax.configs.finetune.span_qa}[kind]
    model, params, batch, config = random_task_model(family, task_config, len(names) or 2, tokenizer_dir, tmp_path)
    state_dict, hf_cfg = hf_export.hf_task_state(params, config, names)
    hf_folder.write_hf_folder(str(tmp_path / "exported"), state_dict, hf_cfg, config.init_from)
    auto = {"token_classification": transformers.AutoModelForTokenClassification,
            "span_qa": transformers.AutoModelForQuestionAnswering}[kind]
    hf_model = auto.from_pretrained(str(tmp_path / "exported")).eval()
    with torch.no_grad():
        out = hf_model(**torch_inputs(hf_model, batch))
    theirs = (np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1) if kind == "span_qa"
              else out.logits.numpy())
    ours = np.asarray(model.apply({"params": params}, batch, deterministic=True)["logits"])
    real = batch["attention_mask"].astype(bool)
    diff = relative_error(ours[real], theirs[real])
    print(f"{family} {kind}: {type(hf_model).__name__} relative logit error {diff:.2e}")
    assert diff <= TRANSFORMERS


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_sentence_encoder_exports_as_an_auto_model_with_our_embeddings(family, tokenizer_dir, tmp_path):
    """The sentence-transformers export's encoder (AutoModel, ModernBERT's too) mean-pools to our embeddings."""
    model, params, batch, config = random_task_model(family, bert_jax.configs.finetune.sentence_embedding, 1,
                                                     tokenizer_dir, tmp_path)
    out = str(tmp_path / "exported")
    hf_heads.write_sentence_transformers(out, params, config, config.init_from)
    hf_model = transformers.AutoModel.from_pretrained(out).eval()
    with torch.no_grad():
        hidden = hf_model(**torch_inputs(hf_model, batch)).last_hidden_state.numpy()
    mask = batch["attention_mask"][..., None]
    theirs = (hidden * mask).sum(1) / mask.sum(1)
    ours = np.asarray(model.apply({"params": params}, batch, True, method=model.embed))
    diff = relative_error(ours, theirs)
    print(f"{family}: {type(hf_model).__name__} mean-pooled relative error {diff:.2e}")
    assert config.task.pooling == "mean" and diff <= TRANSFORMERS
