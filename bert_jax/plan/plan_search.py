"""`plan --tpu=... --search` (or `--gpu=...`): what researchers try by hand on a TPU or GPUs they pay for,
compiled here instead, by the target's own compiler (a GPU set of bert_jax/plan/gpu_cards.py goes where a slice does).

Tries remat policy x mesh (data / fsdp / tensor / context) x per-chip batch x scan, keeping the config's
global batch (a smaller per-chip batch is gradient accumulation, so training is unchanged). The context axis
(cpN: FSDP with each sequence split over N chips, config.mesh.context; ringN: the same with global attention's keys
and values passed round a ring, config.mesh.context_attention=ring) is tried only once no mesh that keeps a
sequence whole has fit: where one fits, splitting the sequence adds the keys' and values' collectives for nothing.
For each (scan, mesh, remat) it compiles per-chip batches from the largest down and keeps the
first that fits: a bigger micro-batch re-reads the weights less. Each compile is a full TPU compile
(one to five minutes for a large model on one core), so the search compiles only what can fit:
memory is affine in the micro-batch with a non-negative intercept, so a micro-batch b that needs N
of the L bytes a chip has rules out every micro-batch above b * L / N. That rule holds within one remat
policy only: the compiler does not order the policies by memory (DeBERTa-v3-large under FSDP on v5e-16 needs
10.9 GiB at 4 sequences per chip with no remat and 13.2 GiB with `dots`), so one that saves more says nothing
of what fits with one that saves less, and each walks on its own compiles. Those that fit, when
scanned, are compiled a second time to count every layer's FLOPs (once per remat policy and tensor
axis), unless the count cannot change the ranking. A scanned step's bytes are exact before that count and its
FLOPs only too low, so its roofline step time then is a lower bound: a fit no faster than the best so far is
kept uncounted. Its FLOPs have a ceiling too (no instruction runs more often than the longest loop's trips): a
fit memory-bound even at that ceiling has its step time, its bytes', without the count (DeBERTa-v3-large, two
layer loops, memory-bound at 24 %, would need three more compiles of ten minutes each per remat policy); under
FSDP, whose windowed einsums' loops loosen that ceiling, after one compile with them off. They are ranked by the
roofline step time (compute, HBM and each link's collectives: bert_jax/plan/roofline.py), lower bounds last. A
candidate the compiler fails on (out of on-chip vmem, say) is named
and the walk goes on. The search prints as it goes.

It stops at the first fit whose MFU bound reaches `enough_mfu` (plan's default 98 %), beginning with the config as
given, so a config that is already there costs one plan: a bound is the formula's
FLOPs over the roofline time, so no configuration left could be more than the remaining 2 % faster unless it
computed less than the formula counts. Every compute-bound fit at seq 512 reads 97-99 %; searching on there buys
at most that 1-2 % for the rest of an hour of compiles.
"""
import dataclasses
import math
from typing import Callable

import jax

from bert_jax.plan import compiled_plan as planner
from bert_jax.parallel import tpu_slices

GIB = 1024**3
REMATS = ("none", "dots", "full")
MESHES = ("dp", "fsdp")
SCANS = (True, False)


@dataclasses.dataclass(frozen=True)
class Candidate:
    scan: bool
    mesh: str  # dp | fsdp | tpN (fsdp with an N-way tensor axis) | cpN (fsdp with an N-way context axis) | ringN (cpN
    # with global attention by a ring of permutes, not an all-gather)
    remat: str
    grad_accum_steps: int

    @classmethod
    def of(cls, config) -> "Candidate":
        """The configuration a config already is, as the search names it."""
        return cls(bool(config.model.scan_layers), mesh_name(config), config.model.remat_policy,
                   config.train.grad_accum_steps)

    def overrides(self) -> dict[str, object]:
        return {"model.scan_layers": self.scan, "model.remat_policy": self.remat, "mesh.shape": mesh_shape(self.mesh),
                "mesh.context": mesh_context(self.mesh), "mesh.context_attention": mesh_scheme(self.mesh),
                "mesh.rules": "fsdp_tp", "train.grad_accum_steps": self.grad_accum_steps}

    def flags(self) -> str:
        def value(v):
            return f"'{v}'" if isinstance(v, tuple) else v
        return " ".join(f"--config.{k}={value(v)}".replace(" ", "") for k, v in self.overrides().items())


@dataclasses.dataclass
class Tried:
    candidate: Candidate
    plan: planner.Plan | None  # None: failed to build or compile
    fits: bool
    error: str = ""
    over_gib: float = 0.0  # refused by the compiler (planner.DoesNotFit): needed minus available, per chip
    needed_gib: float = 0.0  # refused: what the compiler needed for temporaries, per chip
    compile_failed: bool = False  # the TPU compiler failed on it (e.g. out of on-chip vmem): another shape may not


def mesh_shape(name: str) -> tuple[int, int, int]:
    if name == "dp":
        return (-1, 1, 1)
    if name == "fsdp":
        return (1, -1, 1)
    if name.startswith("tp") and name[2:].isdigit():
        return (1, -1, int(name[2:]))
    if mesh_context(name) > 1:
        return (1, -1, 1)
    raise ValueError(f"search mesh {name!r}: expected dp, fsdp, tpN (fsdp with an N-way tensor axis), cpN (fsdp "
                     f"with an N-way context axis) or ringN (cpN, global attention by a ring)")


def mesh_context(name: str) -> int:
    """The context axis of a search mesh: N for cpN and ringN, else 1."""
    for prefix in ("cp", "ring"):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return int(name[len(prefix):])
    return 1


def mesh_scheme(name: str) -> str:
    """config.mesh.context_attention for a search mesh: ring for ringN, else all_gather."""
    return "ring" if name.startswith("ring") else "all_gather"


def batch_shards(tpu_slice: tpu_slices.TpuSlice, mesh: str) -> int:
    """The chips that split the batch: the tensor and context axes split work within a sequence, not sequences."""
    return tpu_slice.total_chips // (mesh_shape(mesh)[2] * mesh_context(mesh))


def context_meshes(config, tpu_slice: tpu_slices.TpuSlice) -> tuple[str, ...]:
    """cpN then ringN for the context axes a slice holds and the sequence splits over (N = 2, 4, ... up to a slice's
    chips): the all-gather and the ring of each, side by side."""
    chips, length = tpu_slice.total_chips // tpu_slice.num_slices, config.data.max_seq_length
    return tuple(f"{scheme}{n}" for n in (2 ** k for k in range(1, chips.bit_length())) if chips % n == 0
                 and length % n == 0 for scheme in ("cp", "ring"))


def with_overrides(config, overrides: dict[str, object]):
    """A copy of config with {"section.key": value} set, as --config.section.key=value would."""
    c = config.copy_and_resolve_references()
    for key, value in overrides.items():
        section, name = key.split(".")
        try:
            c[section][name] = value
        except TypeError:  # a key of several types ('auto' or an int), which the resolved copy pinned to its value's
            with c[section].unlocked():
                del c[section][name]
                c[section][name] = value
    return c


def apply(config, candidate: Candidate, num_slices: int):
    c = with_overrides(config, candidate.overrides())
    if num_slices > 1:
        c.mesh.dcn_shape = (num_slices, 1, 1)  # data parallel across slices, over DCN
    return c


