"""Self-attention for every family, with its kernel chosen by `config.model.attention_impl`.

    auto    the fastest kernel the platform, the card, the rows and the dropout allow (the default):
            TPU -> splash, NVIDIA GPU -> cudnn where the card's rules allow it (bf16/fp16 compute,
            head_dim a multiple of 8 up to 128, 256 from Hopper; packed rows from Hopper only:
            targets.CudnnRules) or, for a model with sliding-window layers, triton (bf16/fp16,
            head_dim up to 128), otherwise xla; attention dropout > 0 -> xla, the only kernel
            that applies it.
    xla     our einsum + float32 softmax: the reference the others are tested against.
    cudnn   jax.nn.dot_product_attention(implementation="cudnn"): NVIDIA's fused flash kernel.
    splash  the TPU Pallas splash kernel (jax.experimental.pallas.ops.tpu.splash_attention).
            Off TPU it runs only in Pallas interpret mode, with config.model.splash_interpret=True:
            slow, for tests of the kernel on a CPU. For DeBERTa-v3 (disentangled attention) splash
            means that family's own fused Pallas kernel (kernels/disentangled_attention.py), which adds the
            position terms per tile; splash_interpret runs it in interpret mode likewise.
    triton  our Pallas GPU (Triton) flash kernel (kernels/windowed_attention.py): the bidirectional window
            and packed segments, tiles outside the window skipped. Off an NVIDIA GPU it runs only in
            Pallas interpret mode, with config.model.splash_interpret=True (tests).

Masks (all kernels): padding, packed `segment_ids` (block-diagonal: attention never crosses
documents) and a sliding window (`window` tokens either side). What a kernel cannot apply fails
before compiling, naming the config key: cudnn takes no bidirectional window in jax 0.10, and
neither cudnn, splash nor triton drops attention probabilities.
"""
import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import Any, Callable, Iterator

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bert_jax.kernels import attention as kernels
from bert_jax.kernels import context_attention
from bert_jax.models.layers import Dense, logical
# building_for and devices_platform are imported from here by the program and the planner.
from bert_jax.models.targets import CudnnRules, building_for, devices_platform, target  # noqa: F401

ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "triton")


def length_shards() -> int:
    """The devices the logical `length` axis is split over: what attention asks to know whether it holds a slice of
    the queries."""
    return kernels.devices_along("length")


# How global layers attend over the context axis (config.mesh.context_attention, context_attention.SCHEMES): a
# program's, set around its steps' trace (`attending_by`), as flax's logical axis rules are around the model's.
_CONTEXT_SCHEME: contextvars.ContextVar[str] = contextvars.ContextVar("context_attention", default="all_gather")


@contextlib.contextmanager
def context_scheme(scheme: str) -> Iterator[None]:
    """Global layers traced inside attend over a split sequence by `scheme`: 'all_gather' or 'ring'."""
    if scheme not in context_attention.SCHEMES:
        raise ValueError(f"config.mesh.context_attention={scheme!r}; expected one of "
                         f"{', '.join(context_attention.SCHEMES)}")
    token = _CONTEXT_SCHEME.set(scheme)
    try:
        yield
    finally:
        _CONTEXT_SCHEME.reset(token)


def attending_by(scheme: str, step: Callable) -> Callable:
    """`step` traced under context_scheme(scheme): what a program jits, so every trace of it sees the scheme."""
    @functools.wraps(step)
    def traced(*args, **kwargs):
        with context_scheme(scheme):
            return step(*args, **kwargs)
    return traced


@dataclasses.dataclass(frozen=True)
class KernelChoice:
    impl: str  # xla | cudnn | splash | triton
    reason: str


def platform_name() -> str:
    """The target's platform (targets.building_for), else the host backend's: 'tpu', 'gpu', 'rocm', 'cpu'."""
    return target().platform


