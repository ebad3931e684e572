"""Growing a model from a smaller one (`config.grow_from`, bert_jax/train/growth.py): ModernBERT's tiling from the
middle, value for value; the layer rule; copied params bit for bit; a grown model that computes; the refusals,
before anything is created; and (slow) a grown tiny run that starts well below a random init's loss.
"""
import functools
import json
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import bert_jax.configs.modernbert_base
import bert_jax.configs.tiny
from bert_jax import UserError
from bert_jax.checkpoint.manager import STATE_ITEM
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import get_family, model_for
from bert_jax.models.probe import abstract_params
from bert_jax.models.scan_layout import stack_layers, unstack_layers
from bert_jax.storage.workdir import Workdir
from bert_jax.train import growth
from bert_jax.train.config_validation import check_config, resolve_config
from conftest import random_batch, small_model_config
from test_workdir import write_config_as_a_run_does


def tile_from_middle_1d(small: np.ndarray, size: int) -> np.ndarray:
    """ModernBERT's `tile_weights_from_middle` for one axis, as its loops do it: a copy in the middle, then the left
    side filled backwards from the copy's end, the right side forwards from its start."""
    n, offset = len(small), (size - len(small)) // 2
    out = np.zeros(size, small.dtype)
    out[offset:offset + n] = small
    for i in range(offset):
        out[offset - 1 - i] = small[n - 1 - i % n]
    for i in range(offset + n, size):
        out[i] = small[(i - offset) % n]
    return out


@pytest.mark.parametrize("old, new", [(3, 8), (4, 10), (5, 5), (2, 7), (3, 4)])
def test_center_tiling_matches_modernberts_tiling_from_the_middle(old, new):
    small = np.arange(1, old + 1, dtype=np.float32)
    np.testing.assert_array_equal(growth.center_tile(small, (new,)), tile_from_middle_1d(small, new))
    # 2-D: rows then columns, each as in 1-D (ModernBERT tiles columns first; the result is the same).
    matrix = np.arange(old * (old + 1), dtype=np.float32).reshape(old, old + 1)
    want = np.stack([tile_from_middle_1d(col, new + 2) for col in
                     np.stack([tile_from_middle_1d(row, new + 1) for row in matrix]).T], axis=1)
    np.testing.assert_array_equal(growth.center_tile(matrix, (new + 2, new + 1)), want)


def test_the_middle_of_a_tiled_tensor_is_the_small_one_whole():
    small = np.random.default_rng(0).normal(size=(3, 2, 4)).astype(np.float32)
    tiled = growth.center_tile(small, (7, 4, 4))
    np.testing.assert_array_equal(tiled[2:5, 1:3], small)
    np.testing.assert_array_equal(growth.center_tile(small, small.shape), small)


def test_new_layers_start_from_modernberts_layer_map_within_the_stack():
    assert growth.layer_sources(22, 28) == [round(j * 22 / 28) for j in range(28)]  # base -> large
    assert growth.layer_sources(2, 2) == [0, 1]
    assert growth.layer_sources(2, 4) == [0, 0, 1, 1]  # round(1.5) = 2 is past the stack: its last layer
    assert growth.layer_sources(3, 5) == [0, 1, 1, 2, 2]


