"""bert_jax's train step side by side with Hugging Face PyTorch, on whatever device is present.

    python bench/accelerator_throughput.py --out=figures.json

On a GPU it runs base (128, 256), large (512, 32), large (128, 256), modernbert_base
(1024, 32) and deberta_v3_base (512, 32) in bf16; on a CPU mini (128, 16), base (128, 8) and
large (128, 4) in float32. Any shape is `model:seq:batch` with model one of mini, base, large
(BERT shapes put into --config), or the name of a config file in configs/ (e.g.
modernbert_base), which is then run whole: its family and sizes, against the family's own
Hugging Face masked-LM built from the config.json our export writes for it.
On 2 busy CPU cores mini alone, all sides, took 10 minutes (4 of them torch.compile's
first, cold compile):

    python bench/accelerator_throughput.py --shapes=large:512:32 --sides=bert_jax,hf_compile
    python bench/accelerator_throughput.py --shapes=large:128:2 --sides=bert_jax \
        --scan_layers=false --steps=1 --rounds=1 --packing_shape=    # compile time, unrolled

A change to bert_jax is measured A/B in the same rounds as a variant: an extra bert_jax side
with config keys or XLA compiler options put in (`xla_*` keys go to `compile(compiler_options)`),
optionally only at some shapes (`@` then shapes joined by `|`):

    --jax_variants='triton_off:xla_gpu_enable_triton_gemm=false,unrolled:model.scan_layers=false@base:128:256'

Issue 54's variants (train.dropout_prng, model.dropout_masks, train.flat_moments, model.scan_unroll) run
this way from bench/gpu_variants.sh, in one call on a lent GPU: --jsonl appends one JSON line per shape,
--budget_s starts no shape after that many seconds (docs/results/gpu.md).

A distillation step: `--config=configs/distilbert_base.py --config.distill.teacher=PATH` (a
workdir or HF folder whose vocabulary is the config's): the teacher runs inside bert_jax's step
and its forward is counted in the FLOPs (bert_jax/train/perf.py); the HF sides stay plain MLM.

Both sides run in this one process on the same device (torch on cuda:0 when JAX runs
on a GPU), and alternate: each round times `--steps` train steps and `--steps` eval
forwards of every side in turn, after warm-up steps that are not timed; figures are the
median over rounds. The sides:

  bert_jax    the step pretrain compiles (bert_jax.train.program.build_program) from
              --config (default configs/base.py) with the shape put in; compiled ahead
              of time, so its compile seconds are timed apart
  hf_eager    transformers.BertForMaskedLM (or the config family's class), random init, SDPA, AdamW
              (fused on CUDA), bf16 autocast on accelerators, its MLM head on the masked positions
              only as bert_jax's (--hf_sparse_head; bench/torch_bert.py)
  hf_compile  the same model under torch.compile
              (for both HF sides "compile s" is the first train step: tracing and code
              generation under torch.compile, a warm-up in eager)

Printed per shape and side: tokens/s, step time, train step / eval forward, MFU,
peak memory, compile seconds, and bert_jax's ratio to each HF side. MFU counts the
FLOPs of bert_jax/train/perf.py for both sides:

    6 * N * B * S + 12 * L * H * S^2 * B + 6 * H * V * B * P

(N non-embedding parameters, L layers, H hidden, V vocabulary, P predicted positions per
sequence: 20 at seq 128, 80 at 512) against the data sheet's dense bf16 peak, or on a
CPU the best FLOP/s of a large fp32 matmul measured here.

Peak memory: for bert_jax the XLA buffer assignment of the compiled step (arguments +
outputs - donated + temporaries) everywhere, and on a GPU also the allocator's peak
(`memory_stats()['peak_bytes_in_use']`; JAX cannot reset it, so a shape that did not
raise it reads "<= X"); for torch `torch.cuda.max_memory_allocated()`. JAX is told not
to preallocate, so the two sides share the device; at a shape where both pools cannot
be held together, the side that runs out is reported as such: run the sides in two
calls (--sides=bert_jax, then --sides=hf_eager,hf_compile).

The packing section (--packing_shape, default mini:512:8 on a CPU, base:512:32 on a
GPU; empty to skip) trains --packing_config (default configs/roberta_base.py, an
MLM-only objective) on documents of realistic lengths (bench/real_length_batches.py),
packed vs padded, and counts only real tokens.

torch is optional: without it only bert_jax runs.
"""
import copy
import importlib
import json
import os
import statistics
import sys
import time
import traceback

# JAX would take 75% of a GPU's memory at start-up, leaving torch too little to run.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from etils import epath  # noqa: E402
from ml_collections import config_flags  # noqa: E402

import real_length_batches  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from bert_jax.parallel.mesh import global_batch, make_mesh  # noqa: E402
from bert_jax.plan.memory_fit import compiled_peak_bytes  # noqa: E402
from bert_jax.train import counters, perf  # noqa: E402
from bert_jax.train.program import build_program  # noqa: E402
from data_pipelines.loader import pipeline  # noqa: E402

try:
    import torch_bert
except ImportError as missing:  # torch or transformers absent: bert_jax runs alone.
    torch_bert, TORCH_MISSING = None, str(missing)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024**3
MODELS = {
    # name: (layers, hidden, heads, mlp)
    "mini": (4, 256, 4, 1024),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
DEFAULT_SHAPES = {
    "cpu": "mini:128:16,base:128:8,large:128:4",
    "accelerator": "base:128:256,large:512:32,large:128:256,modernbert_base:1024:32,deberta_v3_base:512:32",
}
DEFAULT_PACKING_SHAPE = {"cpu": "mini:512:8", "accelerator": "base:512:32"}
SIDES = ("bert_jax", "hf_eager", "hf_compile")

_CONFIG = config_flags.DEFINE_config_file("config", os.path.join(REPO, "configs/base.py"),
                                          "Config of the bert_jax side; the shape flags override its sizes.")
_PACKING_CONFIG = config_flags.DEFINE_config_file(
    "packing_config", os.path.join(REPO, "configs/roberta_base.py"),
    "Config of the packing section: its objective must train without sentence-pair labels.")
_SHAPES = flags.DEFINE_list("shapes", None, "model:seq:batch shapes; unset: this platform's (see above); "
                            "empty: only the packing section.")
_SIDES = flags.DEFINE_list("sides", list(SIDES), f"Which of {SIDES} to run.")
_STEPS = flags.DEFINE_integer("steps", 3, "Timed train steps (and eval forwards) per side per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds; figures are medians over rounds.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps per side after compiling.")
_DTYPE = flags.DEFINE_enum("dtype", "auto", ["auto", "float32", "bfloat16"],
                           "Compute dtype (and torch autocast); auto: bfloat16 on accelerators, float32 on CPU.")
_ATTENTION = flags.DEFINE_string("attention_impl", "", "config.model.attention_impl for bert_jax; '' = the config's.")
_REMAT = flags.DEFINE_string("remat_policy", "", "config.model.remat_policy for bert_jax; '' = the config's.")
_SCAN = flags.DEFINE_boolean("scan_layers", None, "config.model.scan_layers; unset = the config's.")
_COMPILE_MODE = flags.DEFINE_string("torch_compile_mode", "default", "torch.compile(mode=...).")
_HF_SPARSE = flags.DEFINE_boolean("hf_sparse_head", True, "The HF sides' MLM head on the masked positions only, as "
                                  "bert_jax's (bench/torch_bert.py); false: at every position, as the classes are.")
_PACKING_SHAPE = flags.DEFINE_string("packing_shape", "auto", "model:seq:batch of the packing section; '' skips it.")
_PACKING_BATCHES = flags.DEFINE_integer("packing_batches", 4, "Distinct batches per layout, cycled while timing.")
_PACKING_MEDIAN = flags.DEFINE_float("packing_median_tokens", 160.0, "Median document length (tokens).")
_PACKING_SIGMA = flags.DEFINE_float("packing_sigma", 1.0, "Log-space spread of document lengths.")
_VARIANTS = flags.DEFINE_list("jax_variants", [], "Extra bert_jax sides, each name:key=value+key=value[@shape|shape]; "
                               "keys are config paths (model.remat_policy) or XLA options (xla_gpu_...).")
_OUT = flags.DEFINE_string("out", "", "Write every figure to this JSON file.")
_JSONL = flags.DEFINE_string("jsonl", "", "Append one JSON line per shape (and one for the run) to this file.")
_BUDGET = flags.DEFINE_float("budget_s", 0, "Start no further shape after this many seconds (0: no limit); "
                             "the shapes left out are listed in the run's line.")


def _value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variant(spec: str) -> tuple[str, dict, dict, list[str] | None]:
    """'name:key=v+key=v@shape|shape' -> (name, config overrides, compiler options, shapes or None for all)."""
    body, _, shapes = spec.partition("@")
    name, _, assignments = body.partition(":")
    overrides, options = {}, {}
    for assignment in filter(None, assignments.split("+")):
        key, sep, text = assignment.partition("=")
        if not (name and sep and key):
            raise app.UsageError(f"--jax_variants={spec!r}: expected name:key=value+key=value[@shape|shape]")
        (options if key.startswith("xla_") else overrides)[key] = _value(text)
    return name, overrides, options, shapes.split("|") if shapes else None


def variant_config(c, overrides: dict):
    """A copy of `c` with dotted config keys set; an unknown key fails naming it."""
    v = copy.deepcopy(c)
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = v
        for part in parents:
            node = node[part]
        if leaf not in node:
            raise app.UsageError(f"--jax_variants: config key {key!r} does not exist")
        node[leaf] = value
    return v


def platform_kind() -> str:
    return "cpu" if jax.default_backend() == "cpu" else "accelerator"


def config_file(name: str) -> str:
    return os.path.join(REPO, "configs", f"{name}.py")


def parse_shape(spec: str, flag: str) -> tuple[str, int, int]:
    parts = spec.split(":")
    known = len(parts) == 3 and (parts[0] in MODELS or os.path.isfile(config_file(parts[0].partition("@")[0])))
    if not known or not (parts[1].isdigit() and parts[2].isdigit()):
        raise app.UsageError(f"--{flag}={spec!r}: expected model:seq:batch with model one of {sorted(MODELS)} "
                             "or a config file's name in configs/, optionally @ a variant of it or @ one of "
                             f"{sorted(MODELS)} (its sizes put in), e.g. base:128:256, modernbert_base:1024:32, "
                             "roberta_base@tiny:128:32 or roberta_base@mini:128:32")
    return parts[0], int(parts[1]), int(parts[2])


def named_config(name: str):
    """configs/<name>.py's get_config(); `name@variant`: its variant's; `name@size`: one of MODELS' sizes put into
    the config's family (the families side by side at equal shapes)."""
    name, _, variant = name.partition("@")
    module = importlib.import_module(f"bert_jax.configs.{name}")
    c = module.get_config(variant) if variant and variant not in MODELS else module.get_config()
    if variant in MODELS:
        layers, hidden, heads, mlp = MODELS[variant]
        if c.model.get("generator_num_layers"):  # a generator keeps its share of the depth (DeBERTa-v3: half)
            c.model.generator_num_layers = max(1, c.model.generator_num_layers * layers // c.model.num_layers)
        c.model.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=mlp)
    return c


def shape_config(config, spec: str, flag: str, dtype: str):
    """A copy of `config` (or of the config a shape names) with the shape, dtype and model flags put in."""
    name, seq, batch = parse_shape(spec, flag)
    if name in MODELS:
        layers, hidden, heads, mlp = MODELS[name]
        c = copy.deepcopy(config)
        c.model.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=mlp, dtype=dtype)
        # 15% of the sequence, as in the paper's two phases (20 at seq 128, 80 at seq 512).
        c.data.max_seq_length, c.data.max_predictions_per_seq = seq, int(np.ceil(0.15 * seq / 4) * 4)
    else:  # the config's own family, sizes and mask rate
        c = named_config(name)
        c.model.dtype = dtype
        c.data.max_seq_length = seq
        # A tiny variant's learned positions may be fewer (RoBERTa's start at pad_token_id + 1): enough for `seq`.
        c.model.max_position_embeddings = max(c.model.max_position_embeddings, seq + 2)
        c.data.max_predictions_per_seq = int(np.ceil(c.data.mask_rate * seq / 4) * 4)
    c.train.global_batch_size = batch
    if _ATTENTION.value:
        if "attention_impl" not in c.model:
            raise app.UsageError(f"--attention_impl={_ATTENTION.value}: this checkout's config has no "
                                 "model.attention_impl; leave the flag out")
        c.model.attention_impl = _ATTENTION.value
    if _REMAT.value:
        c.model.remat_policy = _REMAT.value
    if _SCAN.value is not None:
        c.model.scan_layers = _SCAN.value
    return c


