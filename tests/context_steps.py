"""Trains a config on packed rows with and without config.mesh.context and prints the losses as JSON.

Run as a script on simulated devices (tests/test_context_parallel.py does):

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/context_steps.py \
        --config=modernbert --context=4 --steps=5 [--micro] [--context_attention all_gather ring]

Both runs start from the same state and see the same global batches (built from the config's own
batch layout, pipeline.batch_spec: several documents per row, positions restarting per document,
trailing padding, masked positions anywhere in a row), so their losses differ only by the order of
the sums. `--context_attention`: the schemes of the global layers to run under the axis, each from the same state.
`--checkpoint_dir`: the first scheme's run is saved after `--save_at` steps, restored, and trained on.
A scheme config validation refuses for a family (the ring for DeBERTa-v3's score bias) is reported with its message
instead of losses. Families whose own rows hold one document (ELECTRA, SpanBERT, DeBERTa-v3) train on packed ones.
`--context_attention` with no scheme runs the whole sequence only (a one-process baseline).

Or once per process through launch/local.py (it appends `--config.distributed.*`, tests/test_multihost.py does):
every process builds the same global batches and feeds the rows its devices hold; each split run reports which
processes every context group's devices belong to.
"""
import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import bert_jax.configs.deberta_v3_xsmall  # noqa: E402
import bert_jax.configs.electra_small  # noqa: E402
import bert_jax.configs.modernbert_base  # noqa: E402
import bert_jax.configs.spanbert_base  # noqa: E402
import bert_jax.configs.tiny  # noqa: E402
from bert_jax.checkpoint import manager as ckpt  # noqa: E402
from bert_jax.parallel import distributed  # noqa: E402
from bert_jax.train.config_validation import validate_config  # noqa: E402
from bert_jax.parallel.mesh import global_batch, make_mesh  # noqa: E402
from bert_jax.plan.collectives import collectives, mesh_axes  # noqa: E402
from bert_jax.train.program import build_program  # noqa: E402
from data_pipelines.loader import pipeline  # noqa: E402
from data_pipelines.loader.span_boundaries import SPAN_BOUNDARY_KEYS, span_boundaries  # noqa: E402
from parallel_steps import _Position, host_rows, initial_state  # noqa: E402

CONFIGS = {"modernbert": lambda: bert_jax.configs.modernbert_base.get_config("tiny"),
           "tiny": bert_jax.configs.tiny.get_config,
           "electra": lambda: bert_jax.configs.electra_small.get_config("tiny"),
           "spanbert": lambda: bert_jax.configs.spanbert_base.get_config("tiny"),
           "deberta": lambda: bert_jax.configs.deberta_v3_xsmall.get_config("tiny")}
# Families whose tiny rows are single documents (full_sentences): trained here on packed rows, which they accept,
# so documents, their positions and (SpanBERT) spans cross the shards' edges.
PACKED = ("electra", "spanbert", "deberta")


def make_config(name: str, micro: bool, context: int, context_attention: str = "all_gather", splash: bool = False):
    """The config's tiny shapes (or micro ones), its own rows (modernbert's packed), fp32, no dropout: runs
    comparable to 1e-5. `splash`: the splash kernel in interpret mode, 128 tokens a device (its block)."""
    c = CONFIGS[name]()
    c.model.update(dropout_rate=0.0, attention_dropout_rate=0.0, attention_impl="xla")
    c.train.update(global_batch_size=8, warmup_steps=1)
    if name in PACKED:
        c.data.example_builder = "packed"
    if micro:
        c.model.update(vocab_size=256, hidden_size=32, intermediate_size=64, max_position_embeddings=32)
        c.data.update(max_seq_length=32, max_predictions_per_seq="auto")
        if name == "modernbert":
            c.model.local_attention = 8  # 4 tokens either side: windows cross the 8-token shards' edges
    c.mesh.update(shape=(-1, 1, 1), context=context, context_attention=context_attention)
    if splash:
        c.model.update(attention_impl="splash", splash_interpret=True, max_position_embeddings=512)
        c.data.update(max_seq_length=512, max_predictions_per_seq="auto")
    return c