def choose_kernel(model_cfg, platform: str | None = None, window: bool = False,
                  drops_in_kernel: bool = False, causal: bool = False,
                  compute_capability: tuple[int, int] | None = None, packed: bool | None = None) -> KernelChoice:
    """Resolves `config.model.attention_impl` for `platform`, or fails naming the key and the platform.

    Called by config validation and when the model is built, before anything compiles (through the family's
    `kernel_choice`, which passes what the family's model needs). `model_cfg` is `config.model`:
    attention_impl, attention_dropout_rate, splash_interpret, dtype, hidden_size, num_heads. `window`: the
    model has sliding-window layers, which cuDNN cannot apply (jax 0.10 takes only a causal window).
    `drops_in_kernel`: the family's TPU kernel for `splash` applies attention dropout itself (DeBERTa's fused
    kernel); splash attention and cuDNN do not. `causal`: the model attends causally (a causal objective), which
    xla, splash and the windowed Pallas (Triton) kernel apply, and cuDNN on rows known unpacked (its ragged layout
    for packed rows is not wired causal here).
    `platform`, `compute_capability` (an NVIDIA card's) and `packed` (the rows hold several documents; None: they
    may): the target's (targets.building_for, else the host's) where not given. cuDNN is chosen, or accepted, only
    where the card's rules allow it (targets.CudnnRules).
    """
    get = model_cfg.get
    impl = get("attention_impl", "auto")
    dropout = float(get("attention_dropout_rate", 0.0))
    interpret = bool(get("splash_interpret", False))
    dtype = jnp.dtype(get("dtype", "float32"))
    head_dim = get("hidden_size", 64) // get("num_heads", 1)
    built_for = target()
    platform = platform or built_for.platform
    if platform == built_for.platform:
        compute_capability = compute_capability or built_for.compute_capability
        packed = built_for.packed_rows if packed is None else packed
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"config.model.attention_impl={impl!r}; expected one of {', '.join(ATTENTION_IMPLS)}")
    cudnn = CudnnRules.of(compute_capability)
    if impl == "auto":
        if platform == "tpu" and drops_in_kernel:
            return KernelChoice("splash", "TPU: Pallas" + (", attention dropout in the kernel" if dropout > 0 else ""))
        if dropout > 0:
            return KernelChoice("xla", f"config.model.attention_dropout_rate={dropout} needs the xla kernel: "
                                       "fused kernels cannot drop attention probabilities")
        if platform == "tpu":
            return KernelChoice("splash", "TPU: Pallas splash attention")
        if platform == "gpu" and causal and not window and packed is not False:
            return KernelChoice("xla", "causal attention (config.model.objective) on rows that may be packed: cuDNN's "
                                       "ragged layout is not wired causal here")
        if platform == "gpu" and window and dtype in (jnp.bfloat16, jnp.float16) and head_dim <= 128:
            return KernelChoice("triton", "NVIDIA GPU, sliding-window layers: the Pallas (Triton) flash kernel "
                                          "(jax's cuDNN attention takes no bidirectional window)")
        if platform == "gpu" and window:
            return KernelChoice("xla", f"sliding-window layers: cuDNN takes no bidirectional window, and the Pallas "
                                       f"(Triton) kernel is picked for bf16/fp16 compute and head_dim up to 128 "
                                       f"(config.model.dtype={dtype.name}, head_dim={head_dim})")
        refusal = cudnn.refusal(dtype, head_dim, packed, compute_capability)
        if platform == "gpu" and refusal is None:
            return KernelChoice("cudnn", "NVIDIA GPU: cuDNN flash attention")
        if platform == "gpu":
            return KernelChoice("xla", refusal)
        return KernelChoice("xla", f"no fused kernel on platform {platform!r}")
    if causal and impl == "cudnn" and packed is not False:
        raise ValueError(f"config.model.attention_impl='cudnn' does not apply causal attention "
                         f"(config.model.objective={get('objective')!r}) to rows that may be packed here; use "
                         f"attention_impl='xla', 'triton', 'splash' (TPU) or 'auto'")
    if impl == "cudnn":
        if window and not causal:
            raise ValueError("config.model.attention_impl='cudnn' cannot apply this model's sliding window "
                             "(config.model.local_attention): jax's cuDNN attention takes only a causal window. "
                             "Use attention_impl='auto' or 'xla'.")
        if platform != "gpu":
            raise ValueError(f"config.model.attention_impl='cudnn' needs an NVIDIA GPU with cuDNN; this platform "
                             f"is {platform!r}. Use attention_impl='auto' or 'xla'.")
        # Rows that may be packed are refused once they are known to be (the program knows its data).
        refusal = cudnn.refusal(dtype, head_dim, bool(packed), compute_capability)
        if refusal:
            raise ValueError(f"config.model.attention_impl='cudnn' cannot run here: {refusal}. Use "
                             "attention_impl='auto' or 'xla'.")
    if impl == "triton" and platform != "gpu" and not interpret:
        raise ValueError(
            f"config.model.attention_impl='triton' is a Pallas GPU (Triton) kernel for NVIDIA GPUs; this platform is "
            f"{platform!r}. Use attention_impl='auto' or 'xla', or set config.model.splash_interpret=True to run it in "
            "Pallas interpret mode (slow: for tests)."
        )
    if impl == "splash" and platform != "tpu" and not interpret:
        raise ValueError(
            f"config.model.attention_impl='splash' is a TPU kernel; this platform is {platform!r}. Use "
            "attention_impl='auto' or 'xla', or set config.model.splash_interpret=True to run it in Pallas "
            "interpret mode (slow: for tests)."
        )
    if dropout > 0 and (impl in ("cudnn", "triton") or (impl == "splash" and not drops_in_kernel)):
        raise ValueError(
            f"config.model.attention_impl={impl!r} cannot apply config.model.attention_dropout_rate={dropout}: "
            "the fused kernels do not drop attention probabilities. Set attention_dropout_rate=0, or "
            "attention_impl='xla' (or 'auto', which then picks xla)."
        )
    return KernelChoice(impl, f"config.model.attention_impl={impl!r}")