def _tree(width: int, layers: int, seed: int, extra: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    stack = {f"layers_{i}": {"dense": {"kernel": rng.normal(size=(width, 2 * width)).astype(np.float32),
                                       "bias": np.full((2 * width,), i, np.float32)}} for i in range(layers)}
    tree = {"embed": rng.normal(size=(11, width)).astype(np.float32), "bias": rng.normal(size=(11,)).astype(np.float32),
            "encoder": stack}
    if extra:
        tree["pooler"] = rng.normal(size=(width, width)).astype(np.float32)
    return tree


def test_growth_copies_equal_shapes_bit_for_bit_tiles_wider_repeats_deeper_and_keeps_fresh_extras():
    small, fresh = _tree(4, 2, seed=0), _tree(6, 4, seed=1, extra=True)
    grown = growth.grow_params(small, fresh)
    assert jax.tree.structure(grown) == jax.tree.structure(fresh)
    np.testing.assert_array_equal(grown["bias"], small["bias"])  # same shape: copied
    np.testing.assert_array_equal(grown["embed"], growth.center_tile(small["embed"], (11, 6)))
    np.testing.assert_array_equal(grown["pooler"], fresh["pooler"])  # the small model has none: fresh init stays
    for j, i in enumerate([0, 0, 1, 1]):
        np.testing.assert_array_equal(grown["encoder"][f"layers_{j}"]["dense"]["kernel"],
                                      growth.center_tile(small["encoder"][f"layers_{i}"]["dense"]["kernel"], (6, 12)))
        np.testing.assert_array_equal(grown["encoder"][f"layers_{j}"]["dense"]["bias"], np.full((12,), i))


def test_scanned_and_unrolled_layouts_grow_alike():
    small, fresh = _tree(4, 2, seed=0), _tree(6, 3, seed=1)
    unrolled = growth.grow_params(small, fresh)
    scanned = growth.grow_params(stack_layers(small), stack_layers(fresh))
    assert "layers" in scanned["encoder"]
    jax.tree.map(np.testing.assert_array_equal, unstack_layers(scanned), unrolled)


def test_an_axis_that_would_shrink_is_named():
    with pytest.raises(ValueError, match=r"parameter encoder/layers_0/dense/kernel: cannot tile \(4, 8\) to \(4, 6\)"):
        growth.grow_params(_tree(4, 2, seed=0), {"encoder": {"layers_0": {"dense": {"kernel": np.zeros((4, 6))}}}})


def random_params(model_cfg, seed: int) -> dict:
    """Numpy params of the model's tree and shapes (what a run's state holds), drawn without compiling its init:
    N(0, 0.02) everywhere, norm scales 1."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, a: (np.ones(a.shape, a.dtype) if "scale" in jax.tree_util.keystr(path) else
                         rng.normal(0, 0.02, a.shape).astype(a.dtype)), abstract_params(model_for(model_cfg)))


def _grown_model_config(family: str, **overrides):
    if family == "bert":
        return small_model_config(dropout_rate=0.0, attention_dropout_rate=0.0, **overrides)
    c = micro_config("modernbert").model
    c.update(overrides)
    return c


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_a_grown_model_computes_a_finite_loss_and_keeps_copied_params(family):
    small_cfg = _grown_model_config(family)
    big_cfg = _grown_model_config(family, hidden_size=2 * small_cfg.hidden_size, num_heads=2 * small_cfg.num_heads,
                                  intermediate_size=2 * small_cfg.intermediate_size,
                                  num_layers=small_cfg.num_layers + 1)
    batch = random_batch(0, vocab=small_cfg.vocab_size)
    small, fresh = random_params(small_cfg, 0), random_params(big_cfg, 1)
    growth.check_growable(small, fresh)
    grown = growth.grow_params(small, fresh)
    assert jax.tree.structure(grown) == jax.tree.structure(fresh)
    assert jax.tree.map(np.shape, grown) == jax.tree.map(np.shape, fresh)
    # The vocabulary axis keeps its size: the output bias is the small model's, bit for bit.
    np.testing.assert_array_equal(grown["mlm_output_bias"], small["mlm_output_bias"])
    objective = get_family(family).objective_for(big_cfg)
    outputs = jax.jit(functools.partial(model_for(big_cfg).apply, deterministic=True))({"params": grown}, batch)
    loss = objective.loss(objective.sums(outputs, batch), objective.weights(batch))
    assert np.isfinite(float(loss))


# ------------------------------------------------------------------ refusals, through the config check


def micro_config(family: str = "bert"):
    c = (bert_jax.configs.tiny.get_config() if family == "bert" else
         bert_jax.configs.modernbert_base.get_config("tiny"))
    c.model.update(vocab_size=256, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32)
    c.data.tokenizer.sample_bytes = 200_000
    return c


def write_source_run(root, config, step: int = 3) -> str:
    """A run folder as pre-training leaves it, as far as growth reads: config.json and an orbax checkpoint of the
    params at `step` (the optimizer state and data iterator are not read)."""
    root.mkdir(parents=True, exist_ok=True)
    write_config_as_a_run_does(root, resolve_config(config))
    params = random_params(config.model, 0)
    manager = ocp.CheckpointManager(str(root / "checkpoints"),
                                    item_handlers={STATE_ITEM: ocp.StandardCheckpointHandler()})
    manager.save(step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave({"params": params})}))
    manager.wait_until_finished()
    manager.close()
    return str(root)


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    return write_source_run(tmp_path_factory.mktemp("grow") / "small", micro_config())


def test_the_source_checkpoint_is_read_back_as_the_small_models_params(source_run):
    params, step = restore_params(Workdir(source_run), model_for, 3)
    grown = growth.grow_params(params, random_params(micro_config().model, 1))
    jax.tree.map(np.testing.assert_array_equal, grown, params)  # the same shape: a copy, bit for bit
    assert step == 3


def _grown_config(source_run, **model):
    c = micro_config()
    c.model.update(model)
    c.grow_from = f"{source_run}:3"
    return c


def test_a_deeper_wider_model_of_the_same_family_passes_the_check(source_run):
    config = check_config(_grown_config(source_run, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=64))
    assert config.grow_from == f"{source_run}:3"


@pytest.mark.parametrize("change, says", [
    (dict(hidden_size=8, num_heads=1), "config.model.hidden_size=8 is smaller than the source run's 16"),
    (dict(num_layers=1), "config.model.num_layers=1 is smaller than the source run's 2"),
    (dict(intermediate_size=16), "config.model.intermediate_size=16 is smaller than the source run's 32"),
    (dict(num_heads=1), "config.model.num_heads=1 is smaller than the source run's 2"),
    (dict(vocab_size=512), "config.model.vocab_size=512 here, 256 there"),
    # More heads of a smaller size: no key is smaller, a parameter's axis is.
    (dict(num_heads=4), r"attention/\w+/bias is \(2, 8\) there, \(4, 4\) here"),
])
def test_growth_to_a_smaller_model_is_refused_naming_the_key(source_run, change, says, tmp_path):
    with pytest.raises(UserError, match=r"config\.grow_from=.*" + says):
        check_config(_grown_config(source_run, **change), str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def test_growth_across_families_is_refused_naming_both(source_run):
    c = micro_config("modernbert")
    c.model.vocab_size = 256
    c.grow_from = f"{source_run}:3"
    with pytest.raises(UserError, match=r"config\.grow_from=.*: family bert there, modernbert here"):
        check_config(c)


def test_growth_from_a_missing_step_or_run_is_refused(source_run, tmp_path):
    with pytest.raises(UserError, match=r"config\.grow_from=.*step 7 .* committed steps are \[3\]"):
        check_config(_with(_grown_config(source_run, hidden_size=32), grow_from=f"{source_run}:7"))
    with pytest.raises(UserError, match=r"config\.grow_from=.*does not exist"):
        check_config(_with(micro_config(), grow_from=f"{tmp_path}/nowhere:3"))


def test_growth_with_another_starting_point_is_refused(source_run):
    with pytest.raises(UserError, match=r"config\.grow_from and config\.init_from_hf are both set"):
        check_config(_with(_grown_config(source_run, hidden_size=32), init_from_hf="/some/hf/folder"))


def test_a_resume_of_a_grown_run_reads_no_source(source_run, tmp_path):
    """The run resumes from its own checkpoint: a source moved away since is not looked for."""
    resumed = write_source_run(tmp_path / "grown", micro_config())
    config = check_config(_with(micro_config(), grow_from=f"{tmp_path}/moved_away:3"), resumed)
    assert config.grow_from.endswith("moved_away:3")


def _with(config, **keys):
    config.update(keys)
    return config


# ------------------------------------------------------------------ a real grown run (slow)


@pytest.mark.slow
def test_a_grown_tiny_run_starts_well_below_a_random_inits_loss(tmp_path):
    from bert_jax.train.loop import train_and_evaluate

    def tiny(steps: int, **model):
        c = bert_jax.configs.tiny.get_config()
        c.model.update({**dict(vocab_size=1024, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=128),
                        **model})
        c.data.max_seq_length = c.model.max_position_embeddings = 64
        c.data.num_eval_batches = 1
        c.data.tokenizer.sample_bytes = 1_000_000
        c.train.global_batch_size, c.train.num_steps, c.train.warmup_steps = 16, steps, min(steps, 10)
        c.train.log_every_steps, c.train.eval_every_steps, c.checkpoint.every_steps = 1, steps, steps
        c.logging.plots = False
        c.logging.peak_flops_per_device = 1e11
        return c

    small = str(tmp_path / "small")
    train_and_evaluate(tiny(150), small)
    bigger = dict(hidden_size=64, num_layers=4, num_heads=4, intermediate_size=256)
    grown, fresh = str(tmp_path / "grown"), str(tmp_path / "fresh")
    train_and_evaluate(_with(tiny(2, **bigger), grow_from=f"{small}:last"), grown)
    random_init = tiny(2, **bigger)
    random_init.data.tokenizer.path = os.path.join(small, "tokenizer")  # the same tokens as the grown run
    train_and_evaluate(random_init, fresh)

    def first_loss(workdir):
        rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
        return next(r["train/loss"] for r in rows if "train/loss" in r)

    small_last = [json.loads(line) for line in open(os.path.join(small, "metrics.jsonl"))]
    small_last = [r["train/loss"] for r in small_last if "train/loss" in r][-1]
    print(f"small run's last loss {small_last:.3f}; grown first loss {first_loss(grown):.3f}, "
          f"random init's {first_loss(fresh):.3f}")
    # Measured 7.16 against 7.65 (the small run ends at ~6.6): tiling rescales nothing, so the wider model starts
    # above its source, but well below a random init (docs/results/growth.md).
    assert first_loss(grown) < first_loss(fresh) - 0.3
    for name in os.listdir(os.path.join(small, "tokenizer")):  # the grown run tokenizes as its source did
        if name != "sample.json":
            with open(os.path.join(small, "tokenizer", name), "rb") as a, \
                    open(os.path.join(grown, "tokenizer", name), "rb") as b:
                assert a.read() == b.read(), name
