"""Device memory as measured: the allocator's peak bytes in use on each of this host's devices, beside the plan.

On GPUs and TPUs `device.memory_stats()` reports the allocator's `peak_bytes_in_use`; the harness logs it after a
start's first step and at each logging step (`device/peak_bytes_in_use` in the row: the most of any local device),
next to the planned figure: the compiler's own memory analysis of the very step that trains (inputs, outputs not
aliased to donated inputs, temporaries: the formula of `bert-jax plan`, bert_jax/plan/memory_fit.py's
compiled_peak_bytes), read from the executable the first step compiles. The CPU has no allocator statistics
(`memory_stats()` is None): that is said once, and nothing is logged.
"""
import re

from absl import logging

GIB = 2**30
_UNIT_GIB = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}


def peak_bytes(devices) -> list[int] | None:
    """Each device's allocator peak in bytes, or None where the platform keeps no statistics (the CPU)."""
    stats = [device.memory_stats() for device in devices]
    if not stats or any(s is None or "peak_bytes_in_use" not in s for s in stats):
        return None
    return [int(s["peak_bytes_in_use"]) for s in stats]


def bytes_limit(devices) -> int | None:
    """The most a program may hold on each of `devices` (the smallest allocator limit among them), or None where the
    platform keeps no statistics (the CPU)."""
    stats = [device.memory_stats() for device in devices]
    if not stats or any(s is None or "bytes_limit" not in s for s in stats):
        return None
    return min(int(s["bytes_limit"]) for s in stats)


def compiled_peak_bytes(memory) -> int:
    """One device's peak for a compiled step (`compiled.memory_analysis()`): inputs, outputs not
    aliased to donated inputs, and temporaries. The planner's figure too (bert_jax/plan/memory_fit.py)."""
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes)


def refused_sizes_gib(message: str) -> tuple[float, float] | None:
    """(needed, available) GiB per chip from the TPU compiler's refusal, "RESOURCE_EXHAUSTED: Ran out of memory on
    HBM, the total memory required for HLO temporaries (41.11G) exceeds available HBM (15.75G)." (1.08T where a
    search asks for 512 sequences per chip with dots remat); None for any other error."""
    sizes = re.search(r"temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)", message)
    if "RESOURCE_EXHAUSTED" not in message or not sizes:
        return None
    return float(sizes.group(1)) * _UNIT_GIB[sizes.group(2)], float(sizes.group(3)) * _UNIT_GIB[sizes.group(4)]


def planned_peak_bytes(compiled) -> int | None:
    """The compiled step's peak per device, as the planner computes it; None when the compiler gives no analysis."""
    memory = compiled.memory_analysis()
    return None if memory is None else compiled_peak_bytes(memory)


class DeviceMemory:
    """Measures `devices` (this host's) at the steps the harness asks; says once when it cannot."""

    def __init__(self, devices):
        self.devices = list(devices)
        self.measurable = peak_bytes(self.devices) is not None
        self.planned: int | None = None
        if not self.measurable:
            kind = self.devices[0].platform if self.devices else "no device"
            logging.info("device memory is not measured on %s: its devices keep no allocator statistics "
                         "(memory_stats() is None)", kind)

    def measure(self, step: int) -> dict:
        """{"device/peak_bytes_in_use": the most of any device} and a log line, or {} where not measurable."""
        if not self.measurable:
            return {}
        peaks = peak_bytes(self.devices)
        planned = "" if self.planned is None else (
            f"; planned {self.planned / GIB:.2f} GiB (the compiled step's memory analysis), measured/planned "
            f"{max(peaks) / self.planned:.2f}")
        spread = "" if len(peaks) == 1 else f" (least {min(peaks) / GIB:.2f} GiB, over {len(peaks)} devices)"
        logging.info("step %d: device memory peak %.2f GiB in use%s%s", step, max(peaks) / GIB, spread, planned)
        return {"device/peak_bytes_in_use": float(max(peaks))}