@flax.struct.dataclass
class AttentionMask:
    """Who attends to whom, as [batch, length] ids rather than a [batch, 1, q, k] bias.

    segments: int32, a real token's segment id (its document in a packed row), -1 on padding,
    which so forms a segment of its own. packed: rows may hold several documents (static).
    """

    segments: jax.Array
    packed: bool = flax.struct.field(pytree_node=False, default=False)


def attention_mask_from_batch(attention_mask: jax.Array, segment_ids: jax.Array | None) -> AttentionMask:
    """attention_mask: [batch, length], 1 on real tokens; segment_ids: [batch, length] (>= 0 on real
    tokens) or None. Padding must trail each row (the pipeline builds rows so; cuDNN relies on it)."""
    real = attention_mask.astype(bool)
    ids = jnp.zeros_like(attention_mask) if segment_ids is None else segment_ids
    return AttentionMask(jnp.where(real, ids, -1).astype(jnp.int32), packed=segment_ids is not None)


def logit_scale(cfg, head_dim: int, terms: int = 1) -> float:
    """What the attention logits (the sum of `terms` dot products: DeBERTa's 3) are multiplied by before the
    softmax: 1/sqrt(terms x head_dim), times the model config's `attention_multiplier`, μP's sqrt(base head size /
    head size) that makes it fall as 1/head_dim (bert_jax/models/parametrization.py), 1 under standard."""
    return cfg.attention_multiplier / math.sqrt(terms * head_dim)


def scaled_for_parametrization(cfg, q: jax.Array, score_bias: jax.Array | None):
    """q (and a score bias) times `attention_multiplier`: every kernel divides q.k by sqrt(head_dim), so the logits
    come out scaled by `logit_scale`. Under standard (multiplier 1) both are returned untouched."""
    multiplier = cfg.attention_multiplier
    if multiplier == 1.0:
        return q, score_bias
    q = q * jnp.asarray(multiplier, q.dtype)
    return q, None if score_bias is None else score_bias * jnp.float32(multiplier)


