"""μP in fine-tuning: `config.train.parametrization`, for an encoder pre-trained under μP.

The encoder's forward pass is its pre-training run's whatever this key says: its config (read from the source)
carries `parametrization` and `mup_base_width`, so the attention logits keep their 1/head_dim multiplier and the
fine-tuned model computes what the pre-trained one did.

"standard" (the default) is the field's recipe on top: one learning rate for every parameter, the head initialised
N(0, initializer_range). "mup" applies μP to fine-tuning too, so a rate found by fine-tuning a narrow model holds
for a wide one of the same base width: the task model's roles come from its shapes at its width and at twice it,
as pre-training finds them (bert_jax/models/parametrization.py, the same table), so the encoder's hidden matrices
learn x 1/m, and the task head is sorted like any parameter: its classifier (width in, labels out) is a readout,
initialised and updated x 1/m; a head's hidden-to-hidden dense is hidden, initialised x m^-1/2 and updated x 1/m.
"mup" on an encoder pre-trained under standard (or a Hugging Face folder, whose export folded μP away) has no
width multiplier to apply, and is refused.
"""
import flax.linen as nn
import jax
import ml_collections

from bert_jax.models import parametrization

CHOICES = ("standard", "mup")


def check_choice(train_cfg) -> str:
    """config.train.parametrization, one of CHOICES (ValueError naming the key otherwise)."""
    name = train_cfg.get("parametrization", "standard")
    if name not in CHOICES:
        raise ValueError(f"config.train.parametrization={name!r}; expected one of {', '.join(CHOICES)}")
    return name


def check(train_cfg, source_model_cfg, source: str) -> None:
    """config.train.parametrization against the encoder's `config.model` (`source`: config.init_from, for the
    message); ValueError in one line naming the key."""
    name = check_choice(train_cfg)
    if name == "mup" and not (source_model_cfg and parametrization.is_mup(source_model_cfg)):
        raise ValueError(f"config.train.parametrization='mup' needs an encoder pre-trained under μP, but "
                         f"config.init_from={source!r} is standard; set --config.train.parametrization=standard")


def _abstract_task_params(task, family, model_cfg, task_cfg, num_outputs: int, has_pooler: bool, example: dict):
    model_cfg = ml_collections.ConfigDict(dict(model_cfg, attention_impl="xla"))  # shapes only: the reference kernel
    model = task.build_model(family, model_cfg, task_cfg, num_outputs, has_pooler)
    return jax.eval_shape(lambda: nn.meta.unbox(
        model.init(jax.random.key(0), example, deterministic=True)["params"]))


def multipliers(train_cfg, task, family, model_cfg, task_cfg, num_outputs: int, has_pooler: bool,
                example: dict) -> parametrization.Multipliers | None:
    """The task model's μP multipliers (init and learning rate, trees shaped like its params) under
    config.train.parametrization="mup"; None under "standard". `example`: one featurized row."""
    if train_cfg.get("parametrization", "standard") != "mup":
        return None
    build = lambda cfg: _abstract_task_params(task, family, cfg, task_cfg, num_outputs, has_pooler,  # noqa: E731
                                              example)
    return parametrization.multipliers(model_cfg, build(model_cfg),
                                       build(parametrization.widened(model_cfg, family.roles)), family.roles)
