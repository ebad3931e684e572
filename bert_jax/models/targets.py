"""What a program is built for, as far as choosing its kernels goes: the platform, an NVIDIA card's compute
capability, and whether its rows are packed; and what cuDNN's fused attention may do on a card.

A run reads its target off its devices (`devices_target`); the planner names the target it compiles for on a host
that lacks it (`building_for`: a TPU slice, or a GPU card by its description, bert_jax/plan/gpu_cards.py), so that
`attention_impl=auto` picks what the run on that hardware would, and an explicit kernel the hardware cannot run
fails before anything compiles.
"""
import contextlib
import contextvars
import dataclasses
from typing import Iterator

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Target:
    """platform: 'tpu', 'gpu' (NVIDIA), 'rocm' or 'cpu'. compute_capability: an NVIDIA card's (major, minor); None:
    not known (a GPU named without its card, in tests). packed_rows: whether the program's rows hold several
    documents (segment ids); None: not known, so they may."""

    platform: str
    compute_capability: tuple[int, int] | None = None
    packed_rows: bool | None = None


# The target a program is being built for, when that is not the host's: a TPU plan compiled on a CPU host
# (bert_jax/plan/compiled_plan.py) must choose splash, and an A100 plan what an A100 runs.
_TARGET: contextvars.ContextVar[Target | None] = contextvars.ContextVar("target", default=None)


def devices_platform(devices) -> str:
    """'tpu', 'gpu' (NVIDIA, cuDNN), 'rocm' or 'cpu': the platform of these devices (a mesh's, say)."""
    device = next(iter(devices))
    version = device.client.platform_version.lower()  # a deviceless GPU compile's is the card's name
    if device.platform == "gpu" and "cuda" not in version and "nvidia" not in version:
        return "rocm"
    return device.platform


def devices_target(devices) -> Target:
    """The target these devices are: their platform and, on NVIDIA GPUs, the compute capability jax reports for
    them (a CUDA device's `compute_capability`, "8.0"; a planner's deviceless card reports its description's)."""
    platform = devices_platform(devices)
    if platform != "gpu":
        return Target(platform)
    major, minor = next(iter(devices)).compute_capability.split(".")
    return Target(platform, (int(major), int(minor)))


def target() -> Target:
    """The target (see `building_for`), else the host backend's devices'."""
    return _TARGET.get() or devices_target(jax.devices())


@contextlib.contextmanager
def building_for(platform: str | None = None, compute_capability: tuple[int, int] | None = None,
                 packed_rows: bool | None = None) -> Iterator[None]:
    """Within it, kernel choices and config checks are made for this target rather than the host's. What is not
    given is kept from the enclosing target when the platform is the same (a plan's card, inside the program the
    plan builds), else unknown."""
    outer = target()
    platform = platform or outer.platform
    same = platform == outer.platform
    token = _TARGET.set(Target(
        platform,
        compute_capability if compute_capability is not None else outer.compute_capability if same else None,
        packed_rows if packed_rows is not None else outer.packed_rows if same else None))
    try:
        yield
    finally:
        _TARGET.reset(token)


@dataclasses.dataclass(frozen=True)
class CudnnRules:
    """What jax's cuDNN flash attention may do on a card, as jax 0.10 checks it before compiling
    (jax/_src/cudnn/fused_attention_stablehlo.py, check_is_flash_attention): bf16/fp16 inputs; head_dim a multiple
    of 8 up to 128, up to 256 from Hopper (sm_90); the packed (ragged) layout, which packed rows use, from Hopper only
    ("Packed layout requires a GPU with at least Hopper architecture"). cuDNN's fused attention itself needs Ampere
    (sm_80) or later (NVIDIA TransformerEngine's nvte_get_fused_attn_backend). A card not known: head_dim up to
    128, packed rows left to jax's own check."""

    runs: bool  # Ampere or later (or not known)
    max_head_dim: int
    packs: bool  # the packed layout

    @classmethod
    def of(cls, compute_capability: tuple[int, int] | None) -> "CudnnRules":
        if compute_capability is None:
            return cls(True, 128, True)
        hopper = compute_capability >= (9, 0)
        return cls(compute_capability >= (8, 0), 256 if hopper else 128, hopper)

    def refusal(self, dtype, head_dim: int, packed: bool | None,
                compute_capability: tuple[int, int] | None) -> str | None:
        """Why cuDNN cannot run this attention on the card, in words; None when it can. packed None: rows may be
        packed, so a card without the packed layout refuses them."""
        card = "" if compute_capability is None else "this card: sm_{}{}".format(*compute_capability)
        if not self.runs:
            return f"cuDNN's fused attention needs an Ampere (sm_80) or later GPU ({card})"
        if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16) or head_dim % 8 or head_dim > self.max_head_dim:
            return (f"cuDNN needs bf16/fp16 compute and head_dim a multiple of 8 up to {self.max_head_dim} "
                    f"(config.model.dtype={jnp.dtype(dtype).name}, head_dim={head_dim}{card and '; ' + card})")
        if packed is not False and not self.packs:
            rows = "packed rows" if packed else "rows that may be packed"
            return f"cuDNN's packed layout ({rows}) needs a Hopper (sm_90) or later GPU ({card})"
        return None