def make_batches(config, steps: int, seed: int = 0) -> list[dict]:
    """Global batches in the layout pipeline.batch_spec gives this config: packed rows get segment and position
    ids, a pair builder's rows the same cuts as token types; span masking's rows (SpanBERT) masked spans of 1 to 4
    tokens, with the masker's boundaries and offsets (span_boundaries)."""
    rng = np.random.default_rng(seed)
    b, length = config.train.global_batch_size, config.data.max_seq_length
    spec = pipeline.batch_spec(config.data, b)
    batches = []
    for _ in range(steps):
        batch = {}
        segments, positions = np.zeros((b, length), np.int32), np.zeros((b, length), np.int32)
        real = rng.integers(length * 3 // 4, length + 1, b)
        for row in range(b):  # 3 or 4 documents, cut anywhere
            cuts = np.sort(rng.choice(np.arange(1, real[row]), rng.integers(2, 4), replace=False))
            for doc, (start, stop) in enumerate(zip([0, *cuts], [*cuts, real[row]]), start=1):
                segments[row, start:stop], positions[row, start:stop] = doc, np.arange(stop - start)
        mask = (np.arange(length)[None] < real[:, None]).astype(np.int32)
        preds = spec["masked_positions"][0][1] if "masked_positions" in spec else 0
        for key, (shape, dtype) in spec.items():
            if key == "input_ids":
                batch[key] = rng.integers(5, config.model.vocab_size, shape) * mask
            elif key == "attention_mask":
                batch[key] = mask
            elif key == "token_type_ids" and "segment_ids" not in spec:  # a pair's rows: B after the first cut
                batch[key] = (segments >= 2) * mask
            elif key == "segment_ids":
                batch[key] = segments * mask
            elif key == "position_ids":
                batch[key] = positions
            elif key == "masked_positions" and SPAN_BOUNDARY_KEYS[0] in spec:
                selected = np.stack([masked_spans(rng, n, length, preds) for n in real])
                left, right, offset = span_boundaries(selected)
                batch[key] = np.stack([np.flatnonzero(row) for row in selected])
                for span_key, values in zip(SPAN_BOUNDARY_KEYS, (left, right, offset)):
                    batch[span_key] = np.take_along_axis(values, batch[key], axis=1)
            elif key == "masked_positions":
                batch[key] = np.stack([rng.choice(n, preds, replace=False) for n in real])
            elif key in SPAN_BOUNDARY_KEYS:  # with masked_positions, above
                continue
            elif key == "masked_ids":
                batch[key] = rng.integers(5, config.model.vocab_size, shape)
            elif key == "masked_weights":
                batch[key] = (rng.random(shape) < 0.9)
            elif key == "maskable_tokens":
                batch[key] = real
            elif len(shape) == 1:  # a row's label
                batch[key] = rng.integers(0, 2, shape)
            else:
                batch[key] = np.zeros(shape)
            batch[key] = np.asarray(batch[key]).astype(dtype)
        batches.append(batch)
    return batches


def masked_spans(rng, real: int, length: int, preds: int) -> np.ndarray:
    """[length] bool: exactly `preds` tokens of a row's first `real`, in spans of 1 to 4 (merged where they touch)
    that start after its first token, so most have both boundaries and some end on the row's last real one."""
    selected = np.zeros(length, bool)
    while selected.sum() < preds:
        start = rng.integers(1, real)
        selected[start:min(start + rng.integers(1, 5), real)] = True
    selected[np.flatnonzero(selected)[preds:]] = False
    return selected


def run(config, batches: list[dict], state, save=None, program=None, compiled=None):
    """(losses, program, compiled step) of training on `batches` from `state` on every device, compiled once."""
    program = program or build_program(config, make_mesh(config.mesh))
    state = jax.device_put(state, program.state_shardings)
    frozen, losses = program.load_frozen(), []
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        for step, batch in enumerate(batches, start=1):
            batch = global_batch(host_rows(batch, program.data_sharding), program.data_sharding)
            compiled = compiled or program.train_step.lower(state, batch, frozen).compile()
            state, metrics = compiled(state, batch, frozen)
            losses.append(float(metrics["loss"]))
            if save is not None and step == save[0]:
                ckpt.save(save[1], step, state, _Position(step))
    return losses, program, compiled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", choices=sorted(CONFIGS), nargs="+", default=["modernbert"])
    parser.add_argument("--context", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--micro", action="store_true")
    parser.add_argument("--splash", action="store_true")  # attention_impl=splash (interpret), 512 tokens
    # the global layers' schemes under the axis (config.mesh.context_attention), each run against the same whole run
    parser.add_argument("--context_attention", nargs="*", default=["all_gather"])
    parser.add_argument("--checkpoint_dir", default="")  # the first scheme's run is saved, restored and trained on
    parser.add_argument("--save_at", type=int, default=3)
    parser.add_argument("--config.distributed.coordinator_address", dest="coordinator", default="")
    parser.add_argument("--config.distributed.num_processes", dest="num_processes", type=int, default=1)
    parser.add_argument("--config.distributed.process_id", dest="process_id", type=int, default=0)
    args = parser.parse_args()
    dist = bert_jax.configs.tiny.get_config().distributed
    dist.update(coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id,
                heartbeat_timeout_s=10, initialization_timeout_s=60, shutdown_timeout_s=10)
    distributed.initialize(dist)
    out = {}
    for name in args.config:
        whole = make_config(name, args.micro, 1, splash=args.splash)
        batches = make_batches(whole, args.steps)
        start = initial_state(whole)
        losses, _, _ = run(whole, batches, start)
        out[name] = {"losses": losses, "split": {}}
        for scheme in args.context_attention:
            split = make_config(name, args.micro, args.context, scheme, splash=args.splash)
            try:  # a length the axis does not divide, a fused kernel, a scheme the family's attention cannot take
                validate_config(split)
            except ValueError as refusal:
                out[name]["split"][scheme] = {"refused": str(refusal)}
                continue
            first = scheme == args.context_attention[0]
            manager = (ckpt.make_manager(os.path.join(args.checkpoint_dir, name), split.checkpoint)
                       if args.checkpoint_dir and first else None)
            save = (args.save_at, manager) if manager is not None else None
            split_losses, program, compiled = run(split, batches, start, save)
            found = collectives(compiled.as_text())
            # A head's gather of positions (take_along_axis) and ELECTRA's scatter of samples into them all-gather
            # over the axis in either scheme: heads=False leaves them out.
            over = lambda op, heads=True: [  # noqa: E731
                "+".join(mesh_axes(c.group, dict(program.mesh.shape))) for c in found
                if c.op == op and (heads or not any(w in c.op_name for w in ("take_along_axis", "scatter")))]
            result = {"context_losses": split_losses, "mesh": dict(program.mesh.shape),
                      "context_groups": context_groups(program.mesh), "processes": jax.process_count(),
                      "all_gathers_over": over("all-gather"), "permutes_over": over("collective-permute"),
                      "attention_gathers_over": over("all-gather", heads=False),
                      "head_rows": head_rows(compiled.as_text(), split.model.vocab_size),
                      "predictions": int(batches[0]["masked_positions"].shape[1])}
            if manager is not None:
                manager.wait_until_finished()
                position = _Position()
                restored = ckpt.restore_latest(manager, program.abstract_state, position)
                result["resumed_losses"], _, _ = run(split, batches[args.save_at:], restored, program=program,
                                                     compiled=compiled)
                result["data_step"] = position.step
                manager.close()
            out[name]["split"][scheme] = result
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(out), flush=True)


def head_rows(hlo: str, vocab_size: int) -> int:
    """The most predictions a device's MLM logits hold ([rows, predictions, vocab] in the compiled step): a row's
    share of them when the head is split over the context axis, all of them when every device runs it whole."""
    return max(int(m.group(1)) for m in re.finditer(rf"f32\[\d+,(\d+),{vocab_size}\]", hlo))


def context_groups(mesh) -> list[list[int]]:
    """For each group of devices along the context axis (the others fixed), the processes its devices belong to."""
    devices = np.moveaxis(mesh.devices, mesh.axis_names.index("context"), -1)
    return [sorted({d.process_index for d in group}) for group in devices.reshape(-1, mesh.shape["context"])]


if __name__ == "__main__":
    main()