def synthetic_batch(c, seed: int = 0) -> dict:
    """Random ids in the pipeline's layout (pipeline.batch_spec), no padding, 15% of positions predicted."""
    rng = np.random.default_rng(seed)
    b, s, p = c.train.global_batch_size, c.data.max_seq_length, c.data.max_predictions_per_seq
    values = {
        "input_ids": rng.integers(5, c.model.vocab_size, (b, s)),
        "token_type_ids": (np.arange(s)[None] >= s // 2).repeat(b, 0) if c.model.type_vocab_size > 1
        else np.zeros((b, s)),
        "attention_mask": np.ones((b, s)),
        "masked_positions": np.sort(np.stack([rng.choice(s, p, replace=False) for _ in range(b)]), axis=1),
        "masked_ids": rng.integers(5, c.model.vocab_size, (b, p)),
        "masked_weights": np.ones((b, p)),
        "segment_ids": np.ones((b, s)),
        "position_ids": np.broadcast_to(np.arange(s), (b, s)),
    }
    return {key: (values[key] if key in values else rng.integers(0, 2, shape)).astype(dtype)
            for key, (shape, dtype) in pipeline.batch_spec(c.data, b).items()}


class JaxSide:
    """bert_jax's train and eval steps, compiled ahead of time for one device; batches are cycled."""

    def __init__(self, name: str, config, batches: list[dict], compiler_options: dict | None = None):
        self.name = name
        self.config = config
        self.program = build_program(config, make_mesh(config.mesh, jax.devices()[:1]))
        # A distillation teacher's forward counts too (bert_jax/train/perf.py).
        self.flops_per_step = perf.step_flops(self.program, config)
        self.param_count = perf.count_params(self.program.abstract_state.params)
        device = jax.devices()[0]
        self._peak_before = (device.memory_stats() or {}).get("peak_bytes_in_use")
        with jax.set_mesh(self.program.mesh), nn.logical_axis_rules(self.program.rules):
            self.state = self.program.init()
            self.frozen = self.program.load_frozen()
            self.batches = [global_batch(b, self.program.data_sharding) for b in batches]
            start = time.perf_counter()
            lowered = self.program.train_step.lower(self.state, self.batches[0], self.frozen)
            self.lower_s = time.perf_counter() - start
            start = time.perf_counter()
            self.train = lowered.compile(compiler_options or None)
            self.compile_s = time.perf_counter() - start
            self.eval = self.program.eval_step.lower(self.state.params, self.batches[0], 0, self.frozen).compile(
                compiler_options or None)
        self.attention_kernel = self.program.attention_kernel
        self.compiled_peak = compiled_peak_bytes(self.train.memory_analysis())
        self._next = 0

    def _batch(self):
        self._next = (self._next + 1) % len(self.batches)
        return self.batches[self._next]

    def warm_up(self, steps: int) -> None:
        self.train_steps(steps)
        self.forward_steps(steps)

    def train_steps(self, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            self.state, metrics = self.train(self.state, self._batch(), self.frozen)
        jax.block_until_ready(metrics)
        return (time.perf_counter() - start) / steps

    def forward_steps(self, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            out = self.eval(self.state.params, self._batch(), 0, self.frozen)
        jax.block_until_ready(out)
        return (time.perf_counter() - start) / steps

    def peak_bytes(self) -> tuple[float, str]:
        after = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        if after is None:
            return float(self.compiled_peak), "XLA buffer assignment"
        how = "allocator peak" if after > (self._peak_before or 0) else "allocator peak, <= (set by an earlier shape)"
        return float(after), how

    def release_cache(self) -> None:
        pass  # JAX keeps its pool; freed buffers stay in it for the next shape.

    def close(self) -> None:
        del self.state, self.batches, self.train, self.eval


def hf_family_config(config, jax_side) -> dict | None:
    """The config.json our export writes for a config's family (its HF side's model), or None for BERT shapes."""
    family = get_family(config.model.family)
    if family.hf is None:
        raise ValueError(f"family {family.name!r} has no Hugging Face export to build its HF side from")
    params = jax.device_get(nn.meta.unbox(jax_side.state.params))
    return family.hf.to_hf(params, config.model).config


def out_of_memory(error: Exception) -> bool:
    return "RESOURCE_EXHAUSTED" in str(error) or type(error).__name__ == "OutOfMemoryError"


def run_rounds(sides: list, steps: int, rounds: int, warmup: int) -> dict[str, dict]:
    """Alternates the sides round by round; per side the median seconds per train step and per forward."""
    times = {side.name: {"train": [], "forward": []} for side in sides}
    failed = {}
    for side in sides:
        try:
            side.warm_up(warmup)
        except Exception as error:  # noqa: BLE001 (one side failing must not hide the others' figures)
            failed[side.name] = _failure(side.name, error)
    live = [side for side in sides if side.name not in failed]
    for _ in range(rounds):
        for side in list(live):
            try:
                times[side.name]["train"].append(side.train_steps(steps))
                times[side.name]["forward"].append(side.forward_steps(steps))
            except Exception as error:  # noqa: BLE001
                failed[side.name] = _failure(side.name, error)
                live.remove(side)
    return {name: ({"error": failed[name]} if name in failed else
                   {"train_s": statistics.median(t["train"]), "forward_s": statistics.median(t["forward"]),
                    "train_s_rounds": t["train"]})
            for name, t in times.items()}


def _failure(name: str, error: Exception) -> str:
    if out_of_memory(error):
        return "out of memory"
    traceback.print_exc()
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"


def make_sides(c, spec: str, names: list[str]) -> tuple[list, dict]:
    """The sides asked for, and the variants that apply at `spec`; those that cannot be built are errors."""
    batch = synthetic_batch(c)
    sides, errors = [], {}
    kind = platform_kind()
    variants = [parse_variant(v) for v in _VARIANTS.value]
    builds = [(name, None) for name in names]
    if "bert_jax" in names:
        builds[names.index("bert_jax") + 1:names.index("bert_jax") + 1] = [
            (f"bert_jax[{name}]", (overrides, options)) for name, overrides, options, shapes in variants
            if shapes is None or spec in shapes]
    hf_config = None
    for name, variant in builds:
        start = time.perf_counter()
        try:
            if name == "bert_jax":
                sides.append(JaxSide(name, c, [batch]))
                if spec.split(":")[0] not in MODELS:
                    hf_config = hf_family_config(c, sides[-1])
            elif variant is not None:
                sides.append(JaxSide(name, variant_config(c, variant[0]), [batch], variant[1]))
            elif torch_bert is None:
                errors[name] = f"not run: {TORCH_MISSING}"
            else:
                if hf_config is None and spec.split(":")[0] not in MODELS:
                    raise ValueError("a config's family needs the bert_jax side first (its HF config comes from it)")
                sides.append(torch_bert.TorchBertSide(
                    name, c, batch, torch_bert.torch_device(jax.default_backend()),
                    autocast_bf16=kind == "accelerator" and c.model.dtype == "bfloat16",
                    compile_mode=_COMPILE_MODE.value if name == "hf_compile" else None, hf_config=hf_config,
                    sparse_head=_HF_SPARSE.value))
        except Exception as error:  # noqa: BLE001
            errors[name] = _failure(name, error)
        print(f"  built {name} in {time.perf_counter() - start:.1f} s", flush=True)
    return sides, errors


def compare_shape(c, spec: str, peak_flops: float) -> dict:
    tokens = counters.tokens_per_step(c)
    sides, errors = make_sides(c, spec, _SIDES.value)
    figures = run_rounds(sides, _STEPS.value, _ROUNDS.value, _WARMUP.value)
    flops = next((s.flops_per_step for s in sides if isinstance(s, JaxSide)), None)
    rows = {}
    for side in sides:
        f = figures[side.name]
        if "error" not in f:
            f["tokens_per_s"] = tokens / f["train_s"]
            f["step_over_forward"] = f["train_s"] / f["forward_s"]
            f["mfu"] = flops / f["train_s"] / peak_flops if flops else float("nan")
            f["peak_bytes"], f["peak_how"] = side.peak_bytes()
        if isinstance(side, JaxSide):
            f.update(compile_s=side.compile_s, lower_s=side.lower_s, compiled_peak_bytes=side.compiled_peak,
                     params=side.param_count, attention_kernel=side.attention_kernel,
                     remat_policy=side.config.model.remat_policy, scan_layers=side.config.model.scan_layers)
        else:
            f.update(compile_s=side.first_train_s, forward_compile_s=side.first_forward_s)
        rows[side.name] = f
        side.close()
    rows.update({name: {"error": e} for name, e in errors.items()})
    ratios = {f"{jax}/{hf}": rows[jax]["tokens_per_s"] / rows[hf]["tokens_per_s"]
              for jax in rows if jax.startswith("bert_jax") and "tokens_per_s" in rows[jax]
              for hf in rows if not hf.startswith("bert_jax") and "tokens_per_s" in rows[hf]}
    base_tps = rows.get("bert_jax", {}).get("tokens_per_s")
    ratios.update({f"{name}/bert_jax": r["tokens_per_s"] / base_tps for name, r in rows.items()
                   if name.startswith("bert_jax[") and base_tps and "tokens_per_s" in r})
    return {"shape": spec, "layers": c.model.num_layers, "hidden": c.model.hidden_size,
            "seq": c.data.max_seq_length, "batch": c.train.global_batch_size, "dtype": c.model.dtype,
            "scan_layers": c.model.scan_layers, "remat_policy": c.model.remat_policy,
            "attention_impl": c.model.get("attention_impl", "xla (before attention_impl existed)"),
            "attention_kernel": next((s.attention_kernel for s in sides if isinstance(s, JaxSide)), None),
            "flops_per_step": flops, "sides": rows, "ratios": ratios}


def print_shape(result: dict) -> None:
    r = result
    flops = f"{r['flops_per_step'] / 1e12:.3g} TFLOP/step" if r["flops_per_step"] else "FLOPs n/a"
    print(f"\n{r['shape']}: {r['layers']} layers, hidden {r['hidden']}, seq {r['seq']}, batch {r['batch']}, "
          f"{r['dtype']}, scan_layers={r['scan_layers']}, remat={r['remat_policy']}, "
          f"attention={r['attention_impl']} -> {r['attention_kernel']}; {flops}")
    print(f"  {'side':22} {'tokens/s':>10} {'step ms':>9} {'fwd ms':>8} {'step/fwd':>8} {'MFU':>6} "
          f"{'peak GiB':>9} {'compile s':>9}  memory from")
    for name, f in r["sides"].items():
        if "error" in f:
            print(f"  {name:22} {f['error']}")
            continue
        peak = "n/a" if np.isnan(f["peak_bytes"]) else f"{f['peak_bytes'] / GIB:.2f}"
        print(f"  {name:22} {f['tokens_per_s']:10.0f} {1e3 * f['train_s']:9.1f} {1e3 * f['forward_s']:8.1f} "
              f"{f['step_over_forward']:8.2f} {f['mfu']:6.1%} {peak:>9} {f['compile_s']:9.1f}  {f['peak_how']}"
              + (f"; XLA buffers {f['compiled_peak_bytes'] / GIB:.2f} GiB" if "compiled_peak_bytes" in f
                 and f["peak_how"] != "XLA buffer assignment" else ""))
    for name, ratio in r["ratios"].items():
        print(f"  {name}: {ratio:.2f}x tokens/s")


def packing_section(spec: str, dtype: str) -> dict:
    """Packed vs padded rows of the same real-length documents: real (non-pad) tokens per second."""
    base = shape_config(_PACKING_CONFIG.value, spec, "packing_shape", dtype)
    lengths = real_length_batches.document_lengths(20_000, _PACKING_MEDIAN.value, _PACKING_SIGMA.value)
    sides, fills, real = [], {}, {}
    for layout, builder in real_length_batches.LAYOUTS.items():
        c = copy.deepcopy(base)
        c.data.example_builder = builder
        built = real_length_batches.layout_batches(c.data, c.model, layout, lengths, c.train.global_batch_size,
                                                   _PACKING_BATCHES.value)
        fills[layout], real[layout] = built.fill, float(np.mean(built.real_tokens))
        sides.append(JaxSide(layout, c, built.batches))
    figures = run_rounds(sides, _STEPS.value, _ROUNDS.value, _WARMUP.value)
    for side in sides:
        f = figures[side.name]
        if "error" not in f:
            f.update(real_tokens_per_step=real[side.name], fill=fills[side.name],
                     real_tokens_per_s=real[side.name] / f["train_s"])
        f["compile_s"] = side.compile_s
        side.close()
    ok = all("real_tokens_per_s" in f for f in figures.values())
    result = {"shape": spec, "config_family_objective_from": "--packing_config", "median_tokens": _PACKING_MEDIAN.value,
              "sigma": _PACKING_SIGMA.value,
              "share_longer_than_a_row": float(np.mean(lengths > base.data.max_seq_length - 2)),
              "attention_impl": base.model.get("attention_impl", "xla (before attention_impl existed)"),
              "layouts": figures,
              "packed/padded": figures["packed"]["real_tokens_per_s"] / figures["padded"]["real_tokens_per_s"]
              if ok else None}
    print(f"\npacking vs padding at {spec} ({base.model.dtype}, attention={result['attention_impl']}): documents "
          f"log-normal, median {_PACKING_MEDIAN.value:.0f} tokens, sigma {_PACKING_SIGMA.value}, "
          f"{result['share_longer_than_a_row']:.1%} longer than a row")
    print(f"  {'layout':8} {'real tokens/s':>13} {'fill':>6} {'step ms':>8} {'compile s':>9}")
    for layout, f in figures.items():
        if "error" in f:
            print(f"  {layout:8} {f['error']}")
        else:
            print(f"  {layout:8} {f['real_tokens_per_s']:13.0f} {f['fill']:6.1%} {1e3 * f['train_s']:8.1f} "
                  f"{f['compile_s']:9.1f}")
    if ok:
        print(f"  packed/padded: {result['packed/padded']:.2f}x real tokens/s")
    return result


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    unknown = set(_SIDES.value) - set(SIDES)
    if unknown:
        raise app.UsageError(f"--sides: {sorted(unknown)} unknown; choose among {SIDES}")
    kind = platform_kind()
    dtype = _DTYPE.value if _DTYPE.value != "auto" else ("float32" if kind == "cpu" else "bfloat16")
    peak, peak_source = perf.peak_flops_per_device()
    device = jax.devices()[0]
    torch_note = f"torch {torch_bert.torch.__version__}, transformers {torch_bert.transformers.__version__}" \
        if torch_bert else f"torch absent ({TORCH_MISSING})"
    print(f"device: {device.device_kind} ({jax.default_backend()}); jax {jax.__version__}; {torch_note}; "
          f"MFU peak {peak / 1e12:.3g} TFLOP/s ({peak_source})", flush=True)
    results = {"device": device.device_kind, "platform": jax.default_backend(), "jax": jax.__version__,
               "torch": torch_note, "peak_flops": peak, "peak_source": peak_source,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv, "shapes": []}
    started = time.perf_counter()
    specs = DEFAULT_SHAPES[kind].split(",") if _SHAPES.value is None else _SHAPES.value
    header = {key: value for key, value in results.items() if key != "shapes"}
    for index, spec in enumerate(specs):
        if _BUDGET.value and time.perf_counter() - started > _BUDGET.value:
            results["shapes_left_out"] = specs[index:]
            print(f"\n--budget_s={_BUDGET.value:g} spent: {', '.join(specs[index:])} left out", flush=True)
            break
        results["shapes"].append(compare_shape(shape_config(_CONFIG.value, spec, "shapes", dtype), spec, peak))
        print_shape(results["shapes"][-1])
        write_figures(results)  # after every shape: a run cut short keeps what it measured
        append_line({**header, **results["shapes"][-1]})
    append_line({**header, "run": "done", "seconds": time.perf_counter() - started,
                 "shapes_left_out": results.get("shapes_left_out", [])})
    packing = DEFAULT_PACKING_SHAPE[kind] if _PACKING_SHAPE.value == "auto" else _PACKING_SHAPE.value
    if packing:
        results["packing"] = packing_section(packing, dtype)
        write_figures(results)


def append_line(row: dict) -> None:
    if _JSONL.value:
        with epath.Path(_JSONL.value).open("a") as f:
            f.write(json.dumps(row, default=float) + "\n")


def write_figures(results: dict) -> None:
    sys.stdout.flush()
    if _OUT.value:
        epath.Path(_OUT.value).write_text(json.dumps(results, indent=1, default=float))


if __name__ == "__main__":
    app.run(main)
