"""Lockstep training parity: every family's jitted train step against the transformers model(s) it exports to,
trained by torch.optim.AdamW, update for update.

Both sides start from bert_jax's initialisation (exported to transformers through the family's converter), take
bert_jax's own batches (the real data pipeline on the embedded corpus, a micro config), in float32 with dropout off,
and train K = 20 updates with the same betas, eps, weight decay (on the parameters transformers'
`Trainer.get_decay_parameter_names` decays: not biases, not LayerNorms), learning-rate schedule (transformers' own
LambdaLR schedules of the config's kind) and global-norm clipping (torch.nn.utils.clip_grad_norm_). The torch
side's losses are written from the papers and transformers' semantics in tests/training_reference.py. Where a
generator samples replacements (ELECTRA, DeBERTa-v3), the torch side takes the tokens bert_jax's step sampled.

Checked: every step's loss equal to LOSS_RTOL (relative), and every parameter after the 20 updates equal to
PARAM_TOL, compared tensor by tensor in the export's names. A mismatch is a bug on one side: no family needs a
wider bound (docs/results/parity.md, "Lockstep training"). Recipes that are a family's configuration (crammed: Cramming's
on the modernbert family) join as entries of their own. About 7 CPU-minutes, most of it compiling 8 steps:

    python -m pytest -m slow tests/test_training_parity.py -s
"""
import dataclasses
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

import bert_jax.configs.albert_base
import bert_jax.configs.crammed
import bert_jax.configs.deberta_v3_base
import bert_jax.configs.distilbert_base
import bert_jax.configs.electra_small
import bert_jax.configs.modernbert_base
import bert_jax.configs.roberta_base
import bert_jax.configs.spanbert_base
import bert_jax.configs.tiny
from bert_jax.families import get_family
from bert_jax.hf import folder as hf_folder
from bert_jax.parallel.mesh import global_batch, make_mesh
from bert_jax.train.optimizer import decay_mask
from bert_jax.train.program import build_program
from bert_jax.train.run_tokenizer import prepare_run_tokenizer
from bert_jax.train.state import example_batch
from bert_jax.train.step import model_rngs
from data_pipelines.loader import pipeline

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import training_reference as reference  # noqa: E402
from hf_parity import random_params  # noqa: E402

pytestmark = pytest.mark.slow

STEPS = 20
LOSS_RTOL = 1e-5
PARAM_TOL = 1e-4
VOCAB = 512
CONFIGS = {
    "bert": (bert_jax.configs.tiny, None),
    "roberta": (bert_jax.configs.roberta_base, "tiny"),
    "albert": (bert_jax.configs.albert_base, "tiny"),
    "electra": (bert_jax.configs.electra_small, "tiny"),
    "deberta_v3": (bert_jax.configs.deberta_v3_base, "tiny"),
    "modernbert": (bert_jax.configs.modernbert_base, "tiny"),
    "modernbert_clm": (bert_jax.configs.modernbert_base, "tiny,clm"),  # causal LM: Ettin's decoder
    "distilbert": (bert_jax.configs.distilbert_base, "tiny"),
    "crammed": (bert_jax.configs.crammed, "tiny"),  # Cramming's recipe on the modernbert family
    "spanbert": (bert_jax.configs.spanbert_base, "tiny"),  # MLM + the span boundary objective
}
SAMPLING = ("electra", "deberta_v3")  # a generator samples the discriminator's input


def micro_config(name: str):
    """The entry's tiny recipe at micro shapes: 2 layers x 64, seq 32, batch 4, 20 updates with 5 of warmup (a
    one-cycle schedule's rise is its own)."""
    module, arg = CONFIGS[name]
    c = module.get_config(arg)
    c.model.update(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                   max_position_embeddings=64, dtype="float32", scan_layers=False, dropout_rate=0.0,
                   attention_dropout_rate=0.0, attention_impl="xla")
    c.data.update(max_seq_length=32, worker_count=0, num_eval_batches=1)
    c.data.tokenizer.sample_bytes = 200_000  # plenty for 512 tokens, and seconds to train
    c.train.update(global_batch_size=4, num_steps=STEPS, warmup_steps=0 if c.train.schedule == "onecycle" else 5,
                   optimizer="adamw", weight_decay=0.01)
    if c.train.batch_size_warmup.start_batch_size:
        # A ramp's stages are programs of their own (tests/test_stage_ramps.py): one program here. One ramped by
        # accumulation (crammed) accumulates two micro-batches of 2, which transformers trains as one batch of 4.
        c.train.batch_size_warmup.start_batch_size = 0
        c.train.grad_accum_steps = 2 if c.train.batch_size_warmup.accumulate else 1
    c.mesh.shape = (1, 1, 1)
    return c


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """A run folder per tokenizer recipe: families that tokenize alike share one training of it."""
    made = {}

    def workdir_for(config):
        key = json.dumps([config.data.tokenizer.to_dict(), config.model.vocab_size], sort_keys=True)
        if key not in made:
            made[key] = str(tmp_path_factory.mktemp("tokenizer"))
        return made[key]

    return workdir_for