class Attend(nn.Module):
    """The chosen kernel over projected heads, with every mask: the part each family's attention shares.

    A family whose projections differ (fused QKV, rotary positions) projects its own q, k, v
    and calls this, so all of them get the same kernels and mask handling.
    """

    config: Any  # num_heads, attention_impl (resolved), attention_dropout_rate, splash_interpret
    window: int | None = None  # attend to at most `window` tokens either side (None: all); causal: back
    causal: bool = False  # only keys at or before the query (a causal objective)

    @nn.compact
    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: AttentionMask,
                 deterministic: bool, score_bias: jax.Array | None = None) -> jax.Array:
        """q, k, v: [batch, length, heads, head_dim] -> context [batch, length, heads, head_dim].

        score_bias: optional [batch, heads, q, k] float32 added to the scores before the mask and
        the softmax (DeBERTa's disentangled position terms); only the xla kernel takes one.
        """
        cfg = self.config
        impl = cfg.attention_impl
        q, score_bias = scaled_for_parametrization(cfg, q, score_bias)
        if score_bias is not None and impl != "xla":
            raise ValueError(f"config.model.attention_impl={impl!r} cannot add a score bias (disentangled "
                             "attention's position terms); only 'xla' can")
        if impl == "xla":
            dropout = None
            if cfg.attention_dropout_rate > 0 and not deterministic:
                dropout = lambda p: nn.Dropout(cfg.attention_dropout_rate)(p, deterministic=False)  # noqa: E731
            shards = length_shards()
            if shards > 1:  # context parallelism (config.mesh.context): this device holds a slice of the queries
                split = self._over_context_axis(q, k, v, mask, shards, dropout is None and score_bias is None)
                if split is not None:
                    return split
            # Keys and values whole along `length`: under the context axis XLA all-gathers them, so document masks and
            # windows that cross a shard's edge see every key (a no-op when `length` maps to no mesh axis).
            k, v = (nn.with_logical_constraint(y, ("batch", None, "heads", "kv")) for y in (k, v))
            if shards > 1 and dropout is None and score_bias is None:  # a shard's queries a chunk at a time
                return kernels.xla_attention_by_query_chunks(q, k, v, mask.segments, self.window, shards, self.causal)
            # bert_jax.inspect.views reads the probabilities: applied with mutable=["intermediates"] only; training
            # does not make that collection mutable, so the sow is a no-op there.
            sow = lambda p: self.sow("intermediates", "attention_probs", p)  # noqa: E731
            return kernels.xla_attention(q, k, v, mask.segments, self.window, dropout, score_bias, sow, self.causal)
        if impl == "splash":
            shards = length_shards()
            if shards > 1:  # config validation admits it for bidirectional layers, the all_gather scheme
                if context_attention.halo_fits(self.window, q.shape[1], shards):
                    return context_attention.halo_attention(q, k, v, mask.segments, self.window, self.causal)
                if self.window is not None or self.causal or _CONTEXT_SCHEME.get() != "all_gather":
                    raise ValueError("attention_impl='splash' splits over the context axis only for bidirectional "
                                     "global layers under context_attention=all_gather: use attention_impl='xla'")
                return context_attention.splash_over_gathered(q, k, v, mask.segments, cfg.splash_interpret)
            return kernels.splash_attention(q, k, v, mask.segments, self.window, cfg.splash_interpret, self.causal)
        if impl == "triton":
            return kernels.triton_attention(q, k, v, mask.segments, self.window, cfg.splash_interpret,
                                            causal=self.causal)
        if impl == "cudnn":  # causal on unpacked rows only: cudnn_attention refuses packed ones
            return kernels.cudnn_attention(q, k, v, mask.segments, self.window, mask.packed, causal=self.causal)
        raise ValueError(f"attention_impl={impl!r} reached the module unresolved; build models through "
                         "the family registry (it resolves 'auto')")

    def _over_context_axis(self, q, k, v, mask: AttentionMask, shards: int, plain: bool) -> jax.Array | None:
        """A split sequence's attention without the all-gather, or None for the all-gather's: a window within a shard
        takes its neighbours' halo (either scheme); a global layer under config.mesh.context_attention='ring' goes
        round the ring. `plain`: no dropout and no score bias, which only the gathered path applies."""
        scheme = _CONTEXT_SCHEME.get()
        if plain and context_attention.halo_fits(self.window, q.shape[1], shards):
            return context_attention.halo_attention(q, k, v, mask.segments, self.window, self.causal)
        if scheme != "ring":
            return None
        if not plain:  # config validation refuses attention dropout with the ring; a score bias is a family's
            raise ValueError("config.mesh.context_attention='ring' applies no attention dropout and no score bias "
                             "(DeBERTa-v3's position terms): use config.mesh.context_attention=all_gather")
        return context_attention.ring_attention(q, k, v, mask.segments, self.window, self.causal)


