"""The fastest a compiled step can run on a chip: its FLOPs at peak, or its bytes at HBM bandwidth.

A step that moves B bytes and does F FLOPs per chip cannot finish in less than
max(F / peak FLOP/s, B / HBM bytes/s). From that bound follow the most tokens per second a
chip can train and the most MFU it can reach (the formula's FLOPs over that time and the peak).
Where the bytes term wins, the step is memory-bound: only moving fewer bytes makes it faster.
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class Roofline:
    flops: float  # per chip per step, as the chip executes them (the compiler's count plus kernels it cannot see)
    bytes: float  # per chip per step, HBM traffic
    formula_flops: float  # per chip per step: the MFU formula's (bert_jax/train/perf.py)
    tokens: float  # per chip per step
    peak_flops: float  # per chip
    hbm_bytes_per_s: float

    @property
    def compute_s(self) -> float:
        return self.flops / self.peak_flops

    @property
    def memory_s(self) -> float:
        return self.bytes / self.hbm_bytes_per_s

    @property
    def step_s(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> str:
        return "memory-bound" if self.memory_s > self.compute_s else "compute-bound"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def mfu(self) -> float:
        return self.formula_flops / self.step_s / self.peak_flops

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens
