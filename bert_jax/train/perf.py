"""FLOPs, peak FLOP/s and MFU: the one place that measures throughput.

FLOPs of one training step (forward + backward), for B sequences of length S:

    6 * N * B * S                 dense matmuls, N = non-embedding parameters applied per token
  + 6 * N_pool * B                the pooler (NSP / SOP), applied to [CLS] alone
  + 12 * layers * hidden * S * (S + R) * B   attention scores and context (fwd + bwd), R relative rows,
                                             for each network of the module (a generator's too)
  + 6 * E * vocab * B * P           the tied MLM decoder at P predicted positions, E its width (`decoder_width`);
                                    a causal objective's head decodes every position: P = S

The attention term counts every (query, key) pair, causal or not: the xla kernel computes the masked half of a
causal layer too (and a local layer's whole row); splash and the Triton kernel skip the tiles a causal mask empties,
so under them the term is about twice the attention work done (an upper bound, as for local layers).

N excludes the embedding tables (their lookups cost no FLOPs; the decoder's use of
the word table is the third term): the leaves the family declares `embedding_tables`
(bert_jax.families, ParamRoles), e.g. a GDES discriminator's `delta` on its word table.

N leaves out the pooler (ParamRoles.pooler): counted per token, ALBERT-xxlarge's 16.8M of them put the
formula 0.7 % above the dots of its lowered train step (tests/test_flop_formula.py). N counts a parameter once
per depth that applies it: ALBERT's shared layer group num_layers times (ParamRoles.shared_layers). It counts
every parameter of the family's module, so a module of two networks (ELECTRA's generator and discriminator) has
both in the first term, the dominant one. The attention term
sums over the networks the module runs (`networks`: ELECTRA's and DeBERTa-v3's generator beside
the discriminator), each at its own hidden size, depth and relative rows: ELECTRA-large's generator
(a quarter of the width, all 24 layers) adds a quarter of the discriminator's attention, DeBERTa-v3's
(full width, half the depth) half of it. The decoder term uses the word table's width E: config.model's
embedding_size where the family has one (ALBERT, ELECTRA: the head projects hidden to E first), else hidden_size.

A frozen network in the step (a distillation teacher) adds its forward pass, a third of the
same formula with its own sizes:

  + 2 * N_t * B * S + 4 * layers_t * hidden_t * S^2 * B + 2 * E_t * vocab * B * P

R is 0 but for DeBERTa's disentangled attention (`config.model.position_buckets`): each query's
content-to-position and each key's position-to-content term is a product with the R = 2 * position_buckets
projected relative embeddings, 2 * 2 * S * R * hidden FLOPs a layer and sequence forward
(He et al. 2021, §3.1; the fused kernel's gathers by distance are not matmuls).

MFU = achieved FLOP/s / (devices * peak FLOP/s).

Where no data sheet applies (a CPU), the peak is a matmul measured once at start-up, before the step compiles: the
best of several trials, a lower bound of the device's, and a low one when other work shares the machine then. It is
never raised afterwards: an interval that beats it logs an MFU above 1 as it is (issue 76: raising the peak to the
interval's rate clamped the figure at 100 %, whatever the FLOP count said), with a warning, once, naming the FLOP
count's source and the peak's. Each row carries what its MFU divides: `perf/flops_per_step` / `perf/step_time_s` /
`perf/peak_flops` (all devices) is its `perf/mfu`.
"""
import fnmatch
import math
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from bert_jax.families import get_family
from data_pipelines.loader import masking

# Dense bf16 peak FLOP/s per device, from the vendors' data sheets.
PEAK_FLOPS_BY_DEVICE_KIND = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "NVIDIA A100-SXM4-40GB": 312e12,
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
}

def count_params(params, exclude: tuple[str, ...] = ()) -> int:
    """Counts parameters (arrays or ShapeDtypeStructs); leaves whose path names any of `exclude` are skipped."""
    total = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = {getattr(p, "key", None) for p in path}
        if not names.intersection(exclude):
            total += math.prod(leaf.shape)
    return total


def applied_params(params, roles, num_layers: int) -> float:
    """N of the formula: parameters times the depths that apply them per token. A leaf under one of G layer
    groups the family declares shared (ParamRoles.shared_layers) counts num_layers / G times; lookup tables
    (ParamRoles.embedding_tables) and the pooler (per sequence: pooler_params) not at all."""
    leaves = [(tuple(str(getattr(p, "key", "")) for p in path), math.prod(leaf.shape))
              for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
    shared = lambda name: any(fnmatch.fnmatchcase(name, p) for p in roles.shared_layers)  # noqa: E731
    groups = {name for names, _ in leaves for name in names if shared(name)}
    total = 0.0
    for names, size in leaves:
        if set(names).intersection(roles.embedding_tables) or roles.pooler in names:
            continue
        total += size * (num_layers / len(groups) if any(shared(n) for n in names) else 1)
    return total


def pooler_params(params, roles) -> int:
    """Parameters of the family's pooler (ParamRoles.pooler), which applies them once per sequence."""
    return 0 if roles.pooler is None else count_params({roles.pooler: _find(params, roles.pooler)})


def _find(tree, key: str):
    """The subtree under `key`, wherever it sits (a pooler may be nested in the family's module); {} if none."""
    if not isinstance(tree, dict):
        return {}
    if key in tree:
        return tree[key]
    return next((found for sub in tree.values() if (found := _find(sub, key))), {})


def attention_flops(hidden: int, layers: int, seq: int, batch: int, relative_rows: int = 0) -> float:
    """The formula's attention term, forward and backward: 12 * layers * hidden * S * (S + R) * B, R the
    relative-position rows both position terms score against (DeBERTa: 2 * position_buckets; else 0)."""
    return 12.0 * layers * hidden * seq * (seq + relative_rows) * batch


def relative_rows(model_cfg) -> int:
    """R of the formula: the projected relative embeddings DeBERTa's c2p and p2c terms are products with."""
    return 2 * int(getattr(model_cfg, "position_buckets", 0) or 0)


def networks(module_config) -> list:
    """The networks a family's module runs, each a config with its own hidden_size, num_layers and (DeBERTa)
    position_buckets: the module's own, and its generator's where it has one (`generator_config()`: ELECTRA,
    DeBERTa-v3), which runs its own attention in the same step."""
    generator = getattr(module_config, "generator_config", None)
    return [module_config] + ([generator()] if generator is not None else [])


def module_attention_flops(module_config, seq: int, batch: int) -> float:
    """The formula's attention term for every network of the module (`networks`), forward and backward."""
    return sum(attention_flops(net.hidden_size, net.num_layers, seq, batch, relative_rows(net))
               for net in networks(module_config))


def train_flops_per_step(params, model_cfg, data_cfg, global_batch_size: int) -> float:
    family = get_family(model_cfg.family)
    roles = family.roles
    n, n_pool = applied_params(params, roles, model_cfg.num_layers), pooler_params(params, roles)
    b, s, p = global_batch_size, data_cfg.max_seq_length, masking.predicted_positions(data_cfg)
    # The module's shapes, built with the reference kernel: the formula does not depend on it, and it builds on any
    # host (a plan for a TPU names splash, which this CPU host would refuse).
    module = family.build_model(ml_collections.ConfigDict(dict(model_cfg, attention_impl="xla")))
    attention = module_attention_flops(module.config, s, b)
    return 6.0 * n * b * s + 6.0 * n_pool * b + attention + 6.0 * decoder_width(model_cfg) * model_cfg.vocab_size * b * p


def decoder_width(model_cfg) -> int:
    """The width the tied MLM decoder multiplies at: the word table's, `embedding_size` where the family factorises
    its embeddings (ALBERT's 128, ELECTRA-small's), else hidden_size. ALBERT-xxlarge's head at hidden 4096 instead
    of 128 put the formula 0.8 % above the dots of its lowered train step (tests/test_flop_formula.py); with the
    pooler's per token, an MFU bound of 100.7 % on v5p-32 (docs/results/tpu-plans.md)."""
    return int(model_cfg.get("embedding_size", None) or model_cfg.hidden_size)


def forward_flops_per_step(params, model_cfg, data_cfg, global_batch_size: int) -> float:
    """The forward pass alone: a third of train_flops_per_step (forward 2, backward 4 FLOPs per weight and token)."""
    return train_flops_per_step(params, model_cfg, data_cfg, global_batch_size) / 3.0


def step_flops(program, config) -> float:
    """FLOPs of one step of `program` (bert_jax.train.program): the model's train step plus any frozen forward."""
    flops = train_flops_per_step(program.abstract_state.params, config.model, config.data,
                                 config.train.global_batch_size)
    if program.teacher is not None:
        flops += forward_flops_per_step(program.abstract_frozen, program.teacher.model_cfg, config.data,
                                        config.train.global_batch_size)
    return flops


def measure_matmul_peak(size: int = 2048, dtype=jnp.float32, repeats: int = 8) -> float:
    """Best FLOP/s of a square matmul over `repeats` trials on the default device: the practical peak where no data
    sheet applies. The best, not the mean: load on the machine only ever slows a trial."""
    x = jnp.ones((size, size), dtype)
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        f(x).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2.0 * size**3 / best


def peak_flops_per_device(configured: float = 0.0) -> tuple[float, str]:
    """(peak FLOP/s, where it came from): the config, the device's data sheet, or a measured matmul."""
    if configured > 0:
        return configured, "config.logging.peak_flops_per_device"
    kind = jax.devices()[0].device_kind
    for name, peak in PEAK_FLOPS_BY_DEVICE_KIND.items():
        if kind.startswith(name):
            return peak, f"data sheet for {kind}"
    return measure_matmul_peak(), f"{MEASURED} on {kind}"


# peak_flops_per_device's source for a peak it measured: the console calls such a ratio relative to the measurement.
MEASURED = "measured fp32 matmul"
# Where PerfMeter's FLOPs per step come from, for the warning an MFU above 1 gives.
FORMULA = "the formula in bert_jax/train/perf.py (step_flops)"


class PerfMeter:
    """Tokens/s, step time, MFU and ETA between two log points, against one peak fixed for the whole run.

    `peak_source`, `flops_source`: where the peak (peak_flops_per_device) and the FLOPs per step come from, named
    by the warning an MFU above 1 gives."""

    def __init__(self, flops_per_step: float, tokens_per_step: int, peak_flops_total: float, num_steps: int,
                 peak_source: str = "", flops_source: str = FORMULA):
        self.flops_per_step = flops_per_step
        self.tokens_per_step = tokens_per_step
        self.peak_flops_total = peak_flops_total
        self.num_steps = num_steps
        self.peak_source, self.flops_source = peak_source, flops_source
        # The console's name for the ratio: a measured peak's MFU is relative to that measurement.
        self.mfu_label = "MFU (of the measured peak)" if peak_source.startswith(MEASURED) else "MFU"
        self._warned = False
        self._t0 = None
        self._step0 = None

    def start(self, step: int) -> None:
        self._t0, self._step0 = time.perf_counter(), step

    def measure(self, step: int) -> dict:
        """Figures since the last start/measure; call after the step's results are on the host."""
        now = time.perf_counter()
        steps = max(step - self._step0, 1)
        step_time = (now - self._t0) / steps
        mfu = self.flops_per_step / step_time / self.peak_flops_total
        if mfu > 1 and not self._warned:
            self._warned = True
            logging.warning("MFU %.1f %% at step %d: above 100 %%, logged as it is. The FLOPs per step (%.4g) are %s; "
                            "the peak (%.4g FLOP/s, all devices) is the %s: one of them is off (a measured peak is "
                            "low when the machine was busy at start-up)", 100 * mfu, step, self.flops_per_step,
                            self.flops_source, self.peak_flops_total, self.peak_source or "given peak")
        self._t0, self._step0 = now, step
        return {
            "perf/step_time_s": step_time,
            "perf/tokens_per_s": self.tokens_per_step / step_time,
            "perf/mfu": mfu,
            "perf/flops_per_step": self.flops_per_step,
            "perf/peak_flops": self.peak_flops_total,
            "perf/eta_s": step_time * max(self.num_steps - step, 0),
        }


def format_duration(seconds: float) -> str:
    seconds = int(np.round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"
