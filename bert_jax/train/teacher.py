"""The distillation teacher: found from `config.distill.teacher`, checked, built, loaded once, kept frozen.

The teacher is a pre-training workdir (config.json + checkpoints/) or a Hugging Face folder
(config.json + model.safetensors) of any registered family. Its params are the train step's
`frozen` argument (bert_jax/train/step.py): sharded by the same logical rules as the student,
but no part of the train state, so they get no gradient, no optimizer state and no checkpoint.
Everything here that can fail does so before anything compiles, naming the path or config key.
"""
import dataclasses

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import logging

from bert_jax.hf import folder as hf_folder
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import Family, family_of_hf_config, get_family, model_for
from bert_jax.models.probe import probe_batch
from bert_jax.models.scan_layout import SCANNED, stack_layers, unstack_layers
from bert_jax.parallel.mesh import logical_shardings
from bert_jax.run.refusal import refusal
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train.state import example_batch
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

EVERY_OTHER_LAYER = "every_other_layer"
INIT_CHOICES = ("", EVERY_OTHER_LAYER)
# How the student runs, which an HF teacher (whose folder says nothing about it) runs the same way.
_EXECUTION_KEYS = ("dtype", "param_dtype", "scan_layers", "scan_unroll", "unroll_on_gpu", "remat_policy", "attention_impl", "splash_interpret")


@dataclasses.dataclass
class Teacher:
    path: str
    is_workdir: bool  # a pre-training workdir; else a Hugging Face folder
    family: Family
    model_cfg: ml_collections.ConfigDict
    model: nn.Module
    tokenizer_dir: str
    seed: int

    def init_params(self, data_cfg):
        """A fresh initialisation, boxed with logical names (abstract under jax.eval_shape): the family module's
        whole tree, as its checkpoint holds it, whatever the student's batch carries (a SpanBERT teacher's boundary
        head, which a student's batch without span boundaries never runs). `data_cfg` is the student's."""
        del data_cfg  # parameter shapes never depend on the batch
        return self.model.init(jax.random.key(self.seed), probe_batch(), deterministic=True)["params"]

    def abstract_params(self, data_cfg, mesh, rules):
        """(ShapeDtypeStructs carrying their shardings, NamedShardings) of the teacher's params: nothing allocated."""
        boxed = jax.eval_shape(lambda: self.init_params(data_cfg))
        shardings = logical_shardings(boxed, mesh, rules)
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                nn.meta.unbox(boxed), shardings)
        return abstract, shardings

    def load_params(self, data_cfg) -> dict:
        """The teacher's params as numpy arrays, read once from its checkpoint or Hugging Face folder."""
        if self.is_workdir:
            params, step = restore_params(Workdir(self.path), model_for)
            logging.info("distillation teacher: step %d of the workdir %s", step, self.path)
            return params
        fresh = jax.device_get(nn.meta.unbox(jax.jit(lambda: self.init_params(data_cfg))()))
        params, report = self.family.hf.from_hf(hf_folder.read_hf_state(self.path), hf_folder.read_hf_config(self.path),
                                               self.model_cfg, fresh)
        logging.info("distillation teacher: the Hugging Face %s folder %s", self.family.name, self.path)
        if report.kept_from_fallback:
            logging.warning("the teacher %s lacks %d tensor(s), initialised at random with config.seed: %s. Without "
                            "its MLM head the KL term and teacher_mlm_accuracy are a random head's; consider "
                            "--config.distill.kl_weight=0", self.path, len(report.kept_from_fallback),
                            ", ".join(report.kept_from_fallback))
        return params


def enabled(config) -> bool:
    return bool(config.distill.teacher)


def _fail(path: str, why: str) -> ValueError:
    return ValueError(f"config.distill.teacher={path!r} {why}")


