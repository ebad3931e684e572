"""Pre-training's program, built complete from the config alone (no data, no workdir): the step, the state a fresh
run starts from (random, or config.init_from_hf's weights, or the teacher's layers) and a distillation teacher's
frozen params, read when first needed.

The loop hands it to the harness as it is; the benchmarks and the ahead-of-time planner build the same one, so
what is measured or planned is exactly what trains (the planner never calls `init` or `load_frozen`: nothing is
read).
"""
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from bert_jax.hf import folder as hf_folder
from bert_jax.run.compiler_options import compiler_options
from bert_jax.run.harness import Program
from bert_jax.train.config_validation import validate_mesh_fit
from bert_jax.models.attention import attending_by, building_for, devices_platform
from bert_jax.models.parametrization import attention_multiplier, fold_attention
from bert_jax.checkpoint import reference
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import Family, get_family, model_for, mup_multipliers
from bert_jax.objectives.distillation import distillation_objective
from bert_jax.objectives.objective import Objective
from bert_jax.parallel.mesh import batch_sharding, check_divisible, logical_axis_rules
from bert_jax.train.optimizer import learning_rate_schedule, make_optimizer
from bert_jax.train.state import (EmaTrainState, TrainState, abstract_state_and_shardings, create_sharded_state,
                                  example_batch, make_init_fn)
from bert_jax.train.step import make_eval_step, make_step_tail, make_train_step
from bert_jax.train import growth
from bert_jax.train import teacher as teacher_lib
from bert_jax.train.teacher import Teacher, resolve_teacher
from data_pipelines.loader import pipeline


_DIVISIBILITY_HINT = (
    "Pick a config.mesh.shape whose tensor / fsdp sizes divide the model's sizes (e.g. a smaller "
    "tensor axis), pad config.model.vocab_size to a multiple of the tensor axis, or choose "
    "config.mesh.rules=fsdp / dp."
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainProgram(Program):
    """The harness's Program (mesh, shardings, train_step(state, batch, frozen), init, load_frozen), and what
    pre-training's hooks, the planner and the benchmarks read besides."""

    family: Family
    # the family's for this config (family.objective_for(config.model)), or distillation's with a teacher
    objective: Objective
    model: nn.Module
    schedule: Callable[[int], Any]
    eval_step: Callable  # jitted (params, batch, eval batch index, frozen) -> (sums, weights)
    teacher: Teacher | None = None
    # The steps' `frozen` argument as ShapeDtypeStructs carrying their shardings ({} without a teacher): what
    # the planner lowers with; `load_frozen()` gives the arrays.
    abstract_frozen: Any = dataclasses.field(default_factory=dict)
    frozen_shardings: Any = None
    # The attention kernel the built model runs: `auto` resolved for the mesh's platform, or the family's own
    # kernel for that choice (DeBERTa-v3's fused disentangled kernel for splash).
    attention_kernel: str = "xla"
    # jitted (state, grads, sums, weights, batch) -> (state, metrics): train_step's part after its gradients, once per step
    # however many micro-batches it accumulates. The planner compiles it alone to count it once.
    step_tail: Callable | None = None


def cosine_applies(config, teacher_hidden_size: int) -> bool:
    """config.distill.cosine_weight needs the teacher's hidden size to equal the student's; else it is dropped, said."""
    if teacher_hidden_size == config.model.hidden_size:
        return True
    if config.distill.cosine_weight:
        logging.warning("config.distill.cosine_weight=%g is not applied: the teacher's hidden size %d differs from "
                        "config.model.hidden_size=%d (the loss keeps its KL and MLM terms)",
                        config.distill.cosine_weight, teacher_hidden_size, config.model.hidden_size)
    return False


def build_program(config, mesh: Mesh) -> TrainProgram:
    """Call and run the steps under `jax.set_mesh(program.mesh)` and `nn.logical_axis_rules(program.rules)`.

    Everything is built for the platform of the mesh's devices, which is not the host's when the
    planner compiles for a TPU slice from a CPU host: `auto` picks that platform's kernel, for the card the
    devices are (or the planner names) and for rows packed or not as config.data makes them.
    """
    platform = devices_platform(mesh.devices.flat)
    packed = "segment_ids" in pipeline.batch_spec(config.data, 1)  # several documents per row
    with building_for(platform, packed_rows=packed):
        return _build_program(config, mesh, compiler_options(platform))


def lower_step(program: TrainProgram, config, mesh: Mesh):
    """program.train_step lowered for config's global batch on `mesh`, nothing allocated: what the planner compiles
    for its target, and what remat_policy=auto compiles to see whether the step fits (train/remat_auto.py)."""
    batch = jax.eval_shape(lambda: example_batch(config.data, config.train.global_batch_size))
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=program.data_sharding), batch)
    with jax.set_mesh(mesh), nn.logical_axis_rules(program.rules):
        return program.train_step.lower(program.abstract_state, batch, program.abstract_frozen)


def _build_program(config, mesh: Mesh, options: dict | None) -> TrainProgram:
    validate_mesh_fit(config, mesh)
    family = get_family(config.model.family)
    rules = logical_axis_rules(config.mesh)
    model = family.build_model(config.model)  # resolves config.model.attention_impl, or fails naming it
    kernel = family.kernel_choice(config.model)
    # A family may run its own kernel for the choice (DeBERTa's fused disentangled kernel for splash): name what runs.
    runs = getattr(getattr(model, "config", None), "attention_impl", kernel.impl)
    logging.info("attention kernel: %s (%s%s)", runs, kernel.reason, "" if runs == kernel.impl else f": this family's "
                 f"kernel for {kernel.impl}")
    unroll = getattr(getattr(model, "config", None), "scan_unroll", None)
    if unroll is not None and config.model.get("scan_layers", True):  # config.model.unroll_on_gpu, realised
        logging.info("layer loop: %d layer(s) per iteration (config.model.scan_unroll=%d, unroll_on_gpu=%s)", unroll,
                     config.model.get("scan_unroll", 1), config.model.get("unroll_on_gpu", False))
    objective = family.objective_for(config.model)
    mup = mup_multipliers(config.model)  # None under the standard parametrization
    tx = make_optimizer(config.train, None if mup is None else mup.learning_rate)
    ema_decay = config.train.ema_decay
    init = make_init_fn(model, tx, config.data, config.seed, ema=ema_decay > 0,
                        init_multipliers=None if mup is None else mup.init)
    abstract_state, shardings = abstract_state_and_shardings(init, mesh, rules)
    check_divisible(abstract_state.params, shardings.params, _DIVISIBILITY_HINT)
    data_sharding = batch_sharding(mesh, rules)
    teacher = resolve_teacher(config)  # fails now, naming the path or key, if config.distill is wrong
    frozen_model, abstract_frozen, frozen_shardings = None, {}, None
    if teacher is not None:
        objective = distillation_objective(config.distill, cosine_applies(config, teacher.model_cfg.hidden_size))
        frozen_model = teacher.model
        abstract_frozen, frozen_shardings = teacher.abstract_params(config.data, mesh, rules)
        check_divisible(abstract_frozen, frozen_shardings, _DIVISIBILITY_HINT)
    # How global attention layers cross config.mesh.context's axis, read where the steps are traced.
    scheme = config.mesh.get("context_attention", "all_gather")
    train_step = jax.jit(
        attending_by(scheme, make_train_step(model, objective, tx, config.train.grad_accum_steps, frozen_model,
                                             config.train.dropout_prng, ema_decay=ema_decay)),
        in_shardings=(shardings, data_sharding, frozen_shardings), out_shardings=(shardings, None), donate_argnums=0,
        compiler_options=options,
    )
    eval_step = jax.jit(attending_by(scheme, make_eval_step(model, objective, config.seed, frozen_model)),
                        in_shardings=(shardings.params, data_sharding, None, frozen_shardings),
                        compiler_options=options)
    step_tail = jax.jit(make_step_tail(objective, tx, ema_decay),
                        in_shardings=(shardings, shardings.params, None, None, data_sharding),
                        out_shardings=(shardings, None), compiler_options=options)
    load_frozen, teacher_params = dict, None
    if teacher is not None:
        teacher_params = functools.cache(lambda: teacher.load_params(config.data))  # numpy; read once, when needed

        @functools.cache
        def load_frozen():
            typed = jax.tree.map(lambda p, a: np.asarray(p, a.dtype), teacher_params(), abstract_frozen)
            return jax.device_put(typed, frozen_shardings)

    return TrainProgram(
        mesh=mesh, rules=rules, abstract_state=abstract_state, state_shardings=shardings, data_sharding=data_sharding,
        train_step=train_step, init=_starting_state(config, family, teacher, teacher_params, init, shardings),
        load_frozen=load_frozen, family=family, objective=objective, model=model,
        schedule=learning_rate_schedule(config.train), eval_step=eval_step, teacher=teacher,
        abstract_frozen=abstract_frozen, frozen_shardings=frozen_shardings, attention_kernel=runs,
        step_tail=step_tail,
    )


def _starting_state(config, family, teacher, teacher_params, init, shardings) -> Callable[[], TrainState]:
    """init() of the state a fresh run starts from: a random one, initialised directly on its shards, with
    config.init_from_hf's weights, config.grow_from's grown, or the teacher's layers
    (config.distill.init_student_from_teacher) in."""

    def starting_state() -> TrainState:
        state = create_sharded_state(init, shardings)
        if config.init_from_hf:
            # An HF folder computes standard attention: under μP its query projection is divided by the logits'
            # multiplier, the inverse of the export's fold, so the run starts from the function the folder holds.
            unfold = 1.0 / attention_multiplier(config.model)
            state = _with_new_params(state, shardings, lambda fresh: fold_attention(hf_folder.import_params(
                family, config.model, config.init_from_hf, fresh), unfold, family.roles))
        if config.grow_from:  # a smaller run's weights, tiled and repeated (checked with the config)
            source = reference.resolve(config.grow_from, "config.grow_from", allow_ema=True)
            state = _with_new_params(state, shardings, lambda fresh: growth.grow_params(
                restore_params(source.run, model_for, source.step, ema=source.ema)[0], fresh))
        if teacher is not None and config.distill.init_student_from_teacher:
            state = _with_new_params(state, shardings, lambda fresh: teacher_lib.student_from_teacher(
                fresh, teacher_params(), config.model.num_layers, teacher.model_cfg.num_layers, teacher.path))
        return state

    return starting_state


def _with_new_params(state, shardings, make_params):
    """The fresh state with its params replaced by make_params(fresh numpy params), on the same shards.

    The optimizer state is kept: it is the initial one (zero moments, step 0) either way.
    """
    # Gathered, not device_get: under FSDP on several hosts no host holds every shard.
    fresh = multihost_utils.process_allgather(state.params, tiled=True)
    params = make_params(fresh)
    params = jax.tree.map(lambda new, old: np.asarray(new, old.dtype), params, fresh)
    state = state.replace(params=jax.device_put(params, shardings.params))
    if isinstance(state, EmaTrainState):  # an EMA starts at the params the run starts from, these ones
        state = state.replace(ema=jax.device_put(params, shardings.ema))
    return state
