"""Permanent checkpoints (`checkpoint.keep_every_steps`), the EMA of the params (`train.ema_decay`, read as
`DIR:STEP:ema`) and `bert-jax average` (issue 52).

The fast tests write small orbax checkpoints the way the train loop does (bert_jax/checkpoint/manager.py) into
folders laid out as runs; the slow ones train micro runs and read them back through export and `init_from`.
"""
import json
import os

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest
from huggingface_hub import ModelCard

import bert_jax.configs.tiny
from bert_jax import UserError
from bert_jax.checkpoint import manager as manager_lib
from bert_jax.checkpoint.params import restore_params
from bert_jax.commands.average import average
from bert_jax.families import model_for
from bert_jax.finetune import init_from
from bert_jax.run.completion import read_done
from bert_jax.storage.workdir import Workdir
from bert_jax.train.config_validation import validate_config
from bert_jax.train.export import export
from bert_jax.train.loop import train_and_evaluate
from bert_jax.train.optimizer import make_optimizer
from bert_jax.train.state import make_init_fn
from test_pretrain import micro_config
from test_workdir import write_config_as_a_run_does


def _manager(directory, every_steps=2, max_to_keep=1, keep_every_steps=0):
    cfg = ml_collections.ConfigDict(dict(every_steps=every_steps, max_to_keep=max_to_keep,
                                         keep_every_steps=keep_every_steps, async_save=False))
    return manager_lib.make_manager(str(directory), cfg)


def _save(manager, step, state):
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))
    manager.wait_until_finished()


@pytest.mark.parametrize("keep_every_steps, kept", [(4, [4, 8]), (0, [8])])
def test_keep_every_steps_keeps_its_multiples_beside_the_rolling_window(tmp_path, keep_every_steps, kept):
    manager = _manager(tmp_path, keep_every_steps=keep_every_steps)
    for step in (2, 4, 6, 8):
        _save(manager, step, {"x": np.full((3,), step, np.float32)})
    manager.close()
    assert sorted(ocp.utils.checkpoint_steps(str(tmp_path))) == kept


@pytest.mark.parametrize("keep_every_steps", [3, -4])
def test_keep_every_steps_off_the_save_grid_is_refused_naming_both_keys(keep_every_steps):
    config = micro_config()
    config.checkpoint.every_steps = 2
    config.checkpoint.keep_every_steps = keep_every_steps
    with pytest.raises(UserError, match=r"config\.checkpoint\.keep_every_steps=.*config\.checkpoint\.every_steps=2"):
        validate_config(config)


def test_ema_decay_outside_0_1_is_refused_naming_the_key():
    config = micro_config()
    config.train.ema_decay = 1.0
    with pytest.raises(UserError, match=r"config\.train\.ema_decay=1\.0"):
        validate_config(config)