def accumulation_steps(config, tpu_slice: tpu_slices.TpuSlice, mesh: str) -> list[int]:
    """Every number of accumulation steps that splits the global batch into equal per-chip micro-batches of at
    least one sequence, fewest first (not only powers of two: ModernBERT's 4608 over 16 chips is 288 per chip,
    down to 1 in 288 steps, not 9 in 32)."""
    shards = batch_shards(tpu_slice, mesh)
    batch = config.train.global_batch_size
    if batch % shards:
        return []
    per_chip = batch // shards
    return [per_chip // m for m in range(per_chip, 0, -1) if per_chip % m == 0]


def micro_batch(config, tpu_slice: tpu_slices.TpuSlice, mesh: str, accum: int) -> int:
    """Sequences one chip runs per micro-batch (the tensor axis splits work within a sequence, not sequences)."""
    return config.train.global_batch_size // accum // batch_shards(tpu_slice, mesh)


def largest_that_can_fit(micro: int, needed: float, limit: float) -> float:
    """The largest micro-batch that can fit, given that `micro` sequences needed `needed` bytes of `limit`:
    memory c + k * micro with c >= 0 exceeds the limit for every micro-batch above micro * limit / needed."""
    return micro * limit / needed


def search(config, tpu_slice: tpu_slices.TpuSlice, hbm_gib: float = 0.0, remats=REMATS, meshes=MESHES, scans=SCANS,
           enough_mfu: float = 0.0, log: Callable[[str], None] = lambda _: None) -> list[Tried]:
    """Every configuration compiled, fitting ones first, ranked by roofline step time (the module says which
    are skipped without compiling, and why, and when the search stops early; `log` names them). With
    enough_mfu, the config as given is compiled first: one that is already good enough ends the search there.
    When none of `meshes` fits, the context axes (context_meshes) are tried next."""
    walk = _Walk(config, tpu_slice, hbm_gib, enough_mfu, log)
    given = Candidate.of(config)
    if not (enough_mfu and walk.attempt(given)):
        walk.every(remats, meshes, scans)
        split = tuple(m for m in context_meshes(config, tpu_slice) if m not in meshes)
        if split and not any(t.fits for t in walk.tried.values()):
            log(f"no mesh that keeps a sequence whole fits: trying the context axis ({', '.join(split)})")
            walk.every(remats, split, scans)
    return sorted(walk.tried.values(), key=_rank)


class _Walk:
    """The search's state: what was tried (each candidate compiled once), one layer's FLOPs per remat policy,
    and whether a fit has been good enough to stop."""

    def __init__(self, config, tpu_slice, hbm_gib, enough_mfu, log):
        self.config, self.tpu_slice, self.hbm_gib, self.enough_mfu, self.log = config, tpu_slice, hbm_gib, enough_mfu, log
        self.tried: dict[Candidate, Tried] = {}
        self.layer_flops: dict = {}  # (remat, tensor axis) -> one scanned layer's FLOPs per sequence on a chip, per loop length

    def attempt(self, candidate: Candidate) -> bool:
        """Compiles candidate unless it was; True when it is good enough to stop."""
        if candidate not in self.tried:
            best = min((t.plan.roofline.step_s for t in self.tried.values() if t.fits and t.plan.step_is_exact),
                       default=math.inf)
            self.tried[candidate] = _try(self.config, candidate, self.tpu_slice, self.hbm_gib, self.layer_flops, beat=best)
            self.log(_describe(self.tried[candidate], self.tpu_slice))
        result = self.tried[candidate]
        if not (self.enough_mfu and result.fits and result.plan.step_is_exact
                and result.plan.roofline.mfu >= self.enough_mfu):
            return False
        mfu = result.plan.roofline.mfu
        self.log(f"stopped: an MFU bound of {mfu:.1%} reaches {self.enough_mfu:.0%}; no configuration left can be more "
                 f"than {max(0.0, 1 - mfu):.1%} faster unless it computes less than the formula counts (search on "
                 "with --search_enough_mfu=0)")
        return True

    def every(self, remats, meshes, scans) -> None:
        config, tpu_slice = self.config, self.tpu_slice
        # A fixed order, however --search_remats is spelled, so the log and an early stop are the same for the
        # same set of policies; it no longer bounds one policy's micro-batches by another's.
        saving_most_first = sorted(remats, key=lambda r: REMATS[::-1].index(r) if r in REMATS else -1)
        for scan in scans:
            for mesh in meshes:
                for remat in saving_most_first:
                    ceiling = math.inf  # no micro-batch above this fits with this remat policy
                    skipped = []
                    for accum in accumulation_steps(config, tpu_slice, mesh):
                        candidate = Candidate(scan, mesh, remat, accum)
                        micro = micro_batch(config, tpu_slice, mesh, accum)
                        if micro > ceiling:
                            skipped.append(micro)
                            continue
                        if self.attempt(candidate):
                            return
                        result = self.tried[candidate]
                        if result.fits:
                            break
                        if result.compile_failed:
                            continue  # says nothing of memory: the next micro-batch is another program
                        if result.plan is None and not result.over_gib:
                            break  # not built: no micro-batch changes that
                        if result.over_gib:  # refused: its temporaries alone exceed what the compiler could use
                            needed, limit = result.needed_gib, result.needed_gib - result.over_gib
                        else:
                            needed, limit = result.plan.peak_bytes, planner.fits(result.plan, self.hbm_gib)[1]
                        ceiling = min(ceiling, largest_that_can_fit(micro, needed, limit))
                    if skipped:
                        self.log(f"scan={scan} mesh={mesh} remat={remat}: not compiled at {', '.join(map(str, skipped))} "
                                 f"sequences per chip: above the {ceiling:.1f} that can fit, by its compiles before")


def _try(config, candidate: Candidate, tpu_slice, hbm_gib: float, layer_flops: dict | None = None,
         beat: float = math.inf) -> Tried:
    """Screens a candidate by memory; one that fits gets every layer's FLOPs counted, reusing one layer's FLOPs
    per sequence from an earlier candidate with the same remat policy and tensor axis (they scale with the
    micro-batch: the mesh's data and fsdp axes do not change a chip's work), unless its step time before the
    count (a lower bound) is no better than `beat`."""
    c = apply(config, candidate, tpu_slice.num_slices)
    try:
        screened = planner.make_plan(c, tpu_slice, count_every_layer=False)
    except ValueError as e:  # a mesh the model does not split over, say: named, not fatal to the search
        return Tried(candidate, None, False, str(e).splitlines()[0])
    except planner.DoesNotFit as e:  # far over: a smaller micro-batch may still fit
        return Tried(candidate, None, False, str(e), over_gib=e.needed_gib - e.available_gib,
                     needed_gib=e.needed_gib)
    except jax.errors.JaxRuntimeError as e:  # as it would on a TPU: a verdict on this candidate, not on the search
        # DeBERTa-v3-large, FSDP, remat full, 128 sequences per v4 chip: "RESOURCE_EXHAUSTED: XLA:TPU compile
        # permanent error. Ran out of memory in memory space vmem. Used 18.16M of 16.00M vmem. ...", then a listing.
        return Tried(candidate, None, False, "the TPU compiler failed: " + _first_line(e), compile_failed=True)
    if not planner.fits(screened, hbm_gib)[0]:
        return Tried(candidate, screened, False)
    if planner.counting_needed(screened, c) and screened.roofline.step_s < beat and not screened.step_is_exact:
        screened = planner.with_whole_dots(screened, c)  # one compile, not unrolled: under FSDP, a lower ceiling
    if planner.counting_needed(screened, c):
        r = screened.roofline
        if r.step_s >= beat:
            return Tried(candidate, screened, True, f"FLOPs not counted (cannot beat the best): its step takes at least "
                         f"{r.step_s * 1e3:.1f} ms, the best {beat * 1e3:.1f} ms")
        if screened.step_is_exact:
            most = screened.flops_ceiling + screened.pallas_flops
            return Tried(candidate, screened, True, f"FLOPs not counted (memory-bound at any count): at most "
                         f"{most / 1e12:.3g} TFLOP per chip, {most / r.peak_flops * 1e3:.1f} ms at peak, within its "
                         f"{r.memory_s * 1e3:.1f} ms of HBM bytes")
    layer_flops = {} if layer_flops is None else layer_flops
    mesh = candidate.mesh
    key = (candidate.remat, mesh_shape(mesh)[2], mesh_context(mesh), mesh_scheme(mesh))
    batch = screened.micro_batch_per_chip
    known = tuple(f * batch for f in layer_flops[key]) if key in layer_flops else None
    try:
        counted, per_layer = planner.count_every_layer(screened, c, known)
    except (planner.DoesNotFit, jax.errors.JaxRuntimeError) as e:  # it fits; a step compiled to count does not
        return Tried(candidate, screened, True, f"FLOPs not counted (too low, the count refused), ranked last: "
                     f"{_first_line(e)}")
    if per_layer is not None:
        layer_flops[key] = tuple(f / batch for f in per_layer)
    return Tried(candidate, counted, True)


def _first_line(error: Exception) -> str:
    """A compiler error's first line: its verdict, without the allocation listing that follows."""
    return str(error).strip().splitlines()[0][:300]


def _rank(t: Tried):
    """Fitting ones by roofline step time, then the rest by how much memory they need."""
    if t.fits:
        return (0, not t.plan.step_is_exact, t.plan.roofline.step_s)  # lower bounds last
    if t.plan:
        return (1, False, t.plan.peak_bytes)
    return (2, False, t.over_gib or math.inf)  # refused by the compiler: further over than any that compiled


def _describe(t: Tried, tpu_slice) -> str:
    c = t.candidate
    micro = f"grad_accum {c.grad_accum_steps}"
    head = f"scan={c.scan} mesh={c.mesh} remat={c.remat} {micro}"
    if t.plan is None:
        return f"{head}: {t.error}" if t.over_gib or t.compile_failed else f"{head}: not built ({t.error})"
    text = f"{head}: peak {t.plan.peak_bytes / GIB:.2f} GiB per chip, compiled in {t.plan.compile_s:.0f} s"
    if t.fits:
        r = t.plan.roofline
        text += (f", fits; roofline {r.step_s * 1e3:.1f} ms ({r.bound}, collectives counted), {r.tokens_per_s:,.0f} "
                 f"tok/s per chip, MFU <= {r.mfu:.1%}")
        text += f" ({t.error.split(':')[0]})" if t.error else ""
    else:
        text += ", does not fit"
    return text


def format_search(tried: list[Tried], tpu: str, num_slices: int, hbm_gib: float = 0.0, flag: str = "tpu",
                  num_devices: int = 0) -> str:
    """The ranking as a table and the best's commands; `flag`="gpu" for a search over GPUs (--gpu=`tpu`
    --num_devices=`num_devices`)."""
    fitting = [t for t in tried if t.fits]
    lines = [
        "| rank | scan | mesh | remat | per-chip batch | peak GiB | step >= ms | tok/s per chip | MFU bound | bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, t in enumerate(fitting, 1):
        c, r, p = t.candidate, t.plan.roofline, t.plan
        lines.append(f"| {i} | {c.scan} | {c.mesh} | {c.remat} | {p.micro_batch_per_chip} x {c.grad_accum_steps} | "
                     f"{p.peak_bytes / GIB:.2f} | {r.step_s * 1e3:.1f} | {r.tokens_per_s:,.0f} | {r.mfu:.1%} | {r.bound}"
                     f"{', FLOPs not counted' if t.error else ''}{'' if p.step_is_exact else ', a lower bound'} |")
    if not fitting:
        smallest = min((t for t in tried if t.plan), key=lambda t: t.plan.peak_bytes, default=None)
        refused = min((t for t in tried if t.over_gib), key=lambda t: t.over_gib, default=None)
        over = f"; the smallest peak was {smallest.plan.peak_bytes / GIB:.2f} GiB ({_describe(smallest, None)})" \
            if smallest else f"; the closest was {_describe(refused, None)}" if refused else ""
        return "\n".join([f"Nothing tried fits on {tpu}{over}. Try a larger slice or a smaller global batch."])
    best = fitting[0]
    slices = f" --num_slices={num_slices}" if num_slices > 1 else ""
    slices += f" --num_devices={num_devices}" if num_devices else ""
    hbm = f" --hbm_gib={hbm_gib:g}" if hbm_gib else ""
    lines += ["", f"{len(fitting)} of {len(tried)} configurations tried fit; the best:", "",
              f"python -m bert_jax.plan --config=CONFIG --{flag}={tpu}{slices}{hbm} {best.candidate.flags()}",
              f"python -m bert_jax.commands.pretrain --config=CONFIG --workdir=DIR {best.candidate.flags()}"]
    return "\n".join(lines)


def mesh_name(config) -> str:
    shape = tuple(config.mesh.shape)
    if config.mesh.get("context", 1) > 1:
        return f"{'ring' if config.mesh.get('context_attention') == 'ring' else 'cp'}{config.mesh.context}"
    if shape[1] == 1 and shape[2] == 1:
        return "dp"
    if shape[2] == 1:
        return "fsdp"
    return f"tp{shape[2]}"