class SelfAttention(nn.Module):
    """Multi-head self-attention: query/key/value projections, the chosen kernel, the output projection."""

    config: Any  # a model dataclass: num_heads, hidden_size, attention_impl (resolved), ...
    window: int | None = None  # attend to at most `window` tokens either side (None: all)

    @nn.compact
    def __call__(self, x: jax.Array, mask: AttentionMask, deterministic: bool) -> jax.Array:
        """x: [batch, length, hidden] -> [batch, length, hidden]."""
        cfg = self.config
        heads, head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        dense = lambda name: Dense(  # noqa: E731
            (cfg.hidden_size,), (heads, head_dim), ("embed", "heads", "kv"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name=name,
        )
        axes = ("batch", "length", "heads", "kv")
        if getattr(cfg, "fused_qkv", False):
            q, k, v = _fused_projections(cfg, x, heads, head_dim)
        else:
            q, k, v = (dense(name)(x) for name in ("query", "key", "value"))
        q, k, v = (nn.with_logical_constraint(y, axes) for y in (q, k, v))
        context = Attend(cfg, self.window, name="attend")(q, k, v, mask, deterministic)
        context = nn.with_logical_constraint(context, axes)
        return Dense(
            (heads, head_dim), (cfg.hidden_size,), ("heads", "kv", "embed"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name="output",
        )(context)


class _ProjectionParams(nn.Module):
    """The kernel [hidden, heads, head_dim] and bias [heads, head_dim] of a `Dense` named like this one: the same
    names, shapes, initialisers and logical axes, so the same parameters (and init values) as the unfused path."""

    config: Any
    heads: int
    head_dim: int

    @nn.compact
    def __call__(self) -> tuple[jax.Array, jax.Array]:
        cfg = self.config
        kernel = self.param("kernel", logical(nn.initializers.normal(cfg.initializer_range), ("embed", "heads", "kv")),
                            (cfg.hidden_size, self.heads, self.head_dim), cfg.param_dtype)
        bias = self.param("bias", logical(nn.initializers.zeros, ("heads", "kv")), (self.heads, self.head_dim),
                          cfg.param_dtype)
        return kernel, bias


def _fused_projections(cfg, x: jax.Array, heads: int, head_dim: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q, k, v [batch, length, heads, head_dim] from one matmul against the three kernels side by side (config.model
    .fused_qkv): x is read once, and the backward's input gradient is one matmul, not three accumulated ones.
    Parameters stay `query`, `key`, `value` (checkpoints and converters see no change)."""
    params = [_ProjectionParams(cfg, heads, head_dim, name=name)() for name in ("query", "key", "value")]
    kernel = jnp.stack([w.astype(cfg.dtype) for w, _ in params], axis=1)  # [hidden, 3, heads, head_dim]
    bias = jnp.stack([b.astype(cfg.dtype) for _, b in params])
    y = jnp.einsum("bsh,hjnd->bsjnd", x.astype(cfg.dtype), kernel) + bias
    return y[:, :, 0], y[:, :, 1], y[:, :, 2]
