"""Cloud TPU slices by the names users rent them under (v4-32, v5e-16, v5p-128, v6e-8), as devices
the TPU compiler can compile for on any host, without a TPU.

`slice_devices("v5e-16")` asks libtpu (the `tpu` extra: `pip install -e ".[tpu]"`) for the
slice's topology through `jax.experimental.topologies`; a Mesh over those devices, abstract
inputs and `jit(...).lower(...).compile()` then run the real TPU compiler, as MaxText's
train_compile.py does.

Names follow Cloud TPU's accelerator types: v4 and v5p count TensorCores (2 per chip, one JAX
device per chip: megacore), v5e (v5litepod) and v6e count chips. Peak FLOP/s, HBM and its
bandwidth are per chip, from Google's data sheets (cloud.google.com/tpu/docs/system-architecture-*).
"""
import dataclasses
import math
import os
import re

from bert_jax import UserError

TPU_INSTALL_HINT = 'pip install -e ".[tpu]"'


@dataclasses.dataclass(frozen=True)
class TpuChip:
    generation: str  # v4 | v5e | v5p | v6e
    device_kind: str  # as JAX names the device
    peak_flops: float  # dense bf16 FLOP/s per chip
    hbm_gib: float
    hbm_bytes_per_s: float
    cores_per_chip_in_name: int  # v4-8 names 8 TensorCores = 4 chips; v5e-8 names 8 chips
    dims: int  # 3D torus (v4, v5p) or 2D (v5e, v6e)
    max_chips: int  # the largest slice sold


CHIPS = {
    "v4": TpuChip("v4", "TPU v4", 275e12, 32, 1200e9, 2, 3, 2048),
    "v5e": TpuChip("v5e", "TPU v5 lite", 197e12, 16, 819e9, 1, 2, 256),
    "v5p": TpuChip("v5p", "TPU v5", 459e12, 95, 2765e9, 2, 3, 8960),
    "v6e": TpuChip("v6e", "TPU v6 lite", 918e12, 32, 1640e9, 1, 2, 256),
}
ALIASES = {"v5litepod": "v5e"}


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    name: str  # as given, e.g. "v5p-128"
    chip: TpuChip
    num_chips: int  # per slice
    topology: str  # e.g. "v5p:4x4x4", for jax.experimental.topologies
    num_slices: int = 1

    @property
    def total_chips(self) -> int:
        return self.num_chips * self.num_slices

    @property
    def label(self) -> str:
        return self.name if self.num_slices == 1 else f"{self.num_slices} x {self.name}"


def _grid(chips: int, dims: int) -> tuple[int, ...]:
    """Cloud TPU's slice shapes: from 1x1 (2D) or 2x2x1 (3D), double the smallest axis (the last on a tie)."""
    shape = [1, 1] if dims == 2 else [2, 2, 1]
    while math.prod(shape) < chips:
        smallest = min(shape)
        shape[max(i for i, s in enumerate(shape) if s == smallest)] *= 2
    return tuple(shape)


def known_slice_names() -> str:
    """A line for error messages: the names this module accepts."""
    parts = []
    for gen, chip in CHIPS.items():
        sizes = [n * chip.cores_per_chip_in_name for n in _sizes(chip)]
        parts.append(f"{gen}-{sizes[0]} ... {gen}-{sizes[-1]} ({', '.join(str(s) for s in sizes)})")
    return "; ".join(parts) + " (v5litepod-N = v5e-N)"


def _sizes(chip: TpuChip) -> list[int]:
    first = 1 if chip.dims == 2 else 4
    out, n = [], first
    while n <= chip.max_chips:
        out.append(n)
        n *= 2
    return out


def parse_slice(name: str, num_slices: int = 1) -> TpuSlice:
    """"v5p-128" -> 64 v5p chips on a 4x4x4 torus; fails listing the known names."""
    match = re.fullmatch(r"(v\d+[a-z]*|v5litepod)-(\d+)", name.strip().lower())
    gen = ALIASES.get(match.group(1), match.group(1)) if match else None
    if gen not in CHIPS:
        raise UserError(f"--tpu={name!r} is not a TPU slice this planner knows. Known: {known_slice_names()}")
    chip = CHIPS[gen]
    count = int(match.group(2))
    chips, rest = divmod(count, chip.cores_per_chip_in_name)
    if rest or chips not in _sizes(chip):
        raise UserError(f"--tpu={name!r}: {gen} slices come as {', '.join(f'{gen}-{n * chip.cores_per_chip_in_name}' for n in _sizes(chip))}")
    if num_slices < 1:
        raise UserError(f"--num_slices={num_slices} must be >= 1")
    topology = f"{gen}:{'x'.join(str(d) for d in _grid(chips, chip.dims))}"
    return TpuSlice(name, chip, chips, topology, num_slices)


def set_libtpu_init_args(config) -> None:
    """Adds config.libtpu_init_args to LIBTPU_INIT_ARGS, the TPU compiler's flags; call before libtpu starts.

    The run on a TPU VM (`pretrain`) and the plan for a TPU slice on any host both call this, so the
    plan's memory and bytes are those of the program the run compiles.
    """
    extra = config.libtpu_init_args.split()
    current = os.environ.get("LIBTPU_INIT_ARGS", "").split()
    missing = [f for f in extra if f not in current]
    if missing:
        os.environ["LIBTPU_INIT_ARGS"] = " ".join(current + missing)


def ensure_libtpu() -> None:
    """Fails, naming the install command, when the TPU compiler (libtpu) is not installed."""
    try:
        import libtpu  # noqa: F401  the TPU compiler and runtime, from the `tpu` extra
    except ImportError:
        raise RuntimeError(f"compiling for a TPU slice needs libtpu, the TPU compiler; install it with "
                           f"{TPU_INSTALL_HINT}") from None


def slice_devices(tpu_slice: TpuSlice) -> list:
    """The slice's devices (all slices'), as the TPU compiler sees them; no TPU needed."""
    ensure_libtpu()
    # Several planner processes at once (parallel tests, a sweep of plans) share libtpu's lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server to ask: this is not a TPU VM
    # This module loads no JAX at import: pretrain sets libtpu's flags through it before JAX starts.
    from jax.experimental import topologies

    kwargs = {}
    if tpu_slice.chip.cores_per_chip_in_name == 2:
        kwargs["chip_config_name"] = "megacore"  # one JAX device per chip, as on a TPU VM
    if tpu_slice.num_chips < 4:
        kwargs["chips_per_host_bounds"] = (1, 1, 1)
    if tpu_slice.num_slices > 1:
        kwargs["num_slices"] = tpu_slice.num_slices
    topology = topologies.get_topology_desc(topology_name=tpu_slice.topology, platform="tpu", **kwargs)
    devices = list(topology.devices)
    if len(devices) != tpu_slice.total_chips:
        raise RuntimeError(f"libtpu gave {len(devices)} devices for {tpu_slice.label} ({tpu_slice.topology}); "
                           f"expected {tpu_slice.total_chips}")
    return devices