@pytest.fixture(scope="module")
def teacher_folder(tokenizers, tmp_path_factory):
    """DistilBERT's teacher: a micro BERT with its tokenizer, exported. Its weights are drawn at scale 0.2 rather
    than initialised (std 0.02), so that its predictions are peaked and the student's KL term is far from 0."""
    c = micro_config("bert")
    workdir = tokenizers(c)
    prepare_run_tokenizer(c, workdir, None)
    params = random_params(get_family("bert").build_model(c.model), example_batch(c.data, 1), seed=1)
    exported = get_family("bert").hf.to_hf(params, c.model)
    out = str(tmp_path_factory.mktemp("teacher"))
    hf_folder.write_hf_folder(out, exported.state, exported.config, f"{workdir}/tokenizer")
    return out, exported


@dataclasses.dataclass
class Lockstep:
    family: str  # the entry of CONFIGS: a family, or a recipe on one (crammed)
    losses: np.ndarray  # [STEPS, 2]: bert_jax's, torch's
    terms: list  # per step: {term: (bert_jax, torch)}
    ours: dict  # the export of bert_jax's params after STEPS updates
    theirs: dict  # the torch side's, in the same names
    our_decay: dict  # the export of bert_jax's decay mask: name -> bool
    their_decay: dict  # transformers Trainer's: name -> bool


def make_reference(family: str, exported, config, teacher, params):
    weight = config.model.get("discriminator_loss_weight", 50.0)
    if family == "spanbert":
        return reference.SpanBert(exported, params[reference.SpanBert.HEAD], config.model)
    if family == "bert":
        return reference.PreTraining("BertForPreTraining", exported, "next_sentence_label")
    if family == "albert":
        return reference.PreTraining("AlbertForPreTraining", exported, "sentence_order_label")
    if family == "roberta":
        return reference.PreTraining("RobertaForMaskedLM", exported, token_types=False)
    if family == "modernbert" and config.model.objective == "clm":
        return reference.ModernBertDecoder(exported, config.model.pad_token_id)
    if family == "modernbert":
        return reference.ModernBert(exported, config.model.pad_token_id)
    if family == "electra":
        return reference.Electra(exported, weight)
    if family == "deberta_v3":
        return reference.DebertaV3(exported, weight)
    teacher_exported = teacher[1]
    return reference.Distillation(exported, teacher_exported.state, teacher_exported.config, config.distill,
                                  with_cosine=True)


def exported_state(family, params, model_cfg) -> dict:
    """{name: array} of the export, a subfolder's names behind `generator/`, and the heads the export leaves out
    (SpanBERT's SBO) by their paths in our params."""
    exported = family.hf.to_hf(params, model_cfg)
    state = dict(exported.state)
    for folder, (sub, _) in exported.subfolders.items():
        state.update({f"{folder}/{k}": v for k, v in sub.items()})
    for head in family.hf.pretraining_only:
        for path, leaf in jax.tree_util.tree_flatten_with_path(params[head])[0]:
            state["/".join([head, *(str(k.key) for k in path)])] = np.asarray(leaf)
    return state


def torch_schedule(optimizer, train_cfg):
    """transformers' LambdaLR for the config's schedule kind."""
    if train_cfg.schedule == "linear":
        return transformers.get_linear_schedule_with_warmup(optimizer, train_cfg.warmup_steps, train_cfg.num_steps)
    if train_cfg.schedule == "wsd":
        decay = max(int(round(train_cfg.decay_fraction * train_cfg.num_steps)), 1)
        return transformers.get_wsd_schedule(optimizer, train_cfg.warmup_steps, decay, train_cfg.num_steps,
                                             decay_type="1-sqrt")
    if train_cfg.schedule == "onecycle":  # transformers has none: torch's, two linear phases, Adam's betas left alone
        start, end = train_cfg.onecycle_start_factor * train_cfg.learning_rate, train_cfg.end_learning_rate
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=train_cfg.learning_rate, total_steps=train_cfg.num_steps,
            pct_start=train_cfg.onecycle_peak_fraction, anneal_strategy="linear", three_phase=False,
            div_factor=train_cfg.learning_rate / start, final_div_factor=start / end if end else float("inf"),
            cycle_momentum=False)
    raise ValueError(f"no transformers schedule stands for train.schedule={train_cfg.schedule!r}")