def resolve_teacher(config) -> Teacher | None:
    """The teacher `config.distill` names (None if none), after every check that needs no compilation."""
    if not enabled(config):
        return None
    d, m = config.distill, config.model
    path = d.teacher
    root, run = paths.path(path), Workdir(path)
    if not root.is_dir() or not run.config_json.exists():
        raise _fail(path, f"does not exist or holds no {run.config_json.name}: name a pre-training workdir or a "
                          "Hugging Face model folder")
    if run.checkpoints.is_dir():
        teacher_config = run.config()
        if not run.checkpoint_steps():
            raise _fail(path, "is a workdir whose checkpoints/ holds no checkpoint: no weights to teach with")
        model_cfg = ml_collections.ConfigDict(teacher_config.model.to_dict())
        family, is_workdir, tokenizer_dir = get_family(model_cfg.family), True, str(run.tokenizer)
    else:
        hf_cfg = hf_folder.read_hf_config(path)
        if not any((root / name).exists() for name in (hf_folder.SAFETENSORS_FILE, hf_folder.TORCH_FILE)):
            raise _fail(path, f"holds no weights ({hf_folder.SAFETENSORS_FILE} or {hf_folder.TORCH_FILE})")
        family = family_of_hf_config(hf_cfg, f"config.distill.teacher={path!r}")
        if family.hf is None:
            raise _fail(path, f"is a {family.name} folder, and that family has no Hugging Face import")
        values = {k: m[k] for k in _EXECUTION_KEYS if k in m}
        values.update(family.hf.model_config(hf_cfg), family=family.name, dropout_rate=0.0,
                      attention_dropout_rate=0.0)
        model_cfg, is_workdir, tokenizer_dir = ml_collections.ConfigDict(values), False, path
    _check_distill_config(config, model_cfg, path)
    teacher = Teacher(path=path, is_workdir=is_workdir, family=family, model_cfg=model_cfg,
                      model=family.build_model(model_cfg), tokenizer_dir=tokenizer_dir, seed=config.seed)
    _check_outputs(teacher, config)
    return teacher


def _check_outputs(teacher: Teacher, config) -> None:
    """The teacher runs as the step runs it (frozen, deterministic, no rng) and gives what the distillation loss
    reads, traced without compiling; a family that does not (replaced-token detection samples its input)
    fails here naming the path, not inside the step's compilation."""
    needed = ("mlm_logits",) + (("last_hidden_state",) if has_cosine(config, teacher) else ())
    batch = example_batch(config.data, 1)
    try:
        outputs = jax.eval_shape(lambda: teacher.model.apply(
            {"params": nn.meta.unbox(teacher.init_params(config.data))}, batch, deterministic=True))
    except ValueError as e:
        if refusal(e) is None:  # a fault tracing it keeps its traceback
            raise
        raise _fail(teacher.path, f"is a {teacher.family.name} model, which does not run as a frozen teacher: "
                                  f"{e}") from e
    missing = [k for k in needed if k not in outputs]
    if missing:
        raise _fail(teacher.path, f"is a {teacher.family.name} model, whose outputs lack {missing}: distillation "
                                  f"compares the teacher's {' and '.join(needed)} with the student's")


def _check_distill_config(config, teacher_cfg, path: str) -> None:
    d, m = config.distill, config.model
    if d.temperature <= 0:
        raise ValueError(f"config.distill.temperature={d.temperature} must be > 0")
    for key in ("kl_weight", "mlm_weight", "cosine_weight"):
        if d[key] < 0:
            raise ValueError(f"config.distill.{key}={d[key]} must be >= 0")
    if d.init_student_from_teacher not in INIT_CHOICES:
        raise ValueError(f"config.distill.init_student_from_teacher={d.init_student_from_teacher!r}; expected one "
                         f"of {INIT_CHOICES}")
    if teacher_cfg.vocab_size != m.vocab_size:
        raise ValueError(f"config.model.vocab_size={m.vocab_size} but the teacher {path} has vocab_size="
                         f"{teacher_cfg.vocab_size}: KL needs one vocabulary; set --config.model.vocab_size="
                         f"{teacher_cfg.vocab_size} (and use the teacher's tokenizer)")
    # A position table gathers out of range as NaN, not as an error: a longer student row would poison the KL term.
    positions = teacher_cfg.get("max_position_embeddings")
    if positions is not None and config.data.max_seq_length > positions:
        raise ValueError(f"config.data.max_seq_length={config.data.max_seq_length} but the teacher {path} reads at "
                         f"most max_position_embeddings={positions} positions; set --config.data.max_seq_length="
                         f"{positions} or less")
    if d.cosine_weight > 0 and teacher_cfg.hidden_size != m.hidden_size:
        raise ValueError(f"config.distill.cosine_weight={d.cosine_weight} compares hidden states, but "
                         f"config.model.hidden_size={m.hidden_size} differs from the teacher's "
                         f"{teacher_cfg.hidden_size} ({path}); set --config.distill.cosine_weight=0")


