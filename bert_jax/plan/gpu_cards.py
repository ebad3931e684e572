"""NVIDIA GPUs by the names users rent them under (h100, h200, a100_80gb, a100_40gb), as devices XLA's GPU
compiler can compile for on any host, without a GPU.

XLA's GPU compiler needs no GPU: given a card's description (a `GpuTargetConfigProto` in text form, one per card
in `gpu_targets/`, written from the vendor's data sheets), the CUDA plugin (the `gpu` extra:
`pip install -e ".[gpu]"`) makes compile-only devices through `jax.experimental.topologies`, and
`jit(...).lower(...).compile()` over a mesh of them builds the program a run on that card would run: its memory
(`memory_analysis()`), its kernels and the bytes they move (the optimised HLO, bert_jax/plan/hlo_traffic.py).
`cost_analysis()` is None for these devices: FLOPs come from the unoptimised HLO (`hlo_traffic.dot_flops`).
Autotuning is off (there is no GPU to time on), so GEMMs get default tiles: a compile's memory and bytes are
those of the program, its speed is not measured.

The host's own backend stays the CPU (JAX_PLATFORMS=cpu), so the plugin never looks for a driver.
Peak FLOP/s (dense bf16) and HBM bandwidth are the data sheets' (SXM parts).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.resources
import importlib.util
import os
import re

from bert_jax import UserError

GPU_INSTALL_HINT = 'pip install -e ".[gpu]"'
DEVICES_PER_HOST = 8  # an HGX board: more devices are more hosts of eight


@dataclasses.dataclass(frozen=True)
class GpuCard:
    key: str  # as --gpu names it
    device_kind: str  # as JAX names the device
    peak_flops: float  # dense bf16 FLOP/s
    hbm_gib: float  # as sold
    hbm_bytes_per_s: float

    @property
    def target_config(self) -> str:
        """The card's GpuTargetConfigProto, text form (package data)."""
        return importlib.resources.files("bert_jax.plan").joinpath("gpu_targets", f"{self.key}.txtpb").read_text()

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor), as the target config gives it."""
        m = re.search(r"cuda_compute_capability \{\s*major: (\d+)\s*minor: (\d+)", self.target_config)
        return int(m.group(1)), int(m.group(2))

    @property
    def device_memory_bytes(self) -> int:
        """What the card reports as its memory (the target config's device_memory_size)."""
        return int(re.search(r"device_memory_size: (\d+)", self.target_config).group(1))


CARDS = {
    "h100": GpuCard("h100", "NVIDIA H100 80GB HBM3", 989.4e12, 80, 3.35e12),
    "h200": GpuCard("h200", "NVIDIA H200", 989.4e12, 141, 4.8e12),
    "a100_80gb": GpuCard("a100_80gb", "NVIDIA A100-SXM4-80GB", 312e12, 80, 2.039e12),
    "a100_40gb": GpuCard("a100_40gb", "NVIDIA A100-SXM4-40GB", 312e12, 40, 1.555e12),
}


@dataclasses.dataclass(frozen=True)
class GpuSet:
    """`num_chips` cards of one kind, the devices a GPU plan compiles for; named as a TPU slice's fields are
    (chip, num_chips, total_chips, num_slices, label), so the planner treats both as one accelerator."""

    chip: GpuCard
    num_chips: int
    num_slices: int = 1
    compiler: str = "gpu"

    @property
    def total_chips(self) -> int:
        return self.num_chips

    @property
    def label(self) -> str:
        return f"{self.num_chips} x {self.chip.key}"

    @property
    def topology(self) -> str:
        """slices x hosts x devices per host, as the CUDA plugin's topology option takes it."""
        hosts = max(1, -(-self.num_chips // DEVICES_PER_HOST))
        return f"1x{hosts}x{self.num_chips // hosts}"


def parse_gpu(key: str, num_devices: int = 1) -> GpuSet:
    """"h100", 8 -> eight H100s; fails listing the known cards."""
    card = CARDS.get(key.strip().lower())
    if card is None:
        raise UserError(f"--gpu={key!r} is not a GPU the planner knows; known: {', '.join(CARDS)}")
    if num_devices < 1:
        raise UserError(f"--num_devices={num_devices} must be >= 1")
    if num_devices > DEVICES_PER_HOST and num_devices % DEVICES_PER_HOST:
        raise UserError(f"--num_devices={num_devices}: more than {DEVICES_PER_HOST} GPUs come as hosts of "
                        f"{DEVICES_PER_HOST}; give a multiple of {DEVICES_PER_HOST}")
    return GpuSet(card, num_devices)


def plugin_available() -> bool:
    """Whether XLA's GPU compiler can be reached: the CUDA plugin (the `gpu` extra) is importable."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None  # the CUDA PJRT plugin
    except ImportError:  # no jax_plugins namespace at all
        return False


def gpu_devices(gpus: GpuSet) -> list:
    """The cards' devices as XLA's GPU compiler sees them; no GPU needed. Fails naming the install command when
    the CUDA plugin is missing."""
    if not plugin_available():
        raise RuntimeError(f"compiling for a GPU needs the CUDA plugin of XLA's GPU compiler; install it with "
                           f"{GPU_INSTALL_HINT}")
    # Unless JAX_PLATFORMS leaves CUDA out, the plugin checks the driver's CUDA version when JAX starts, and on a host
    # without one it does not register; this skips that check for a registration made here.
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    from jax.experimental import topologies  # after the variable above: the plugin may register on first use

    def topology():
        return topologies.get_topology_desc(platform="cuda", topology=gpus.topology,
                                            target_config=gpus.chip.target_config)
    try:
        devices = list(topology().devices)
    except NotImplementedError:  # JAX started before that variable was set: the plugin did not register then
        import jax_plugins.xla_cuda12 as cuda_plugin  # the `gpu` extra's plugin, registered now with the check skipped
        cuda_plugin.initialize()
        devices = list(topology().devices)
    if len(devices) != gpus.total_chips:
        raise RuntimeError(f"the CUDA plugin gave {len(devices)} devices for {gpus.label} ({gpus.topology}); "
                           f"expected {gpus.total_chips}")
    return devices


@contextlib.contextmanager
def cudnn_checks_answered_for(card: GpuCard):
    """Within it, jax's cuDNN attention asks `card` (not the host) which compute capability it has.

    jax 0.10 decides what cuDNN's fused attention may do (the packed layout of `attention_impl=cudnn`
    needs Hopper) by asking the first local GPU; on a host without one the answer is "none", and a
    packed step planned for an H100 fails with "Packed layout requires a GPU with at least Hopper
    architecture" although the card would run it. The answer is the card's; nothing else changes.
    """
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # the module that asks

    def at_least(capability: str) -> bool:
        return card.compute_capability >= tuple(int(x) for x in capability.split("."))

    def equal(capability: str) -> bool:
        return card.compute_capability == tuple(int(x) for x in capability.split("."))

    saved = cudnn.check_compute_capability, cudnn.is_cuda_compute_capability_equal
    cudnn.check_compute_capability, cudnn.is_cuda_compute_capability_equal = at_least, equal
    try:
        yield
    finally:
        cudnn.check_compute_capability, cudnn.is_cuda_compute_capability_equal = saved