def run_lockstep(name: str, tokenizers, teacher) -> Lockstep:
    config = micro_config(name)
    family_name = config.model.family
    if family_name == "distilbert":
        config.distill.update(teacher=teacher[0], cosine_weight=1.0, init_student_from_teacher="")
    family = get_family(family_name)
    program = build_program(config, make_mesh(config.mesh, jax.local_devices()[:1]))
    tokenizer = prepare_run_tokenizer(config, tokenizers(config), program.teacher)
    iterator = pipeline.build_train_iterator(config.data, tokenizer, seed=config.seed,
                                             per_host_batch_size=config.train.global_batch_size)
    batches = [jax.tree.map(np.asarray, next(iterator)) for _ in range(STEPS)]

    def corrupted_ids(state, batch):
        """The discriminator's input bert_jax's step samples: its forward under the step's own key."""
        key = jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step), 0)
        outputs = program.model.apply({"params": state.params}, batch, deterministic=False,
                                      rngs=model_rngs(key, config.train.dropout_prng))
        return outputs["corrupted_ids"]

    sample = jax.jit(corrupted_ids)
    frozen = program.load_frozen()
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        state = program.init()
        params = jax.device_get(state.params)
        ref = make_reference(family_name, family.hf.to_hf(params, config.model), config, teacher, params)
        our_decay = {k: bool(np.all(v > 0)) for k, v in exported_state(
            family, jax.tree.map(lambda p, m: np.full(p.shape, float(m), np.float32), params, decay_mask(params)),
            config.model).items()}
        their_decay = ref.decays()
        named = ref.named_parameters()
        groups = [{"params": [p for n, p in named if their_decay[n]]},
                  {"params": [p for n, p in named if not their_decay[n]], "weight_decay": 0.0}]
        t = config.train
        optimizer = torch.optim.AdamW(groups, lr=t.learning_rate, betas=(t.b1, t.b2), eps=t.eps,
                                      weight_decay=t.weight_decay)
        schedule = torch_schedule(optimizer, t)
        losses, terms = [], []
        for batch in batches:
            placed = global_batch(batch, program.data_sharding)
            corrupted = np.asarray(sample(state, placed)) if family_name in SAMPLING else None
            state, metrics = program.train_step(state, placed, frozen)
            optimizer.zero_grad()
            loss, their_terms = ref.loss(batch, corrupted)
            loss.backward()
            if t.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_([p for _, p in named], t.max_grad_norm)
            optimizer.step()
            schedule.step()
            losses.append((float(metrics["loss"]), loss.item()))
            terms.append({k: (float(metrics[k]), v.item()) for k, v in their_terms.items()})
        ours = exported_state(family, jax.device_get(state.params), config.model)
    return Lockstep(name, np.array(losses), terms, ours, ref.state(), our_decay, their_decay)


@pytest.fixture(scope="module", params=list(CONFIGS))
def lockstep(request, tokenizers, teacher_folder, xla_compile_cache) -> Lockstep:
    return run_lockstep(request.param, tokenizers, teacher_folder)


def test_every_step_loss_equals_transformers(lockstep):
    ours, theirs = lockstep.losses.T
    relative = np.abs(ours - theirs) / np.abs(theirs)
    print(f"{lockstep.family}: loss {ours[0]:.5f} -> {ours[-1]:.5f}; largest relative difference over "
          f"{STEPS} steps {relative.max():.2e} (step {relative.argmax() + 1})")
    for step, terms in enumerate(lockstep.terms, start=1):
        for name, (a, b) in terms.items():
            # A term near 0 (a KL between close distributions) is a difference of near-equal sums: judged on the
            # loss's scale, not its own.
            assert abs(a - b) <= LOSS_RTOL * max(abs(b), 1.0), f"step {step} {name}: bert_jax {a:.7f}, " \
                                                                f"transformers {b:.7f}"
    assert relative.max() <= LOSS_RTOL, f"losses (bert_jax, transformers):\n{lockstep.losses}"


def test_parameters_after_twenty_updates_equal_transformers(lockstep):
    names = sorted(set(lockstep.ours) & set(lockstep.theirs))
    assert set(lockstep.ours) <= set(lockstep.theirs), set(lockstep.ours) - set(lockstep.theirs)
    diffs = {n: float(np.max(np.abs(lockstep.ours[n] - lockstep.theirs[n]))) for n in names}
    worst = max(diffs, key=diffs.get)
    print(f"{lockstep.family}: {len(names)} tensors; largest difference after {STEPS} updates {diffs[worst]:.2e} "
          f"({worst})")
    bad = {n: d for n, d in diffs.items() if d > PARAM_TOL}
    assert not bad, bad


def test_weight_decay_falls_on_the_parameters_transformers_trainer_decays(lockstep):
    differ = {n: (lockstep.our_decay[n], lockstep.their_decay[n]) for n in lockstep.their_decay
              if n in lockstep.our_decay and lockstep.our_decay[n] != lockstep.their_decay[n]}
    assert not differ, f"(bert_jax decays, transformers' Trainer decays): {differ}"
