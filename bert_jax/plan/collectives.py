"""Every collective of a compiled step: what it is, how many bytes each device sends per step, over which link.

Read from the optimised program (`compiled.as_text()`), as hlo_traffic reads its bytes: each all-gather,
reduce-scatter, all-reduce, all-to-all and collective-permute, synchronous or split into asynchronous start/done
pairs, counted once per run of the computation it sits in, times that computation's runs per step (a loop's body
times its trips, hlo_traffic.computation_trips). The forms the compilers write:

- GPU (XLA's GPU compiler): `all-gather-start` ... `-done` pairs (the start counted; its backend config says
  `"is_sync"`: a collective left on the compute stream cannot overlap), or plain synchronous ops.
- TPU: plain ops (synchronous: scheduled in line), or inside `async-collective-start`/`-done` fusions and the
  `async_collective_fusion`s that run a collective beside a computation (asynchronous); the three carry the same
  channel_id and count once. An `all-reduce-scatter` fusion (an all-reduce and the slice of it this chip keeps) is
  the compiler's reduce-scatter. Across slices the TPU compiler compiles one slice's program and sends the DCN part
  of a collective as a `send` to the megascale runtime (`_xla_megascale_transfer_type`): its bytes cross DCN.
- CPU (simulated devices): plain ops; no link, bytes only.

The payload of one execution, per device: the all-gather's result (what each device ends with), the others'
operand (a reduce-scatter's is its result times the group). A ring algorithm over n devices sends, per device:

    all-reduce 2(n-1)/n x payload    all-gather, reduce-scatter, all-to-all (n-1)/n x payload
    collective-permute 1 x payload

A group spanning s slices (or nodes) of k = n/s devices each is counted as a two-level collective, the least any
algorithm sends between them: within, the factor over k x payload; between, the factor over s x payload / k (each
device carries its 1/k share across), an all-to-all's (s-1)/s x payload, and a permute's whole payload when a pair
crosses. Which devices a group holds comes from its replica groups (explicit, iota or mesh-axis form) and the
device each partition runs on (`domain_of`).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

import numpy as np

from bert_jax.plan import hlo_traffic

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_OPCODE = re.compile(r"^(all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)(-start)?$")
_MEGASCALE_KIND = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather", "REDUCE_SCATTER": "reduce-scatter",
                   "ALL_TO_ALL": "all-to-all"}


def ring_factor(op: str, n: int) -> float:
    """Bytes each device sends per payload byte in a ring collective over n devices."""
    if n <= 1:
        return 0.0
    if op == "all-reduce":
        return 2 * (n - 1) / n
    if op == "collective-permute":
        return 1.0
    return (n - 1) / n


FACTOR_TEXT = {"all-reduce": "2(n-1)/n", "all-gather": "(n-1)/n", "reduce-scatter": "(n-1)/n",
               "all-to-all": "(n-1)/n", "collective-permute": "1"}


@dataclasses.dataclass(frozen=True)
class Collective:
    op: str  # one of KINDS
    payload: float  # bytes per device per execution (the all-gather's result, the others' operand)
    group_size: int  # n: devices in each group
    domains: int  # s: slices or nodes one group spans (1: all within one)
    asynchronous: bool  # the compiler split it into a start and a done, or runs it beside a computation
    times: float  # executions per step
    op_name: str  # the JAX op that made it (metadata), or the instruction's name
    crosses: bool = False  # a permute whose pairs cross slices or nodes; a megascale send (all between)
    group: tuple[int, ...] = ()  # one of its groups, as partition ids (mesh_axes names the axes it spans)

    @property
    def within_bytes(self) -> float:
        """Bytes each device sends per step over the link within a slice or node."""
        if self.op == "collective-permute":
            return 0.0 if self.crosses else self.payload * self.times
        if self.crosses:
            return 0.0
        k = self.group_size // max(self.domains, 1)
        return ring_factor(self.op, k) * self.payload * self.times

    @property
    def between_bytes(self) -> float:
        """Bytes each device sends per step over the link between slices or nodes."""
        if self.op == "collective-permute":
            return self.payload * self.times if self.crosses else 0.0
        if self.crosses:  # a megascale send: the payload is already this chip's share
            return ring_factor(self.op, self.domains) * self.payload * self.times
        s = self.domains
        if s <= 1:
            return 0.0
        if self.op == "all-to-all":
            return (s - 1) / s * self.payload * self.times
        return ring_factor(self.op, s) * self.payload / (self.group_size // s) * self.times


def mesh_axes(group: Sequence[int], mesh_shape: dict[str, int]) -> tuple[str, ...]:
    """The mesh axes a group of partitions spans (partition p runs on the mesh's p-th device, in axis order):
    those along which its members' coordinates differ, e.g. ('context',) for the keys' all-gather."""
    sizes = tuple(mesh_shape.values())
    if not group or math.prod(sizes) <= max(group):
        return ()
    coords = np.array(np.unravel_index(np.asarray(group), sizes))
    return tuple(name for name, row in zip(mesh_shape, coords) if len(set(row.tolist())) > 1)


def _type_bytes(type_text: str) -> float:
    return sum(hlo_traffic._array_bytes(type_text))


def _payload(opcode: str, type_text: str, n: int) -> float:
    """Bytes per device of one execution from the instruction's result type (module docstring)."""
    op = opcode.removesuffix("-start")
    if opcode.endswith("-start") and op != "all-reduce":  # ((operands), results[, context...])
        type_text = hlo_traffic._tuple_elements(type_text)[1]
    result = _type_bytes(type_text)
    return result * n if op == "reduce-scatter" else result


def _groups(rest: str, partitions: int) -> list[list[int]]:
    """The replica groups of a collective, as partition ids: explicit ({{0,1},{2,3}}), iota ([2,4]<=[4,2]T(1,0))
    or mesh-axis (mesh['axis_0'=4,'axis_1'=2] {'axis_0'}); all partitions when none are given."""
    explicit = re.search(r"replica_groups=\{((?:\{[0-9,]*\},?)*)\}", rest)
    if explicit:
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([0-9,]*)\}", explicit.group(1))]
        return [g for g in groups if g] or [list(range(partitions))]
    iota = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", rest)
    if iota:
        shape, dims = [int(x) for x in iota.group(1).split(",")], [int(x) for x in iota.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
        return ids.reshape(shape).tolist()
    mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", rest)
    if mesh:
        axes = re.findall(r"'([\w.]+)'=(\d+)", mesh.group(1))
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        grouped = re.findall(r"'([\w.]+)'", mesh.group(2))
        if all(g in names for g in grouped):
            ids = np.arange(math.prod(sizes)).reshape(sizes)
            inside = [names.index(g) for g in grouped]
            outside = [i for i in range(len(names)) if i not in inside]
            ids = ids.transpose(outside + inside)
            return ids.reshape(-1, math.prod(sizes[i] for i in inside)).tolist()
    return [list(range(partitions))]


def _pairs(rest: str) -> list[tuple[str, str]]:
    """A permute's source_target_pairs, as partition ids (strings)."""
    return re.findall(r"\{(\d+),(\d+)\}", (re.search(r"source_target_pairs=\{(.*?)\}\}", rest) or
                                          re.search(r"()", "")).group(1) + "}")


def _permute_groups(rest: str) -> list[list[int]]:
    """The devices a permute's pairs link, as groups (a ring or a chain over one mesh axis: that axis's groups)."""
    group_of: dict[int, set[int]] = {}
    for a, b in _pairs(rest):
        joined = group_of.get(int(a), {int(a)}) | group_of.get(int(b), {int(b)})
        for p in joined:
            group_of[p] = joined
    return [sorted(g) for g in {id(g): g for g in group_of.values()}.values()]


def _pairs_cross(rest: str, domain_of: Sequence[int]) -> bool:
    pairs = _pairs(rest)
    return any(domain_of[int(a)] != domain_of[int(b)] for a, b in pairs
               if int(a) < len(domain_of) and int(b) < len(domain_of))


def _called(rest: str) -> list[str]:
    return re.findall(r"calls=%([\w.\-]+)", rest)


def _is_sync(rest: str) -> bool | None:
    flag = re.search(r'"is_sync":(true|false)', rest)
    return None if flag is None else flag.group(1) == "true"


def _instructions_below(name: str, computations: dict, seen: set) -> list[tuple[str, str, str, str, bool]]:
    """(result, type, opcode, rest, inside an asynchronous TPU fusion) of `name`'s instructions and of every
    computation its instructions call (fusions, async wrappers), not loops: those run by their own trips. The
    all-reduce inside a TPU `all-reduce-scatter` fusion comes back as opcode `all-reduce-scatter`."""
    out = []
    for result, type_text, opcode, _, rest in hlo_traffic._instructions(computations[name][1:]):
        out.append((result, type_text, opcode, rest, False))
        if opcode in ("while", "call", "conditional"):
            continue
        for callee in _called(rest):
            if callee in computations and callee not in seen:
                seen.add(callee)
                text = "\n".join(computations[callee])
                asynchronous = (callee.startswith("async_collective_fusion") or "AsyncCollectiveStart" in text
                                or "AsyncCollectiveDone" in text)
                scatter = callee.startswith("all-reduce-scatter")
                out += [(r, t, "all-reduce-scatter" if scatter and o == "all-reduce" else o, x, a or asynchronous)
                        for r, t, o, x, a in _instructions_below(callee, computations, seen)]
    return out


def collectives(hlo_text: str, domain_of: Sequence[int] | None = None, num_slices: int = 1) -> list[Collective]:
    """Every collective of one run of a compiled program (module docstring). domain_of[p]: the slice or node that
    partition p runs on (None: one for all); num_slices: the slices a TPU program's megascale sends join."""
    computations, _ = hlo_traffic._computations(hlo_text)
    trips = hlo_traffic.computation_trips(hlo_text)
    partitions = int((re.search(r"num_partitions=(\d+)", hlo_text) or re.search(r"()", "1")).group(1) or 1)
    domain_of = list(domain_of) if domain_of is not None else [0] * partitions
    found: list[Collective] = []
    for name, times in trips.items():
        seen_channels: dict[str, int] = {}
        for result, type_text, opcode, rest, in_async_fusion in _instructions_below(name, computations, {name}):
            channel = (re.search(r"channel_id=(\d+)", rest) or re.search(r"()", "")).group(1) or result
            op_name = (re.search(r'op_name="([^"]*)"', rest) or re.search(r"()", "")).group(1) or result
            megascale = re.search(r'_xla_megascale_transfer_type="(\w+)"', rest)
            if opcode == "send" and megascale:
                key = (re.search(r'_xla_host_transfer_rendezvous="([^"]*)"', rest) or megascale).group(1)
                if key in seen_channels:
                    continue
                seen_channels[key] = len(found)
                payload = _type_bytes(hlo_traffic._tuple_elements(type_text)[0])
                found.append(Collective(_MEGASCALE_KIND.get(megascale.group(1), "all-reduce"), payload, num_slices,
                                        num_slices, True, times, op_name, crosses=True))
                continue
            kind_match = _OPCODE.match(opcode)
            if not (kind_match or opcode == "all-reduce-scatter"):
                continue
            op = "reduce-scatter" if opcode == "all-reduce-scatter" else kind_match.group(1)
            groups = (op == "collective-permute" and _permute_groups(rest)) or _groups(rest, partitions)
            n = max(len(g) for g in groups)
            domains = max(len({domain_of[p] for p in g if p < len(domain_of)}) for g in groups)
            sync = _is_sync(rest)
            asynchronous = in_async_fusion or (opcode.endswith("-start") and sync is not True)
            if op == "collective-permute":  # shard_map's ppermutes may all carry one channel id: each is its own
                channel = f"{channel}/{result}"
            if channel in seen_channels:  # the same collective again (a TPU start, done and continuation)
                index = seen_channels[channel]
                found[index] = dataclasses.replace(found[index], asynchronous=found[index].asynchronous or asynchronous)
                continue
            seen_channels[channel] = len(found)
            crosses = op == "collective-permute" and _pairs_cross(rest, domain_of)
            payload = _type_bytes(type_text) if opcode == "all-reduce-scatter" else _payload(opcode, type_text, n)
            found.append(Collective(op, payload, n, domains, asynchronous, times, op_name, crosses=crosses,
                                    group=tuple(max(groups, key=len))))
    return found
