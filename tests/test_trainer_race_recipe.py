"""The Trainer side of the fine-tuning races (bench/trainer_finetune.py) runs the recipe the bert_jax side runs."""
import math
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import trainer_finetune  # noqa: E402
from bert_jax.configs import suites  # noqa: E402
from bert_jax.configs.finetune import classification  # noqa: E402
from bert_jax.finetune import battery  # noqa: E402

FILES = {"train": "train.jsonl", "dev": "dev.jsonl"}


def smoke_runs():
    """(task spec, its run's config, the Trainer side's run) of each smoke suite task, as the race plans them."""
    suite = suites.load_suite("smoke")
    for name, spec in suite.tasks.items():
        config = battery.run_config(suite, battery.Run(name, spec.learning_rates[0], 1, ""), FILES, "ckpt")
        yield spec, config, trainer_finetune.run_spec(config, task=name, metric=spec.metric)


def test_the_trainer_side_runs_the_smoke_suites_recipe_on_the_battery_rows():
    for spec, config, run in smoke_runs():
        recipe, t = run["recipe"], config.train
        assert (recipe["learning_rate"], recipe["epochs"], recipe["batch_size"], recipe["warmup_fraction"],
                recipe["max_seq_length"], recipe["evals_per_run"], recipe["weight_decay"], recipe["max_grad_norm"]) == (
            spec.learning_rates[0], t.epochs, t.batch_size, t.warmup_fraction, config.data.max_seq_length,
            t.evals_per_run, t.weight_decay, t.max_grad_norm)
        assert (run["seed"], run["files"], run["metric"]) == (
            1, {"train": FILES["train"], "validation": FILES["dev"], "test": ""}, spec.metric)
        pairs = len(spec.text_fields.split(","))
        assert recipe["text_fields"] == battery.TEXT_FIELDS[:pairs] and recipe["label_field"] == "label"
        assert recipe["labels"] == tuple(n for n in spec.labels.split(",") if n)
        when = trainer_finetune.schedule(trainer_finetune.Recipe(**recipe), spec.max_train_rows)
        steps = math.ceil(t.epochs * spec.max_train_rows / t.batch_size)  # bert_jax/finetune/run.py's count
        assert (when.num_steps, when.eval_every) == (steps, steps // t.evals_per_run)
        warmup = trainer_finetune.warmup_steps(trainer_finetune.Recipe(**recipe), steps)
        assert warmup == round(t.warmup_fraction * steps)


@pytest.mark.parametrize("key,value", [("train.layer_lr_decay", 0.9), ("train.grad_accum_steps", 2),
                                       ("task.pooling", "mean"), ("model.dtype", "bfloat16")])
def test_a_recipe_the_trainer_side_cannot_run_is_refused_naming_the_key(key, value):
    c = classification.get_config()
    section, leaf = key.split(".")
    c[section][leaf] = value
    with pytest.raises(ValueError, match=f"config.{key}={value!r}"):
        trainer_finetune.recipe_from_config(c)


@pytest.mark.slow
def test_trainer_takes_the_recipes_steps_and_decays_all_but_biases_and_layernorm(tmp_path):
    """TrainingArguments hold bert_jax's steps, warmup and cadence, and Trainer's own weight-decay split is
    bench/torch_finetune.py's (biases and LayerNorm weights undecayed)."""
    pytest.importorskip("accelerate")
    transformers = pytest.importorskip("transformers")
    from bench import torch_finetune  # noqa: PLC0415 (torch)

    spec, config, run = next(smoke_runs())
    recipe = trainer_finetune.Recipe(**run["recipe"])
    args = trainer_finetune.training_arguments(recipe, spec.max_train_rows, 3, str(tmp_path))
    when = trainer_finetune.schedule(recipe, spec.max_train_rows)
    assert (args.max_steps, args.warmup_steps, args.eval_steps, args.eval_on_start, args.learning_rate,
            args.per_device_train_batch_size, args.weight_decay, args.max_grad_norm, args.seed) == (
        when.num_steps, trainer_finetune.warmup_steps(recipe, when.num_steps), when.eval_every, True,
        recipe.learning_rate, recipe.batch_size, recipe.weight_decay, recipe.max_grad_norm, 3)
    assert str(args.lr_scheduler_type.value) == "linear" and args.use_cpu and args.save_strategy == "no"
    model = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))
    rows = [{"input_ids": [1, 2], "labels": 0}]
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows)
    decayed = trainer.get_decay_parameter_names(model)
    assert sorted(decayed) == sorted(n for n, _ in model.named_parameters()
                                     if not any(k in n for k in torch_finetune.NO_DECAY))