def has_cosine(config, teacher: Teacher) -> bool:
    return teacher.model_cfg.hidden_size == config.model.hidden_size


def _vocabulary(tokenizer) -> list[str]:
    return [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]


def check_vocabulary(teacher: Teacher, student_tokenizer, student_tokenizer_dir: str) -> None:
    """The student must tokenize as its teacher did, token for token; else a ValueError naming both tokenizers."""
    teacher_tokenizer = tokenizer_lib.load_tokenizer(teacher.tokenizer_dir)
    ours, theirs = _vocabulary(student_tokenizer), _vocabulary(teacher_tokenizer)
    if ours != theirs:
        first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise ValueError(
            f"the student's tokenizer {student_tokenizer_dir} ({len(ours)} tokens) differs from the teacher's "
            f"{teacher.tokenizer_dir} ({len(theirs)} tokens), first at id {first}; distillation needs one "
            f"vocabulary: leave config.data.tokenizer.path empty in a fresh workdir (the teacher's is copied) "
            f"or point it at the teacher's")


def _layer_source(key: str) -> str:
    """Student `layers_i` <- teacher `layers_{2i+1}`: every other layer, ending with the teacher's last."""
    prefix, _, index = key.rpartition("_")
    if prefix == SCANNED and index.isdigit():
        return f"{SCANNED}_{2 * int(index) + 1}"
    return key


def student_from_teacher(student: dict, teacher: dict, student_layers: int, teacher_layers: int,
                         teacher_path: str) -> dict:
    """The student's params with the teacher's embeddings, every other layer and (where shapes allow) MLM head.

    Paths match by name (families share BERT's names), student layer i taking teacher layer
    2i + 1. An encoder tensor the teacher lacks, or any tensor of another shape, is a ValueError
    naming both; head tensors the teacher lacks keep the student's initialisation.
    """
    if teacher_layers < 2 * student_layers:
        raise ValueError(
            f"config.distill.init_student_from_teacher={EVERY_OTHER_LAYER} needs a teacher of at least 2 x "
            f"config.model.num_layers={student_layers} layers; {teacher_path} has {teacher_layers}")
    scanned = any(SCANNED in path for path in _paths(student))
    source = unstack_layers(teacher)

    def copy(tree: dict, prefix: tuple[str, ...]) -> dict:
        out = {}
        for key, value in tree.items():
            path = prefix + (key,)
            if isinstance(value, dict):
                out[key] = copy(value, path)
                continue
            theirs = _lookup(source, tuple(_layer_source(k) for k in path))
            ours_name = "params/" + "/".join(path)
            if theirs is None:
                if path[0] == "encoder":
                    raise ValueError(f"config.distill.init_student_from_teacher={EVERY_OTHER_LAYER}: the teacher "
                                     f"{teacher_path} has no tensor for {ours_name}")
                out[key] = value
            elif np.shape(theirs) != np.shape(value):
                raise ValueError(f"config.distill.init_student_from_teacher={EVERY_OTHER_LAYER}: {ours_name} has "
                                 f"shape {np.shape(value)} in the student but {np.shape(theirs)} in the teacher "
                                 f"{teacher_path}")
            else:
                out[key] = np.asarray(theirs, np.asarray(value).dtype)
        return out

    params = copy(unstack_layers(student), ())
    return stack_layers(params) if scanned else params


def _paths(tree: dict, prefix=()) -> list[tuple[str, ...]]:
    out = []
    for key, value in tree.items():
        out += _paths(value, prefix + (key,)) if isinstance(value, dict) else [prefix + (key,)]
    return out


def _lookup(tree: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree
