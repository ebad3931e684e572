"""Fine-tuning an encoder pre-trained under μP (bert_jax/finetune/parametrization.py): the encoder computes what the
pre-trained model did, config.train.parametrization="mup" applies μP's table to the task model (the head's
classifier a readout), and asking for it on a standard encoder is refused in one line."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import random_batch, small_model_config

import bert_jax.configs.finetune.classification
from bert_jax.families import get_family, model_for
from bert_jax.finetune import config_validation, init_from
from bert_jax.finetune import parametrization as finetune_mup
from bert_jax.finetune.optimizer import make_optimizer
from bert_jax.finetune.tasks import get_task
from bert_jax.train.state import make_init_fn

WIDTH = 4.0  # hidden 32 over base width 8


def mup_model_config(**overrides):
    # initializer_range 0.2: logits large enough that the attention multiplier shows in the outputs.
    return small_model_config(**{"parametrization": "mup", "mup_base_width": 8, "scan_layers": False,
                                 "dropout_rate": 0.0, "attention_dropout_rate": 0.0, "initializer_range": 0.2,
                                 **overrides})


def finetune_config(parametrization="mup"):
    c = bert_jax.configs.finetune.classification.get_config()
    c.train.parametrization = parametrization
    c.train.weight_decay, c.train.max_grad_norm = 0.0, 0.0  # updates compared leaf by leaf, nothing coupling them
    return c


def flat(tree) -> dict:
    return {"/".join(str(k.key) for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def task_multipliers(parametrization="mup"):
    c, batch = finetune_config(parametrization), random_batch(0)
    example = {k: batch[k][:1] for k in ("input_ids", "token_type_ids", "attention_mask")}
    return finetune_mup.multipliers(c.train, get_task("classification"), get_family("bert"), mup_model_config(),
                                    c.task, 2, True, example)


def test_mup_finetuning_takes_the_table_for_encoder_and_head():
    mup = task_multipliers()  # shapes only (two traces), nothing compiled
    roles, init, lr = flat(mup.roles), flat(mup.init), flat(mup.learning_rate)
    expected = {"head/classifier/kernel": ("readout", 1 / WIDTH, 1 / WIDTH),  # [hidden, labels]: the readout
                "head/classifier/bias": ("finite", 1.0, 1.0),
                "backbone/encoder/stack/layers_0/attention/query/kernel": ("hidden", WIDTH ** -0.5, 1 / WIDTH),
                "backbone/pooler/kernel": ("hidden", WIDTH ** -0.5, 1 / WIDTH),
                "backbone/encoder/embeddings/word/embedding": ("vector", 1.0, 1.0)}
    assert {name: (roles[name], init[name], lr[name]) for name in expected} == expected
    assert task_multipliers("standard") is None

    # Through optax: each leaf's first update is the standard optimizer's times its learning-rate multiplier (a
    # slice of the task model's tree).
    pick = lambda tree: {"head": {"classifier": tree["head"]["classifier"]},  # noqa: E731
                         "backbone": {"pooler": tree["backbone"]["pooler"]}}
    factors = pick(mup.learning_rate)
    rng = np.random.default_rng(0)
    shapes = pick(jax.tree.map(lambda s: s, mup.roles))  # the slice's structure
    params = {"head": {"classifier": {"kernel": rng.normal(size=(32, 2)), "bias": rng.normal(size=2)}},
              "backbone": {"pooler": {"kernel": rng.normal(size=(32, 32)), "bias": rng.normal(size=32)}}}
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    assert jax.tree.structure(params) == jax.tree.structure(shapes)
    grads = jax.tree.map(lambda p: 0.5 + 0.1 * p, params)
    family = get_family("bert")
    standard, _ = make_optimizer(finetune_config("standard").train, 10, 2, family)
    scaled, _ = make_optimizer(finetune_config().train, 10, 2, family, factors)
    both = jax.jit(lambda: [flat(tx.update(grads, tx.init(params), params)[0]) for tx in (standard, scaled)])
    plain, ours = both()  # one small program: faster than the same ops one by one
    for name, factor in flat(factors).items():
        np.testing.assert_allclose(ours[name], plain[name] * factor, rtol=1e-6, err_msg=name)
    assert flat(factors)["head/classifier/kernel"] == 1 / WIDTH


def test_mup_finetuning_of_a_standard_encoder_is_refused_in_one_line(tmp_path):
    c = finetune_config()
    with pytest.raises(ValueError) as error:
        finetune_mup.check(c.train, small_model_config(), "/runs/std")
    assert "\n" not in str(error.value) and "config.train.parametrization='mup'" in str(error.value)
    finetune_mup.check(c.train, mup_model_config(), "/runs/mup")  # accepted
    finetune_mup.check(finetune_config("standard").train, small_model_config(), "/runs/std")  # the default
    with pytest.raises(ValueError, match="config.train.parametrization='mu'"):
        finetune_mup.check(ml_collections.ConfigDict({"parametrization": "mu"}), mup_model_config(), "x")
    # What check_config reads of the source, weights unread: a run's config.json `model`; an HF config.json: none.
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": mup_model_config().to_dict()}))
    assert config_validation._source_model_config(str(tmp_path / "run"))["parametrization"] == "mup"
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    assert config_validation._source_model_config(str(tmp_path / "hf")) is None


@pytest.mark.slow
def test_finetuning_from_a_mup_run_keeps_its_encoder_and_trains_under_mup(tmp_path):
    """A real μP micro pre-training run (2 steps), fine-tuned from its workdir: the encoder computes what the
    pre-training model does, check_config takes "mup" for it and refuses it for a standard HF folder, and a
    fine-tuning run under "mup" trains, its classifier initialised x 1/m."""
    pytest.importorskip("transformers")
    import finetune_data as fd
    from test_finetune import micro_config
    from test_pretrain import micro_config as pretrain_micro_config

    import bert_jax
    from bert_jax.checkpoint.params import restore_params
    from bert_jax.finetune.run import finetune
    from bert_jax.storage.workdir import Workdir
    from bert_jax.train.loop import train_and_evaluate

    hf_dir = fd.write_tiny_hf_bert(str(tmp_path / "hf"))
    hf_cfg = json.load(open(tmp_path / "hf" / "config.json"))
    p = pretrain_micro_config()
    p.init_from_hf = hf_dir
    p.model.vocab_size, p.model.num_heads, p.model.max_position_embeddings = hf_cfg["vocab_size"], 2, 64
    p.model.parametrization, p.model.mup_base_width = "mup", 8  # hidden 32: m = 4
    p.model.scan_layers = False
    p.data.max_seq_length, p.data.max_predictions_per_seq = 32, 5
    p.train.num_steps = p.train.eval_every_steps = p.checkpoint.every_steps = 2
    p.logging.plots = False
    workdir = str(tmp_path / "pretrain")
    train_and_evaluate(p, workdir)

    files = {"train.csv": fd.write_csv(tmp_path / "train.csv", fd.sentiment_rows(256, 0)),
             "test.csv": fd.write_csv(tmp_path / "test.csv", fd.sentiment_rows(64, 1))}
    c = micro_config("classification", workdir, files)
    # μP's rate is the base width's: 3e-3 (what the standard micro run takes) x m here, or the hidden matrices and
    # the head learn at a quarter of it and the run stays at chance in 4 epochs.
    c.train.parametrization, c.train.learning_rate = "mup", 1.2e-2

    # The encoder, read as fine-tuning reads it (scanned here, unrolled there), computes the pre-training model's.
    source = init_from.resolve(workdir, c.model)
    assert (source.model_cfg.parametrization, source.model_cfg.mup_base_width) == ("mup", 8)
    run_model_cfg = Workdir(workdir).config().model
    pretrained, _ = restore_params(Workdir(workdir), model_for)
    task = get_task("classification")
    model = task.build_model(source.family, source.model_cfg, c.task, 2, True)
    batch = {k: v[:, :32] % hf_cfg["vocab_size"] for k, v in random_batch(3, length=32).items()
             if k in ("input_ids", "token_type_ids", "attention_mask")}
    example = {k: v[:1] for k, v in batch.items()}
    fresh = nn.meta.unbox(jax.jit(lambda: model.init(jax.random.key(0), example, deterministic=True))()["params"])
    params = {**fresh, "backbone": init_from.backbone_subset(source.params, fresh["backbone"])}

    def encode(module, variables):
        return np.asarray(jax.jit(lambda: module.apply({"params": variables}, batch, method="encode")["hidden"])())

    ours = encode(model, params)
    theirs = encode(model_for(run_model_cfg), pretrained)
    standard = encode(model_for(ml_collections.ConfigDict({**run_model_cfg.to_dict(),
                                                           "parametrization": "standard"})), pretrained)
    print(f"encoder: fine-tuning vs pre-training max |diff| {np.abs(ours - theirs).max():.2e}; the same weights "
          f"under standard {np.abs(standard - theirs).max():.2e}")
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-6)
    assert np.abs(standard - theirs).max() > 10 * np.abs(ours - theirs).max()

    # check_config: "mup" is taken for the μP run and refused for a standard HF folder, in one line.
    config_validation.check_config(c)
    refused = c.copy_and_resolve_references()
    refused.init_from = hf_dir
    with pytest.raises(bert_jax.UserError, match="config.train.parametrization='mup'") as error:
        config_validation.check_config(refused)
    assert "\n" not in str(error.value)

    # The run's head starts x 1/m of the standard draw; the run trains.
    mup = task_multipliers_for(c, source, example)
    tx = make_optimizer(c.train, 10, 2, source.family, mup.learning_rate)[0]
    start = flat(jax.jit(make_init_fn(model, tx, None, 0, example=example, init_multipliers=mup.init))().params)
    base = flat(jax.jit(make_init_fn(model, tx, None, 0, example=example))().params)
    np.testing.assert_allclose(start["head/classifier/kernel"], base["head/classifier/kernel"] / WIDTH, rtol=1e-6)
    results = finetune(c, str(tmp_path / "finetune"))
    print(f"fine-tuned under mup: test accuracy {results['test']['accuracy']:.3f}")
    assert np.isfinite(results["test"]["loss"]) and results["test"]["accuracy"] > 0.8  # the majority class: 0.5


def task_multipliers_for(c, source, example):
    return finetune_mup.multipliers(c.train, get_task("classification"), source.family, source.model_cfg, c.task,
                                    2, True, example)