def _params(seed, shape=(4, 3), dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {"encoder": {"kernel": rng.standard_normal(shape).astype(dtype),
                        "bias": rng.standard_normal(3).astype(dtype)},
            "head": {"bias": rng.standard_normal(5).astype(dtype)}}


def _fake_run(root, step, params, family="bert", ema=None):
    """A folder laid out as a pre-training run: config.json, tokenizer/, and a train-state checkpoint at `step`."""
    config = bert_jax.configs.tiny.get_config()
    config.model.family = family
    root.mkdir(parents=True)
    write_config_as_a_run_does(root, config)
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    state = {"step": np.int32(step), "params": params, "rng": np.arange(2, dtype=np.uint32),
             "opt_state": {"mu": jax.tree.map(np.zeros_like, params)}}
    if ema is not None:
        state["ema"] = ema
    manager = _manager(root / "checkpoints", max_to_keep=3)
    _save(manager, step, state)
    manager.close()
    return str(root)


def _read_params(out, step, subtree="params"):
    return ocp.PyTreeCheckpointer().restore(os.path.join(out, "checkpoints", str(step), "state"))[subtree]


def test_average_of_a_checkpoint_with_itself_is_it_bit_for_bit(tmp_path):
    a = _fake_run(tmp_path / "a", 4, _params(0))
    out = str(tmp_path / "out")
    assert average(f"{a}:4,{a}:last", None, out) == 4
    jax.tree.map(np.testing.assert_array_equal, _read_params(out, 4), _params(0))
    assert read_done(out)["step"] == 4 and os.path.exists(os.path.join(out, "tokenizer", "vocab.txt"))


def test_average_of_two_is_their_weighted_mean_and_records_its_sources(tmp_path):
    a = _fake_run(tmp_path / "a", 4, _params(0))
    b = _fake_run(tmp_path / "b", 6, _params(1), ema=_params(2))
    out = str(tmp_path / "out")
    average(f"{a}:4,{b}:6", None, out)
    jax.tree.map(lambda got, x, y: np.testing.assert_allclose(got, (x + y) / 2, rtol=0, atol=1e-7),
                 _read_params(out, 4), _params(0), _params(1))
    weighted = str(tmp_path / "weighted")
    average(f"{a}:4,{b}:6:ema", "1,3", weighted)
    jax.tree.map(lambda got, x, y: np.testing.assert_allclose(got, 0.25 * x + 0.75 * y, rtol=0, atol=1e-7),
                 _read_params(weighted, 4), _params(0), _params(2))
    config = json.loads((tmp_path / "weighted" / "config.json").read_text())
    assert config["averaged_from"] == [{"workdir": a, "step": 4, "ema": False, "weight": 0.25},
                                       {"workdir": b, "step": 6, "ema": True, "weight": 0.75}]
    assert config["model"]["family"] == "bert"
    card = ModelCard.load(tmp_path / "weighted" / "README.md")  # the average's model card names its sources
    assert card.data.library_name == "bert_jax" and not card.data.eval_results
    assert f"averaged from: {a}@4 ×0.25 + {b}@6:ema ×0.75" in card.text and "Not evaluated" in card.text


@pytest.mark.parametrize("second, weights, says", [
    (dict(params=_params(1, shape=(4, 5))), None, "encoder/kernel: (4, 5) there, (4, 3) in"),
    (dict(params={"encoder": _params(1)["encoder"]}), None, "parameter head/bias: missing there"),
    (dict(params=_params(1), family="roberta"), None, "'roberta' run"),
    (dict(params=_params(1)), "1", "--weights='1' gives 1 weights for 2"),
    (dict(params=_params(1)), "1,0", "positive"),
])
def test_a_mismatched_average_is_refused_in_one_line_and_creates_nothing(tmp_path, second, weights, says):
    a = _fake_run(tmp_path / "a", 4, _params(0))
    b = _fake_run(tmp_path / "b", 4, **second)
    out = tmp_path / "out"
    with pytest.raises(UserError, match=r"^--(from|weights)") as error:
        average(f"{a}:4,{b}:4", weights, str(out))
    assert says in str(error.value) and "\n" not in str(error.value)
    assert not out.exists()


def test_average_refuses_ema_of_a_run_without_one_and_an_out_in_use(tmp_path):
    a = _fake_run(tmp_path / "a", 4, _params(0))
    with pytest.raises(UserError, match=r":4:ema: .*config\.train\.ema_decay"):
        average(f"{a}:4:ema", None, str(tmp_path / "out"))
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(UserError, match=r"--out=.*used exists and is not empty"):
        average(f"{a}:4", None, str(tmp_path / "used"))
    with pytest.raises(UserError, match=r"--from is empty"):
        average("", None, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # compiles a train step
def test_the_ema_steps_towards_the_new_params_and_a_nonfinite_step_leaves_it_as_it_was():
    from conftest import random_batch, small_model_config

    from bert_jax.families import get_family
    from bert_jax.train.step import make_train_step
    from test_train_step import DATA, train_config

    family = get_family("bert")
    model, tx = family.build_model(small_model_config()), make_optimizer(train_config(warmup_steps=0))
    state = jax.jit(make_init_fn(model, tx, DATA, seed=0, ema=True))()
    jax.tree.map(np.testing.assert_array_equal, state.ema, state.params)
    step = jax.jit(make_train_step(model, family.objective, tx, 1, ema_decay=0.75))
    new, _ = step(state, random_batch(0))
    jax.tree.map(lambda e, p0, p1: np.testing.assert_allclose(e, 0.75 * p0 + 0.25 * p1, rtol=1e-6, atol=1e-7),
                 new.ema, state.params, new.params)
    batch = random_batch(1)
    batch["masked_weights"] = batch["masked_weights"].at[0, 0].set(np.nan)
    skipped, metrics = step(new, batch)
    assert float(metrics["nonfinite"]) == 1.0
    jax.tree.map(np.testing.assert_array_equal, skipped.ema, new.ema)


# --- micro runs ---------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ema_run(tmp_path_factory, xla_compile_cache):
    """Two steps with ema_decay=0.5 and a checkpoint after each."""
    config = micro_config()
    config.train.num_steps = 2
    config.train.ema_decay = 0.5
    config.train.eval_every_steps = 2
    config.checkpoint.every_steps = 1
    config.checkpoint.max_to_keep = 2
    workdir = str(tmp_path_factory.mktemp("ema_run"))
    train_and_evaluate(config, workdir)
    return workdir, config


@pytest.mark.slow
def test_ema_is_the_decayed_average_of_the_params_each_step_saved(ema_run):
    workdir, config = ema_run
    run = Workdir(workdir)
    init = make_init_fn(model_for(config.model), make_optimizer(config.train), config.data, config.seed)
    p0 = jax.device_get(jax.jit(init)().params)  # the run's initial params: the same seed
    p1, _ = restore_params(run, model_for, 1)
    p2, _ = restore_params(run, model_for, 2)
    ema, step = restore_params(run, model_for, 2, ema=True)
    assert step == 2
    jax.tree.map(lambda e, a, b, c: np.testing.assert_allclose(e, 0.25 * a + 0.25 * b + 0.5 * c, rtol=1e-6, atol=0),
                 ema, p0, p1, p2)
    assert not np.array_equal(jax.tree.leaves(ema)[0], jax.tree.leaves(p2)[0])
    # export --ema writes those weights; fine-tuning's init_from reads them as DIR:STEP:ema and DIR:ema.
    out = os.path.join(workdir, "export_ema")
    assert export(workdir, out, 2, "params", ema=True) == 2
    exported = ocp.StandardCheckpointer().restore(os.path.join(out, "params"))
    jax.tree.map(np.testing.assert_array_equal, exported, ema)
    for text in (f"{workdir}:2:ema", f"{workdir}:ema", f"{workdir}:last:ema"):
        source = init_from.resolve(text, ml_collections.ConfigDict())
        assert source.step == 2
        jax.tree.map(np.testing.assert_array_equal, source.params, ema)


@pytest.mark.slow
def test_average_of_a_trained_run_exports_and_fine_tunes_like_a_run(ema_run, tmp_path):
    workdir, _ = ema_run
    run = Workdir(workdir)
    out = str(tmp_path / "merged")
    average(f"{workdir}:1,{workdir}:2:ema", None, out)
    p1, _ = restore_params(run, model_for, 1)
    ema, _ = restore_params(run, model_for, 2, ema=True)
    merged, step = restore_params(Workdir(out), model_for)
    assert step == 1
    jax.tree.map(lambda m, a, b: np.testing.assert_allclose(m, (a + b) / 2, rtol=0, atol=1e-7), merged, p1, ema)
    source = init_from.resolve(out, ml_collections.ConfigDict())
    jax.tree.map(np.testing.assert_array_equal, source.params, merged)
    hf = str(tmp_path / "hf")
    export(out, hf)
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForMaskedLM.from_pretrained(hf)
    assert model.config.hidden_size == 32
    with pytest.raises(UserError, match=r"config\.train\.ema_decay"):
        restore_params(Workdir(out), model_for, ema=True)


@pytest.mark.slow
def test_keep_every_steps_in_a_run_keeps_4_and_8_and_a_resumed_ema_is_exact(tmp_path, xla_compile_cache):
    config = micro_config()
    config.checkpoint.every_steps = 2
    config.checkpoint.max_to_keep = 1
    config.checkpoint.keep_every_steps = 4
    config.train.ema_decay = 0.9
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train_and_evaluate(config, straight)
    assert Workdir(straight).checkpoint_steps() == [4, 8]
    train_and_evaluate(config, resumed, stop_at_step=6)
    train_and_evaluate(config, resumed)
    assert Workdir(resumed).checkpoint_steps() == [4, 8]
    a, _ = restore_params(Workdir(straight), model_for, 8, ema=True)
    b, _ = restore_params(Workdir(resumed), model_for, 8, ema=True)
    jax.tree.map(np.testing.assert_array_equal, a, b)
