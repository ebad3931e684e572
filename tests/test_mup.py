"""μP (bert_jax/models/parametrization.py): each parameter's role and multipliers, the optimizer's per-role rates,
the attention logits' 1/head_dim scale and its fold into exports, and the standard path left exactly as it was."""
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from conftest import random_batch, small_model_config

from bert_jax.families import get_family, mup_multipliers
from bert_jax.models import parametrization
from bert_jax.models.attention import logit_scale
from bert_jax.train.optimizer import decay_mask, learning_rate_schedule, make_optimizer


def mup_config(**overrides):
    """The micro BERT (hidden 32, 4 heads) under μP at 4x its base width."""
    return small_model_config(**{"parametrization": "mup", "mup_base_width": 8, **overrides})


def train_config(**overrides):
    values = dict(optimizer="adamw", learning_rate=1e-2, warmup_steps=0, num_steps=10, end_learning_rate=0.0,
                  schedule="constant", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.1, max_grad_norm=1.0,
                  flat_moments=False, new_rows_warmup_steps=0, new_rows_start=0, decay_fraction=0.1)
    values.update(overrides)
    return ml_collections.ConfigDict(values)


def flat(tree) -> dict:
    return {"/".join(str(k.key) for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_each_parameter_takes_the_multipliers_of_its_role():
    mup = mup_multipliers(mup_config(scan_layers=False))
    roles, init, lr = flat(mup.roles), flat(mup.init), flat(mup.learning_rate)
    assert mup.width == 4.0
    expected = {
        "encoder/stack/layers_0/attention/query/kernel": "hidden",  # [hidden, heads, head_dim]: fan-in and out grow
        "encoder/stack/layers_1/mlp_output/kernel": "hidden",
        "pooler/kernel": "hidden",
        "encoder/embeddings/word/embedding": "vector",  # [vocab, hidden]: the tied table stays unscaled
        "encoder/stack/layers_0/attention_norm/norm/scale": "vector",
        "encoder/stack/layers_0/intermediate/bias": "vector",
        "nsp/kernel": "readout",  # [hidden, 2]: width in, fixed out
        "mlm_norm/norm/scale": "readout",  # feeds the tied decoder: μP's output multiplier 1/m
        "mlm_norm/norm/bias": "readout",
        "nsp/bias": "finite",
        "mlm_output_bias": "finite",
    }
    assert {name: roles[name] for name in expected} == expected
    for name, role in expected.items():
        init_power, lr_power = parametrization.MUP_RULES[role]
        assert (init[name], lr[name]) == (4.0 ** init_power, 4.0 ** lr_power), name
    assert (init["pooler/kernel"], lr["pooler/kernel"]) == (0.5, 0.25)
    assert (init["nsp/kernel"], lr["nsp/kernel"]) == (0.25, 0.25)


def test_a_base_width_that_does_not_divide_is_refused_naming_the_key():
    for base in (12, 0, 64, 6):  # 32 % 12, unset, wider than the model, not a multiple of the 4 heads
        with pytest.raises(ValueError, match=rf"^config.model.mup_base_width={base} must divide "
                                             r"config.model.hidden_size=32"):
            parametrization.check(mup_config(mup_base_width=base))
    with pytest.raises(ValueError, match="config.model.parametrization='mu'; expected one of standard, mup"):
        parametrization.check(small_model_config(parametrization="mu"))
    parametrization.check(mup_config())  # 8: fine
    parametrization.check(small_model_config(parametrization="standard", mup_base_width=12))  # unread


def test_attention_logits_fall_as_one_over_head_dim_and_equal_standard_at_the_base_width():
    def scale(hidden, base=32, heads=2):
        cfg = get_family("bert").build_model(mup_config(hidden_size=hidden, mup_base_width=base, num_heads=heads))
        return logit_scale(cfg.config, hidden // heads)

    assert scale(32) == 1 / math.sqrt(16)  # base width: standard's 1/sqrt(head_dim)
    for hidden in (64, 128, 256):
        assert scale(hidden) == pytest.approx(math.sqrt(16) / (hidden // 2), rel=1e-12)  # sqrt(d_base) / d_head
    standard = get_family("bert").build_model(small_model_config()).config
    assert standard.attention_multiplier == 1.0 and logit_scale(standard, 8) == 1 / math.sqrt(8)


def test_the_optimizer_scales_each_leaf_update_and_keeps_lr_times_decay():
    params = {"hidden": jnp.full((3, 3), 0.5), "bias": jnp.full((3,), 0.5)}
    grads = {"hidden": jnp.arange(9.0).reshape(3, 3) - 4, "bias": jnp.asarray([1.0, -2.0, 3.0])}
    t = train_config(max_grad_norm=0.0)
    tx, adam = make_optimizer(t, {"hidden": 0.25, "bias": 1.0}), optax.scale_by_adam(t.b1, t.b2, t.eps)

    @jax.jit
    def first_updates(grads, params):
        return tx.update(grads, tx.init(params), params)[0], adam.update(grads, adam.init(params))[0]

    updates, direction = first_updates(grads, params)
    lr = learning_rate_schedule(t)(0)
    np.testing.assert_allclose(updates["hidden"], -lr * (0.25 * direction["hidden"] + t.weight_decay * 0.5),
                               rtol=1e-6)
    np.testing.assert_allclose(updates["bias"], -lr * direction["bias"], rtol=1e-6)  # bias: no decay


def test_the_standard_optimizer_is_the_chain_it_was():
    """No μP transform in the standard chain: its state has the same structure, its update the same bits."""
    t = train_config()
    params = {"a": {"kernel": jnp.linspace(-1, 1, 12).reshape(3, 4), "bias": jnp.ones(4)}}
    grads = jax.tree.map(lambda p: jnp.sin(7 * p) + 0.1, params)
    before = optax.chain(optax.clip_by_global_norm(t.max_grad_norm), optax.chain(
        optax.scale_by_adam(b1=t.b1, b2=t.b2, eps=t.eps), optax.add_decayed_weights(t.weight_decay, decay_mask),
        optax.scale_by_learning_rate(learning_rate_schedule(t))))
    tx = make_optimizer(t)
    assert jax.tree.structure(tx.init(params)) == jax.tree.structure(before.init(params))
    first = jax.jit(lambda g, p: (tx.update(g, tx.init(p), p)[0], before.update(g, before.init(p), p)[0]))
    ours, theirs = first(grads, params)
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)


def test_init_multipliers_scale_the_values_and_keep_the_logical_names():
    boxed = {"k": nn.LogicallyPartitioned(jnp.ones((2, 2)), ("embed", "mlp")), "b": jnp.ones(2)}
    scaled = parametrization.scale_tree(boxed, {"k": 0.5, "b": 1.0})
    assert scaled["k"].names == ("embed", "mlp")
    np.testing.assert_array_equal(scaled["k"].value, 0.5 * np.ones((2, 2)))
    assert scaled["b"] is boxed["b"]


@pytest.mark.slow
def test_mup_at_its_base_width_is_the_standard_model_bit_for_bit():
    standard, mup = small_model_config(), mup_config(mup_base_width=32)
    multipliers = mup_multipliers(mup)
    assert set(jax.tree.leaves(multipliers.init)) == {1.0} == set(jax.tree.leaves(multipliers.learning_rate))
    batch = random_batch(0)
    model = get_family("bert").build_model(standard)
    params = model.init(jax.random.key(0), batch, deterministic=True)["params"]
    ours = get_family("bert").build_model(mup).apply({"params": params}, batch, deterministic=True)
    theirs = model.apply({"params": params}, batch, deterministic=True)
    np.testing.assert_array_equal(ours["mlm_logits"], theirs["mlm_logits"])


FAMILY_CONFIGS = {"bert": "tiny", "roberta": "roberta_base:tiny", "albert": "albert_base:tiny",
                  "distilbert": "distilbert_base:tiny", "modernbert": "modernbert_base:tiny",
                  "electra": "electra_small:tiny", "deberta_v3": "deberta_v3_small:tiny"}


def family_model_config(family: str, **overrides):
    import importlib

    name, _, arg = FAMILY_CONFIGS[family].partition(":")
    c = importlib.import_module(f"bert_jax.configs.{name}").get_config(*([arg] if arg else []))
    values = dict(c.model, attention_impl="xla", dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")
    values.update(overrides)
    return ml_collections.ConfigDict(values)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_folding_the_attention_multiplier_into_the_query_gives_the_mup_model_s_outputs(family):
    """What every export relies on: the standard model with the folded query computes the μP model's outputs."""
    from hf_parity import random_params
    from numerics import relative_error

    standard = family_model_config(family)
    mup = family_model_config(family, parametrization="mup", mup_base_width=standard.hidden_size // 4)
    mup_model, plain_model = get_family(family).build_model(mup), get_family(family).build_model(standard)
    assert mup_model.config.attention_multiplier == 0.5
    batch = random_batch(1, vocab=97)
    params = random_params(mup_model, batch, seed=0)
    rngs = {"sample": jax.random.key(0)}  # ELECTRA's and DeBERTa's generators sample replacements
    ours = mup_model.apply({"params": params}, batch, deterministic=True, rngs=rngs)
    folded = parametrization.fold_attention(params, mup_model.config.attention_multiplier, get_family(family).roles)
    theirs = plain_model.apply({"params": folded}, batch, deterministic=True, rngs=rngs)
    unfolded = plain_model.apply({"params": params}, batch, deterministic=True, rngs=rngs)
    for name, value in ours.items():
        if jnp.issubdtype(jnp.asarray(value).dtype, jnp.floating):
            assert relative_error(np.asarray(theirs[name]), np.asarray(value)) < 1e-5, name
    logits = next(k for k in ours if k.endswith("logits"))
    assert relative_error(np.asarray(unfolded[logits]), np.asarray(ours[logits])) > 1e-3  # the fold is what matters


@pytest.mark.slow
def test_standard_training_is_unchanged_and_mup_at_its_base_width_trains_the_same_losses(tmp_path):
    """The standard path runs no μP code (its init is the module's, its chain the one before μP; tests above), and
    μP at its base width, which runs it all with multipliers of 1, logs the same losses bit for bit."""
    from test_pretrain import micro_config

    from bert_jax.train.loop import train_and_evaluate

    losses = {}
    for parametrization_name in ("standard", "mup"):
        c = micro_config()
        c.model.parametrization = parametrization_name
        c.model.mup_base_width = c.model.hidden_size if parametrization_name == "mup" else 0  # unread under standard
        c.train.num_steps, c.train.eval_every_steps, c.checkpoint.every_steps = 4, 4, 4
        c.logging.plots = False
        workdir = tmp_path / parametrization_name
        train_and_evaluate(c, str(workdir))
        rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
        losses[parametrization_name] = [(r["step"], r.get("train/loss"), r.get("eval/loss")) for r in rows]
    assert losses["standard"] == losses["mup"]
    assert len(losses["standard"]) >= 4


@pytest.mark.slow
def test_a_mup_run_exports_to_transformers_that_predicts_as_the_run_s_own_eval(tmp_path):
    """The acceptance: a μP pre-training run (4x its base width) exports to a folder that plain transformers loads
    and that gets the run's own held-out MLM accuracy on the run's own eval batches."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from test_pretrain import micro_config

    from bert_jax.storage.workdir import Workdir
    from bert_jax.train.export import export
    from bert_jax.train.loop import train_and_evaluate
    from data_pipelines.loader import pipeline
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    c = micro_config()
    c.model.parametrization, c.model.mup_base_width = "mup", 8
    c.model.attention_dropout_rate = 0.0
    c.train.learning_rate, c.train.num_steps, c.train.eval_every_steps, c.checkpoint.every_steps = 1e-2, 40, 40, 40
    c.logging.plots = False
    workdir, out = tmp_path / "run", str(tmp_path / "hf")
    train_and_evaluate(c, str(workdir))
    evals = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    last_eval = [r for r in evals if "eval/mlm_accuracy" in r][-1]
    run_accuracy, run_loss = last_eval["eval/mlm_accuracy"], last_eval["eval/mlm_loss"]
    export(str(workdir), out)

    run = Workdir(str(workdir))
    config = run.config()
    tokenizer = tokenizer_lib.load_tokenizer(str(run.tokenizer))
    batches = pipeline.build_eval_sets(config.data, tokenizer, seed=config.seed,
                                       per_host_batch_size=config.train.global_batch_size)[0][1]
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    hits = weights = loss = 0.0
    for batch in batches:
        with torch.no_grad():
            logits = model(**{k: torch.tensor(np.asarray(batch[k])) for k in
                              ("input_ids", "attention_mask", "token_type_ids")}).logits.numpy()
        logits = np.take_along_axis(logits, np.asarray(batch["masked_positions"])[..., None], axis=1)
        log_probs = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True)) - \
            logits.max(-1, keepdims=True)
        labels, weight = np.asarray(batch["masked_ids"]), np.asarray(batch["masked_weights"])
        loss -= float(np.sum(np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0] * weight))
        hits += float(np.sum((logits.argmax(-1) == labels) * weight))
        weights += float(np.sum(weight))
    print(f"μP run: eval/mlm_loss {run_loss:.5f}, eval/mlm_accuracy {run_accuracy:.4f}; its export in transformers: "
          f"{loss / weights:.5f}, {hits / weights:.4f}")
    assert run_loss < 0.95 * math.log(config.model.vocab_size)  # it learnt: not two uniform guessers compared
    assert loss / weights == pytest.approx(run_loss, rel=1e-4)  # the whole distribution, not just its argmax
    assert abs(hits / weights - run_accuracy) <= 1e-3
