"""The fastest a compiled step can run on a chip: its FLOPs at peak, its bytes at HBM bandwidth, its collectives'
bytes at each link's bandwidth.

A step that does F FLOPs, moves B bytes through HBM and sends C_l bytes over link l per chip cannot finish in less
than

    max(F / peak FLOP/s, B / HBM bytes/s, C_l,async / link l's bytes/s for each link) + sum_l C_l,sync / link l's bytes/s

The asynchronous collectives (the compiler split them into a start and a done, or runs them beside a computation)
can overlap the rest, so each link is one more term of the max; the synchronous ones run in line, and nothing
overlaps them (bert_jax/plan/collectives.py says which is which, bert_jax/plan/links.py gives the bandwidths).
Whichever term is largest binds: compute, memory (HBM) or a link. From that bound follow the most tokens per
second a chip can train and the most MFU it can reach (the formula's FLOPs over that time and the peak).
"""
import dataclasses


@dataclasses.dataclass(frozen=True)
class LinkTime:
    name: str  # ICI, DCN, NVLink, network
    overlapped_s: float  # its asynchronous collectives' bytes over its bandwidth
    serial_s: float  # its synchronous collectives' bytes over its bandwidth


@dataclasses.dataclass(frozen=True)
class Roofline:
    flops: float  # per chip per step, as the chip executes them (the compiler's count plus kernels it cannot see)
    bytes: float  # per chip per step, HBM traffic
    formula_flops: float  # per chip per step: the MFU formula's (bert_jax/train/perf.py)
    tokens: float  # per chip per step
    peak_flops: float  # per chip
    hbm_bytes_per_s: float
    links: tuple[LinkTime, ...] = ()  # per link with a data-sheet bandwidth

    @property
    def compute_s(self) -> float:
        return self.flops / self.peak_flops

    @property
    def memory_s(self) -> float:
        return self.bytes / self.hbm_bytes_per_s

    @property
    def serial_s(self) -> float:
        """Synchronous collectives' time, every link: added to the rest, nothing overlaps it."""
        return sum(link.serial_s for link in self.links)

    @property
    def terms(self) -> dict[str, float]:
        """The overlapping terms of the bound: compute, memory and each link's asynchronous collectives."""
        return {"compute": self.compute_s, "memory": self.memory_s,
                **{link.name: link.overlapped_s for link in self.links}}

    @property
    def step_s(self) -> float:
        return max(self.terms.values()) + self.serial_s

    @property
    def floor_s(self) -> float:
        """The bound without its compute term: what the step takes however few FLOPs it did."""
        return max(v for k, v in self.terms.items() if k != "compute") + self.serial_s

    @property
    def binding(self) -> str:
        """The largest term: compute, memory, or a link's name."""
        terms = self.terms
        return max(terms, key=terms.get)

    @property
    def bound(self) -> str:
        return f"{self.binding}-bound"

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.step_s

    @property
    def mfu(self) -> float:
        return self.formula_flops / self.step_s / self.peak_flops

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens
