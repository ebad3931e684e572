"""Runs a few train steps of a tiny BERT under several meshes and prints the losses as JSON.

Run as a script (its own process, so the device count can be chosen before JAX starts):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/parallel_steps.py \
        --meshes='1,1,1;8,1,1;1,8,1' --steps=5

or once per process through `bert-jax local` (it appends `--config.distributed.*`). Every
process builds the same global batches from a seed and feeds only its own rows, as
the data pipeline does. `--checkpoint_dir` also saves the state of the last mesh
after `--save_at` steps, restores it under the meshes between the first and the last,
and trains on from there.
`--die_process=I`: process I exits right after joining, to test that its peers stop.
`--preempt_process=I`: process I gets SIGTERM; every process must stop at the same step.
"""
import argparse
import json
import math
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

import bert_jax.configs.tiny  # noqa: E402
from bert_jax.checkpoint import manager as ckpt  # noqa: E402
from bert_jax.parallel import distributed  # noqa: E402
from bert_jax.parallel.mesh import global_batch, make_mesh  # noqa: E402
from bert_jax.run.preemption import PreemptionWatch  # noqa: E402
from bert_jax.train.program import build_program  # noqa: E402


def tiny_config(mesh_shape, rules: str, dcn_shape=(1, 1, 1)) -> ml_collections.ConfigDict:
    """2 layers, hidden 64, 4 heads, seq 32, fp32: the smallest model every mesh below can split."""
    c = bert_jax.configs.tiny.get_config()
    c.model.update(vocab_size=128, hidden_size=64, num_heads=4, intermediate_size=128, max_position_embeddings=32,
                   scan_layers=True, dropout_rate=0.1, attention_dropout_rate=0.1)
    c.data.update(max_seq_length=32, max_predictions_per_seq=6)
    c.train.update(global_batch_size=16, warmup_steps=1, learning_rate=1e-3)
    c.mesh.shape = tuple(mesh_shape)
    c.mesh.dcn_shape = tuple(dcn_shape)
    c.mesh.rules = rules
    return c


