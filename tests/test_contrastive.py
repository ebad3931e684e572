"""Contrastive training at scale (bert_jax/finetune/contrastive.py): a pair's negatives are the whole global batch,
so on 8 devices the loss and gradients are those of one device holding the whole batch; GradCache gives the
whole batch's gradient from chunks of a quarter of it; hard negatives, a learnt temperature and Matryoshka
dimensions go through the same step, and the task reads the negative column as it says."""
import collections
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import bert_jax.configs.finetune.sentence_embedding
from bert_jax import UserError
from bert_jax.families import get_family
from bert_jax.finetune.tasks import get_task
from bert_jax.train.state import TrainState

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, LENGTH, VOCAB, NEGATIVES = 16, 8, 64, 1


def setup(num_negatives: int = NEGATIVES, grad_accum_steps: int = 1):
    """A 1-layer BERT (hidden 16) under the ranking head with hard negatives, a learnt temperature and Matryoshka
    dims; its random params; a batch of BATCH random pairs, the last 3 rows padding."""
    config = bert_jax.configs.finetune.sentence_embedding.get_config()
    config.task.update(negative_field="negative", num_negatives=num_negatives, learn_temperature=True,
                       matryoshka_dims="8,4")
    config.train.grad_accum_steps = grad_accum_steps
    config.data.packing = False
    model_cfg = ml_collections.ConfigDict(dict(
        family="bert", vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
        max_position_embeddings=LENGTH, type_vocab_size=2, dropout_rate=0.0, attention_dropout_rate=0.0,
        layer_norm_eps=1e-12, initializer_range=0.02, scan_layers=True, remat_policy="none", dtype="float32",
        param_dtype="float32"))
    task = get_task("sentence_embedding")
    model = task.build_model(get_family("bert"), model_cfg, config.task, 1)
    rng = np.random.default_rng(0)
    batch = {}
    for prefix in task.texts(config.task):
        lengths = rng.integers(3, LENGTH + 1, BATCH)
        mask = (np.arange(LENGTH)[None] < lengths[:, None]).astype(np.int32)
        batch.update({f"{prefix}input_ids": (rng.integers(5, VOCAB, (BATCH, LENGTH)) * mask).astype(np.int32),
                      f"{prefix}attention_mask": mask, f"{prefix}token_type_ids": np.zeros_like(mask)})
    batch["label_weights"] = np.r_[np.ones(BATCH - 3), np.zeros(3)].astype(np.float32)
    batch["labels"] = np.zeros(BATCH, np.int32)
    params = jax.jit(lambda: nn.meta.unbox(model.init(jax.random.key(1), batch, deterministic=True)["params"]))()
    params = jax.tree.map(np.asarray, params)
    return config, task, model, params, batch


def reference(config, task, model, params, batch):
    """(loss, grads) of the whole batch on one device: the loss of the objective on the model's outputs."""
    objective = task.objective(config.task)

    def loss(p):
        outputs = model.apply({"params": p}, batch, deterministic=True)
        return objective.loss(objective.sums(outputs, batch), objective.weights(batch))

    device = jax.local_devices()[0]
    value, grads = jax.jit(jax.value_and_grad(loss))(jax.device_put(params, device))
    return float(value), jax.tree.map(np.asarray, grads)


# The optimizer the step is given: it applies nothing and keeps the step's gradient as its state, so the test reads
# the gradient that the real step (its accumulation, its GradCache, its sharding) computed, bit for bit.
KEEP_GRADIENT = optax.GradientTransformation(lambda p: jax.tree.map(jnp.zeros_like, p),
                                             lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g))


def step(config, task, model, params, batch, mesh=None):
    """(loss, grads) of the fine-tuning run's train step (task.make_train_step), the batch split over `mesh`'s
    data axis (every process passes the whole batch; the step's outputs are replicated: read here from this
    process's first device)."""
    objective = task.objective(config.task)
    train_step = task.make_train_step(model, objective, KEEP_GRADIENT, config)
    state = TrainState(step=jnp.int32(0), params=params, opt_state=KEEP_GRADIENT.init(params),
                       rng=jax.random.key_data(jax.random.key(0)))
    if mesh is not None:
        replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
        state, batch = jax.device_put(state, replicated), jax.device_put(batch, split)
    new_state, metrics = jax.jit(train_step)(state, batch)
    local = lambda x: np.asarray(x.addressable_data(0))  # noqa: E731
    return float(local(metrics["loss"])), jax.tree.map(local, new_state.opt_state)


def largest_difference(a, b) -> float:
    """The largest |a - b| over every parameter, relative to the largest gradient."""
    scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(b))
    return max(float(np.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))) / scale


class ToyEncoder(nn.Module):
    """Embeddings from a dense layer over given vectors, and a learnt scale: GradCache's contract in a second."""

    @nn.compact
    def __call__(self, batch, deterministic=True):
        dense = nn.Dense(6)
        u, v = dense(batch["x"]), jnp.tanh(dense(batch["y"]))
        scale = jnp.exp(self.param("log_scale", nn.initializers.constant(3.0), ()))
        return {"u": u, "v": v, "scale": jnp.broadcast_to(scale, u.shape[:1])}


def test_grad_cache_gives_the_whole_batch_gradient_of_a_toy_encoder():
    from bert_jax.finetune import contrastive
    from bert_jax.train.step import make_train_step

    config = bert_jax.configs.finetune.sentence_embedding.get_config()
    config.task.matryoshka_dims = "3"
    objective = get_task("sentence_embedding").objective(config.task)
    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(16, 5)).astype(np.float32), "y": rng.normal(size=(16, 5)).astype(np.float32),
             "label_weights": np.r_[np.ones(14), np.zeros(2)].astype(np.float32)}
    model = ToyEncoder()
    params = model.init(jax.random.key(0), batch)["params"]

    def loss(p):
        return objective.loss(objective.sums(model.apply({"params": p}, batch), batch), objective.weights(batch))

    want_loss, want = jax.value_and_grad(loss)(params)
    state = TrainState(step=jnp.int32(0), params=params, opt_state=KEEP_GRADIENT.init(params),
                       rng=jax.random.key_data(jax.random.key(0)))
    grads_fn = contrastive.grad_cache(model, objective, chunks=4)
    new_state, metrics = jax.jit(make_train_step(model, objective, KEEP_GRADIENT, 1, grads_fn=grads_fn))(state, batch)
    assert float(metrics["loss"]) == pytest.approx(float(want_loss), rel=1e-6)
    assert largest_difference(new_state.opt_state, want) < 1e-5
    # Accumulating each chunk's own loss instead (its negatives only its chunk's) is another gradient.
    new_state, _ = jax.jit(make_train_step(model, objective, KEEP_GRADIENT, 4))(state, batch)
    assert largest_difference(new_state.opt_state, want) > 1e-2


@pytest.mark.slow  # a minute on 2 cores: the BERT step with GradCache compiles slowly
def test_grad_cache_chunks_of_a_quarter_give_the_whole_batch_gradient():
    config, task, model, params, batch = setup(grad_accum_steps=4)
    loss, grads = step(config, task, model, params, batch)
    want_loss, want = reference(config, task, model, params, batch)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert largest_difference(grads, want) < 1e-5
    assert np.abs(grads["head"]["log_scale"]) > 0  # the temperature learns, through the cached gradient too
    config.data.packing = True  # packed rows hold several examples: GradCache's chunks are examples
    with pytest.raises(UserError, match="config.data.packing=False"):
        task.make_train_step(model, task.objective(config.task), KEEP_GRADIENT, config)


EIGHT_DEVICES = """
import json, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
sys.path.insert(0, "tests")
import ml_collections
import numpy as np
import test_contrastive as t
from bert_jax.parallel.mesh import make_mesh

mesh = make_mesh(ml_collections.ConfigDict({"shape": (8, 1, 1), "dcn_shape": (1, 1, 1)}))  # as a run builds it
out = {}
for chunks in (1, 4):
    config, task, model, params, batch = t.setup(grad_accum_steps=chunks)
    want_loss, want = t.reference(config, task, model, params, batch)
    loss, grads = t.step(config, task, model, params, batch, mesh)
    out[chunks] = {"loss": loss, "want_loss": want_loss, "grads": t.largest_difference(grads, want)}
# What negatives local to each device would give: the mean of the 8 shards' own losses.
config, task, model, params, batch = t.setup()
shards = [t.reference(config, task, model, params, {k: v[i::8] for k, v in batch.items()})[0] for i in range(8)]
out["local_negatives_loss"] = float(np.mean(shards))
print(json.dumps(out))
"""


@pytest.mark.slow  # ten minutes on 2 busy cores: 8 simulated devices compile the plain step and GradCache's
def test_on_8_devices_the_negatives_are_the_global_batch():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", EIGHT_DEVICES], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print(got)
    for chunks in ("1", "4"):  # the plain step, and GradCache's
        assert got[chunks]["loss"] == pytest.approx(got[chunks]["want_loss"], rel=1e-6)
        assert got[chunks]["grads"] < 1e-5
    assert abs(got["local_negatives_loss"] - got["1"]["want_loss"]) > 0.1  # a global batch is harder to rank in


def test_hard_negatives_are_read_from_their_column_and_counted_when_short():
    config = bert_jax.configs.finetune.sentence_embedding.get_config()
    config.task.update(negative_field="negative", num_negatives=2)
    task = get_task("sentence_embedding")
    skipped = collections.Counter()
    row = lambda negative: {"sentence1": "a", "sentence2": "b", "negative": negative}  # noqa: E731
    assert task.parse(config.task, row(["c", "d", "e"]), "train", skipped)["negatives"] == ["c", "d"]
    assert task.parse(config.task, row(json.dumps(["c", "d"])), "train", skipped)["negatives"] == ["c", "d"]
    assert task.parse(config.task, row("c"), "train", skipped) is None
    assert task.parse(config.task, {"sentence1": "a", "sentence2": "b", "score": "1"}, "validation",
                      skipped).get("negatives") is None  # evaluation reads pairs and scores only
    assert skipped == {"more than 2 negatives: the first 2 used (config.task.num_negatives)": 1,
                       "fewer than 2 negatives (config.task.num_negatives)": 1}
    assert task.texts(config.task) == ("", "pair_", "neg0_", "neg1_")
    config.task.embedding_loss = "cosine"
    with pytest.raises(UserError, match="negative_field"):
        task.validate(config.task)


TWO_HOSTS = """
import argparse, json, sys
import jax
jax.config.update("jax_num_cpu_devices", 4)
sys.path.insert(0, "tests")
import ml_collections
from bert_jax.configs.finetune import common
from bert_jax.parallel import distributed
from bert_jax.parallel.mesh import make_mesh

parser = argparse.ArgumentParser()
parser.add_argument("--config.distributed.coordinator_address", dest="coordinator", default="")
parser.add_argument("--config.distributed.num_processes", dest="num_processes", type=int, default=1)
parser.add_argument("--config.distributed.process_id", dest="process_id", type=int, default=0)
args, _ = parser.parse_known_args()
dist = common.get_config("sentence_embedding").distributed
dist.update(coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
distributed.initialize(dist)
import test_contrastive as t

mesh = make_mesh(ml_collections.ConfigDict({"shape": (8, 1, 1), "dcn_shape": (1, 1, 1)}))
config, task, model, params, batch = t.setup(grad_accum_steps=4)
want_loss, want = t.reference(config, task, model, params, batch)
loss, grads = t.step(config, task, model, params, batch, mesh)
print("RESULT " + json.dumps({"processes": jax.process_count(), "devices": jax.device_count(), "loss": loss,
                              "want_loss": want_loss, "grads": t.largest_difference(grads, want)}))
"""


@pytest.mark.slow  # two processes of 4 devices each compile GradCache's step
def test_on_two_hosts_the_negatives_are_the_global_batch(tmp_path):
    import io

    from bert_jax.launch.local import run_local

    out = io.StringIO()
    status = run_local([sys.executable, "-c", TWO_HOSTS], num_processes=2, devices_per_process=4, out=out,
                       timeout_s=1200)
    log = out.getvalue()
    assert status == 0, log[-3000:]
    for p in ("[p0] RESULT ", "[p1] RESULT "):
        got = json.loads(next(line for line in log.splitlines() if line.startswith(p))[len(p):])
        assert (got["processes"], got["devices"]) == (2, 8)
        assert got["loss"] == pytest.approx(got["want_loss"], rel=1e-5)  # gloo sums in another order
        assert got["grads"] < 1e-5
