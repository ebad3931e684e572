"""ModernBERT's train step compiled for an NVIDIA GPU by XLA's GPU compiler, with its attention as the windowed
Pallas (Triton) kernel and as xla's einsums: memory per device and HBM bytes per step, side by side. No GPU needed.

    PYTHONPATH=/path/to/cuda-wheels JAX_PLATFORMS=cpu python bench/windowed_attention_gpu.py --gpu=h100
    python bench/windowed_attention_gpu.py --gpu=h100 --shape=1024:32 --impls=triton,xla --json=/tmp/w.json

It builds `configs/modernbert_base.py` at --shape (seq:batch) through the project's own program (the train step a
run would compile), for one card's compile-only devices (bert_jax/plan/gpu_cards.py: the CUDA plugin, the `gpu`
extra), once per attention kernel, and reads `memory_analysis()` (arguments, temporaries, the peak) and the optimised
HLO's bytes and kernel launches (bert_jax/plan/hlo_traffic.py: every loop's trips counted; a Pallas kernel's custom
call reads its operands and writes its results). The window's saving is in FLOPs, not bytes: a local layer's tiles
are the window's (about (128 + 2 * 64) / seq of a global layer's at the default tiles), which the HLO does not show.
Speed needs the GPU itself (bench/gpu_variants.sh).
"""
import json
import time

from absl import app, flags

_GPU = flags.DEFINE_string("gpu", "h100", "The card to compile for (bert_jax/plan/gpu_cards.py).")
_SHAPE = flags.DEFINE_string("shape", "1024:32", "seq:batch of configs/modernbert_base.py.")
_IMPLS = flags.DEFINE_list("impls", ["triton", "xla"], "config.model.attention_impl values to compile.")
_JSON = flags.DEFINE_string("json", "", "Write the figures to this file.")

GIB = 2 ** 30


def compile_step(config, devices) -> dict:
    """The train step of `config` compiled for `devices`: memory and traffic figures."""
    import flax.linen as nn  # after absl parsed the flags: importing bert_jax first costs nothing then
    import jax

    from bert_jax.parallel.mesh import make_mesh
    from bert_jax.plan import hlo_traffic, memory_fit
    from bert_jax.train.program import build_program
    from bert_jax.train.state import example_batch

    mesh = make_mesh(config.mesh, devices)
    program = build_program(config, mesh)  # resolves attention_impl for the mesh's platform (a GPU's)
    batch = jax.eval_shape(lambda: example_batch(config.data, config.train.global_batch_size))
    batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=program.data_sharding), batch)
    start = time.perf_counter()
    with jax.set_mesh(mesh), nn.logical_axis_rules(program.rules):
        compiled = program.train_step.lower(program.abstract_state, batch, program.abstract_frozen).compile()
    seconds = time.perf_counter() - start
    memory = compiled.memory_analysis()
    text = compiled.as_text()
    traffic = hlo_traffic.traffic(text)
    return {
        "attention_kernel": program.attention_kernel,
        "compile_s": round(seconds, 1),
        "argument_gib": memory.argument_size_in_bytes / GIB,
        "temp_gib": memory.temp_size_in_bytes / GIB,
        "peak_gib": memory_fit.compiled_peak_bytes(memory) / GIB,
        "hbm_gb_per_step": traffic.hbm / 1e9,
        "launches_per_step": traffic.launches,
        "triton_custom_calls": text.count("__gpu$xla.gpu.triton"),
    }


def main(argv):
    del argv
    from bert_jax.configs import modernbert_base
    from bert_jax.plan import gpu_cards

    seq, batch = (int(x) for x in _SHAPE.value.split(":"))
    devices = gpu_cards.gpu_devices(gpu_cards.parse_gpu(_GPU.value, 1))
    results = {}
    for impl in _IMPLS.value:
        config = modernbert_base.get_config()
        config.data.max_seq_length, config.train.global_batch_size = seq, batch
        config.model.attention_impl = impl
        results[impl] = compile_step(config, devices)
        r = results[impl]
        print(f"ModernBERT-base ({seq}, {batch}) on 1 x {_GPU.value}, attention_impl={impl} -> "
              f"{r['attention_kernel']}: "
              f"peak {r['peak_gib']:.2f} GiB (arguments {r['argument_gib']:.2f}, temporaries {r['temp_gib']:.2f}), "
              f"HBM {r['hbm_gb_per_step']:.1f} GB/step, {r['launches_per_step']:.0f} launches/step, "
              f"{r['triton_custom_calls']} Triton custom calls in the program; compiled in {r['compile_s']} s",
              flush=True)
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump({"gpu": _GPU.value, "shape": _SHAPE.value, "results": results}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