def make_batches(config, steps: int, seed: int = 0) -> list[dict]:
    """Global batches [global_batch_size, ...] with padding, identical in every process."""
    rng = np.random.default_rng(seed)
    b, length, p, vocab = (config.train.global_batch_size, config.data.max_seq_length,
                           config.data.max_predictions_per_seq, config.model.vocab_size)
    batches = []
    for _ in range(steps):
        lengths = rng.integers(length // 2, length + 1, b)
        mask = (np.arange(length)[None] < lengths[:, None]).astype(np.int32)
        batches.append({
            "input_ids": (rng.integers(5, vocab, (b, length)) * mask).astype(np.int32),
            "token_type_ids": ((np.arange(length)[None] >= length // 2) * mask).astype(np.int32),
            "attention_mask": mask,
            "masked_positions": np.stack([rng.choice(n, p, replace=False) for n in lengths]).astype(np.int32),
            "masked_ids": rng.integers(5, vocab, (b, p)).astype(np.int32),
            "masked_weights": (rng.random((b, p)) < 0.9).astype(np.float32),
            "next_sentence_label": rng.integers(0, 2, b).astype(np.int32),
        })
    return batches


def host_rows(batch: dict, sharding) -> dict:
    """This process's rows of a global batch: those its devices hold under the batch sharding."""
    n = len(batch["input_ids"])
    starts = [idx[0].start or 0 for idx in sharding.addressable_devices_indices_map((n,)).values()]
    stops = [idx[0].stop or n for idx in sharding.addressable_devices_indices_map((n,)).values()]
    return {k: v[min(starts):max(stops)] for k, v in batch.items()}


class _Position:
    """A data-iterator stand-in for the checkpoint's `data` item (its state is the step)."""

    def __init__(self, step: int = 0):
        self.step = step

    def get_state(self) -> bytes:
        return json.dumps({"step": self.step}).encode()

    def set_state(self, state) -> None:
        self.step = json.loads(state)["step"]

    def start_prefetch(self) -> None:  # grain's checkpoint handler calls it after restoring
        pass


def initial_state(config):
    """The fresh state as numpy, initialised once on this process's first device.

    Every mesh starts from these same values (placed by its shardings), which spares
    an 8-device compile of `init` per mesh.
    """
    config = ml_collections.ConfigDict(config.to_dict())
    config.mesh.shape = config.mesh.dcn_shape = (1, 1, 1)
    config.mesh.context = 1
    program = build_program(config, make_mesh(config.mesh, jax.local_devices()[:1]))
    return jax.device_get(program.init())


def _devices(mesh_cfg) -> list:
    """The first devices, as many as the mesh needs (all of them but for the 1-device baseline; all for a -1)."""
    if -1 in tuple(mesh_cfg.shape):
        return jax.devices()
    return jax.devices()[: math.prod(mesh_cfg.shape) * math.prod(mesh_cfg.dcn_shape) * mesh_cfg.get("context", 1)]


def run(config, batches: list[dict], state, save=None, program=None):
    """(losses, final state, program) of training on `batches` from `state` (numpy or placed arrays).

    save: (step, manager): checkpoint the state after that many steps.
    program: the config's program when already built (its compiled step is reused).
    """
    program = program or build_program(config, make_mesh(config.mesh, _devices(config.mesh)))
    state = jax.device_put(state, program.state_shardings)
    losses = []
    frozen = program.load_frozen()
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        for step, batch in enumerate(batches, start=1):
            state, metrics = program.train_step(state, global_batch(host_rows(batch, program.data_sharding),
                                                                    program.data_sharding), frozen)
            losses.append(float(metrics["loss"]))
            if save is not None and step == save[0]:
                ckpt.save(save[1], step, state, _Position(step))
    return losses, state, program


def shard_shapes(state) -> dict:
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): list(leaf.addressable_shards[0].data.shape)
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--meshes", default="1,1,1;8,1,1")
    parser.add_argument("--rules", default="fsdp_tp")
    parser.add_argument("--dcn_shape", default="1,1,1", help="across processes (slices), for every mesh")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--checkpoint_dir", default="")
    parser.add_argument("--save_at", type=int, default=3)
    parser.add_argument("--die_process", type=int, default=-1)
    parser.add_argument("--preempt_process", type=int, default=-1, help="gets SIGTERM at step 3")
    parser.add_argument("--config.distributed.coordinator_address", dest="coordinator", default="")
    parser.add_argument("--config.distributed.num_processes", dest="num_processes", type=int, default=1)
    parser.add_argument("--config.distributed.process_id", dest="process_id", type=int, default=0)
    args = parser.parse_args()

    dist = bert_jax.configs.tiny.get_config().distributed
    dist.update(coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id,
                heartbeat_timeout_s=5, initialization_timeout_s=60, shutdown_timeout_s=10)
    distributed.initialize(dist)
    if jax.process_index() == args.die_process:
        print(f"process {args.die_process} dies now", flush=True)
        os._exit(3)
    if args.die_process >= 0:
        start = time.monotonic()
        try:
            for i in range(1000):  # a collective the dead peer never joins
                distributed.sync(f"barrier_{i}")
                time.sleep(0.5)
        finally:
            print(f"survivor stopped after {time.monotonic() - start:.1f} s", flush=True)
        return

    if args.preempt_process >= 0:
        with PreemptionWatch() as watch:
            for step in range(1, 1000):
                distributed.sync(f"step_{step}")  # stands in for a train step's collectives
                if step == 3 and jax.process_index() == args.preempt_process:
                    os.kill(os.getpid(), signal.SIGTERM)
                if watch.should_stop(step):
                    print(f"process {jax.process_index()} stops at step {step}", flush=True)
                    return
                time.sleep(0.1)
    meshes = [tuple(int(s) for s in m.split(",")) for m in args.meshes.split(";")]
    dcn = tuple(int(s) for s in args.dcn_shape.split(","))
    out = {"process_count": jax.process_count(), "device_count": jax.device_count(), "runs": {}}
    batches = make_batches(tiny_config(meshes[0], args.rules, dcn), args.steps)
    start = initial_state(tiny_config(meshes[0], args.rules, dcn))
    manager = (ckpt.make_manager(args.checkpoint_dir, bert_jax.configs.tiny.get_config().checkpoint)
               if args.checkpoint_dir else None)
    programs = {}
    for shape in meshes:
        # The last mesh saves its state after --save_at steps; the others restore it below.
        save = (args.save_at, manager) if manager is not None and shape == meshes[-1] else None
        losses, state, programs[shape] = run(tiny_config(shape, args.rules, dcn), batches, start, save)
        out["runs"][str(shape)] = {"losses": losses, "shard_shapes": shard_shapes(state),
                                   "mesh": dict(programs[shape].mesh.shape)}
    if manager is not None:
        manager.wait_until_finished()
        out["resumed"] = {}
        for shape in meshes[1:-1]:
            program = programs[shape]
            position = _Position()
            restored = ckpt.restore_latest(manager, program.abstract_state, position)
            placed = all(
                leaf.sharding.is_equivalent_to(want, leaf.ndim)
                for leaf, want in zip(jax.tree.leaves(restored), jax.tree.leaves(program.state_shardings))
            )
            losses, _, _ = run(tiny_config(shape, args.rules, dcn), batches[args.save_at:], restored,
                               program=program)
            out["resumed"][str(shape)] = {"losses": losses, "data_step": position.step, "placed_by_new_mesh": placed}
        manager.close()
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
