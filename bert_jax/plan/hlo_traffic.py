"""The bytes a compiled TPU program moves through HBM, apart from those that stay on chip.

`cost_analysis()["bytes accessed"]` adds up every top-level instruction's operands and results
wherever they live. The TPU compiler's memory-space assignment keeps many of them in on-chip
memory (VMEM, a layout with `S(1)`): weights and activations it prefetches ahead of use, fusion
results the next fusion reads. Those bytes never cross the HBM bus, yet a roofline that divides
the compiler's total by HBM bandwidth counts them as if they did. This module reads the
optimised HLO (`compiled.as_text()`) and counts each top-level instruction's operand and
result bytes by the memory space their layout names, so the roofline divides only HBM bytes
by HBM bandwidth.

The rules: an instruction reads its operands and writes its result; a fusion is one
instruction, except that it reads only the slices it takes of an operand it only slices (a
layer's weights out of the stacked [layers, ...] buffer, through bitcasts and nested fusions) or
gathers from (an embedding lookup reads its rows, as XLA's own cost analysis counts a gather)
and writes only the update of a result that is a dynamic-update-slice of an operand (a layer's
gradient into the stacked buffer, in place, the operand not read) or a scatter into an operand (an
embedding table's gradient: a batch's rows added into it in place, the operand read and written
at the updates' size, as XLA's cost analysis counts a scatter), seeing through bitcasts and
the in-place relayouts (copy fusions aliasing their operand) the compiler puts around stacked
buffers (a scatter outside a fusion is counted alike); an allocation (the AllocateBuffer custom
call) moves nothing; a kernel's custom call reads and writes its operands and results (so a Pallas
kernel's traffic is in it); a slice, and an asynchronous copy or slice (counted once, at its start), reads what it writes from its
source; a while loop's body counts its trip count times, a call once, a conditional its
largest branch. The TPU compiler does not annotate a scanned layer loop's trip count, so it is
read from the loop itself: a condition `counter < N`, a body adding a positive constant to the
counter, and a constant start (through copies); a loop not of that form is counted once, and said.

Over both spaces this comes within 1-13 % of the compiler's own count of unrolled steps
(BERT-large with 6 layers on v5e-16: 13.93 GB against 14.04; BERT-base with 2 on v5e-4: 10.25
against 11.77), which also weighs other partial reads. The compiler's count of a scanned step
is no reference: it counts the loop's body once, and in it the whole stacked buffers. Neither
count sees an instruction re-reading operand tiles from HBM (a matmul too large for on-chip memory).
"""
from __future__ import annotations

import dataclasses
import re

_ITEMSIZE = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
             "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([0-9,]*)\](\{[^}]*\})?")
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%(\S+) = (.*)$")
# Bookkeeping that moves no data, and the second halves of asynchronous pairs (counted at the start).
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id", "replica-id",
         "copy-done", "slice-done", "all-reduce-done", "all-gather-done", "collective-permute-done", "opt-barrier",
         "send-done", "recv-done", "add-dependency"}
# Asynchronous starts return their destination beside an echo of their source: (destination, source, context)
# for a copy, ((sources), destination, context) for a slice. Only the destination is written.
_DESTINATION = {"copy-start": 0, "slice-start": 1}
_READS_WHAT_IT_WRITES = {"slice", "dynamic-slice", "slice-start"}


@dataclasses.dataclass(frozen=True)
class Traffic:
    hbm: float  # bytes read from and written to HBM (memory space 0) per step
    on_chip: float  # bytes in other memory spaces (on-chip memory, synchronisation flags)
    loops_counted_once: int = 0  # while loops without a known trip count: their body counted once
    # Trip counts of the program's innermost loops (scans holding no scan; the compiler's own loops, such as a
    # windowed einsum's, do not count): a scanned step's layer loops.
    innermost_trips: tuple[int, ...] = ()
    # Trip counts of the loops the compiler made (windowed einsums: a dot in pieces around a collective).
    compiler_loop_trips: tuple[int, ...] = ()
    launches: float = 0  # instructions that move data (kernels on a GPU), each loop's body times its trips

    @property
    def total(self) -> float:
        return self.hbm + self.on_chip

    @property
    def compiler_loops(self) -> int:
        return len(self.compiler_loop_trips)


def _array_bytes(type_text: str) -> tuple[float, float]:
    """(HBM bytes, other bytes) of every array in a shape's text."""
    hbm = other = 0.0
    for dtype, dims, layout in _ARRAY.findall(type_text):
        size = _ITEMSIZE[dtype]
        for dim in filter(None, dims.split(",")):
            size *= int(dim)
        space = re.search(r"S\((\d+)\)", layout or "")
        if space and space.group(1) != "0":
            other += size
        else:
            hbm += size
    return hbm, other


def _balanced(text: str, start: int) -> int:
    """The index just past the bracket group opening at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] in "({["
        depth -= text[i] in ")}]"
        if depth == 0:
            return i + 1
    raise ValueError(f"unbalanced brackets in HLO: {text[start:start + 80]!r}")


def _tuple_elements(type_text: str) -> list[str]:
    if not type_text.startswith("("):
        return [type_text]
    parts, depth, current = [], 0, ""
    for ch in type_text[1:-1]:
        depth += ch in "({["
        depth -= ch in ")}]"
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    return parts + ([current.strip()] if current.strip() else [])


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    """name -> instruction lines of every computation, and the entry's name."""
    computations: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        header = re.match(r"(ENTRY )?%(\S+) \(.*\{$", line)
        if current is None and header:
            current = header.group(2)
            computations[current] = [line]
            entry = current if header.group(1) else entry
        elif current is not None and line.rstrip() == "}":
            current = None
        elif current is not None:
            computations[current].append(line)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def _parameter_types(header: str) -> dict[str, str]:
    signature = header[header.index("(") + 1 : header.rindex(") ->")]
    types, i = {}, 0
    for match in re.finditer(r"([\w.\-]+): ", signature):
        if match.start() < i:
            continue
        start = match.end()
        end = _balanced(signature, start) if signature[start] == "(" else start
        while end < len(signature) and signature[end] not in ",":
            end = _balanced(signature, end) if signature[end] in "({[" else end + 1
        types[match.group(1)] = signature[start:end]
        i = end
    return types


def _instructions(lines: list[str]):
    """(result, type text, opcode, operand names, rest of the line) of each instruction line."""
    for line in lines:
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        result, rest = match.groups()
        type_end = _balanced(rest, 0) if rest.startswith("(") else rest.index(" ")
        type_text, rest = rest[:type_end], rest[type_end:].lstrip()
        opcode = rest.split("(", 1)[0]
        operands = re.findall(r"%([\w.\-]+)", rest[len(opcode) : _balanced(rest, len(opcode))])
        yield result, type_text, opcode, operands, rest


def _aliases_operand(opcode: str, rest: str) -> bool:
    """A nested fusion whose result is its first operand's buffer (a relayout the compiler does in place,
    seen around scanned layers' stacked buffers): like a bitcast, it moves no bytes of its own."""
    return opcode == "fusion" and "output_to_operand_aliasing={{}: (0, {})}" in rest


def _partial_reads(name: str, computations: dict[str, list[str]], memo: dict) -> dict[int, float]:
    """parameter number -> bytes read, for each parameter of a fused computation that it reads only
    slices of (a layer's weights out of the stacked [layers, ...] buffer), through bitcasts and
    nested fusions; a parameter read any other way is read whole and is not in the result."""
    key = ("partial", name)
    if key in memo:
        return memo[key]
    numbers, uses, types = {}, {}, {}
    for result, type_text, opcode, operands, rest in _instructions(computations[name][1:]):
        types[result] = type_text
        if opcode == "parameter":
            numbers[result] = int(re.search(r"parameter\((\d+)\)", rest).group(1))
            continue
        for position, operand in enumerate(operands):
            uses.setdefault(operand, []).append((result, type_text, opcode, position, rest))

    def read(value: str) -> float | None:
        total = 0.0
        for result, type_text, opcode, position, rest in uses.get(value, []):
            nested = re.search(r"calls=%([\w.\-]+)", rest) if opcode == "fusion" else None
            if opcode in ("slice", "dynamic-slice") and position == 0:
                total += sum(_array_bytes(type_text))
            elif opcode == "gather" and position == 0:
                total += _gathered_bytes(type_text, types.get(value, ""))
            elif (opcode == "bitcast" or _aliases_operand(opcode, rest)) and position == 0 and read(result) is not None:
                total += read(result)
            elif nested and nested.group(1) in computations and \
                    position in (partial := _partial_reads(nested.group(1), computations, memo)):
                total += partial[position]
            else:
                return None
        return total if uses.get(value) else None

    memo[key] = {number: bytes_ for value, number in numbers.items() if (bytes_ := read(value)) is not None}
    return memo[key]


def _gathered_bytes(result_type: str, operand_type: str) -> float:
    """What a gather reads of its operand: the elements it gathers, in the operand's dtype (XLA's cost analysis
    counts a gather's operand so too, HloCostAnalysis::HandleGather): an embedding lookup reads a batch's rows,
    not the table."""
    result, operand = _ARRAY.search(result_type), _ARRAY.search(operand_type)
    if not (result and operand):
        return sum(_array_bytes(operand_type))
    elements = 1
    for dim in filter(None, result.group(2).split(",")):
        elements *= int(dim)
    return float(elements * _ITEMSIZE[operand.group(1)])


def _scattered_bytes(operands: list[str], types: dict[str, str]) -> float:
    """What a scatter reads and writes of its operand: its updates' size (XLA's cost analysis counts a scatter
    so, HloCostAnalysis::HandleScatter: input, output and updates each at the updates' size, in place): an
    embedding table's gradient adds a batch's rows, it does not rewrite the table. operands: (operand, indices,
    updates), the one-operand scatter both callers take."""
    return float(sum(_array_bytes(types.get(operands[2], ""))))


def _in_place_updates(name: str, computations: dict[str, list[str]],
                      memo: dict) -> tuple[dict[int, float], dict[int, float]]:
    """({result index: bytes written}, {parameter number: bytes read}) of a fused computation's results that
    update a parameter in place: a dynamic-update-slice of it (a layer's gradient into the stacked [layers, ...]
    buffer: only the update is written, the parameter not read) or a scatter into it (an embedding table's
    gradient: the parameter read and the result written at the updates' size)."""
    key = ("in place", name)
    if key in memo:
        return memo[key]
    defs, numbers, root = {}, {}, None
    for result, type_text, opcode, operands, rest in _instructions(computations[name][1:]):
        defs[result] = (type_text, opcode, operands, rest)
        if opcode == "parameter":
            numbers[result] = int(re.search(r"parameter\((\d+)\)", rest).group(1))
    root = _root(computations[name][1:])

    def through_bitcasts(value: str) -> str:
        while value in defs and (defs[value][1] == "bitcast" or _aliases_operand(defs[value][1], defs[value][3])):
            value = defs[value][2][0]
        return value

    written, params = {}, {}
    if root in defs:
        elements = defs[root][2] if defs[root][1] == "tuple" else [root]
        for index, element in enumerate(elements):
            update = defs.get(through_bitcasts(element))
            if update and update[1] == "dynamic-update-slice":
                target = through_bitcasts(update[2][0])
                if target in numbers:
                    written[index] = sum(_array_bytes(defs[update[2][1]][0])) if update[2][1] in defs else 0.0
                    params[numbers[target]] = 0.0
            elif update and update[1] == "scatter" and len(update[2]) == 3:  # one operand: one result to update
                target = through_bitcasts(update[2][0])
                if target in numbers:
                    written[index] = _scattered_bytes(update[2], {v: d[0] for v, d in defs.items()})
                    params[numbers[target]] = written[index]
    memo[key] = (written, params)
    return memo[key]


def _root(lines: list[str]) -> str | None:
    for line in lines:
        if line.lstrip().startswith("ROOT "):
            return _INSTRUCTION.match(line).group(1)
    return None


def _scalar_constants(lines: list[str]) -> dict[str, int]:
    """Integer scalar constants of a computation, followed through copies and bitcasts."""
    values: dict[str, int] = {}
    for result, type_text, opcode, operands, rest in _instructions(lines):
        constant = re.match(r"constant\((-?\d+)\)", rest) if opcode == "constant" and "[]" in type_text else None
        if constant:
            values[result] = int(constant.group(1))
        elif opcode in ("copy", "bitcast") and operands and operands[0] in values:
            values[result] = values[operands[0]]
    return values


def _derived_trip_count(condition: str, body: str, initial: list[int | None], computations) -> int | None:
    """ceil((N - start) / k) for a loop whose condition is `counter < N` on a tuple element the body adds the
    constant k > 0 to; `initial`: the constant values of the loop's initial tuple (None where not one)."""
    defs = {r: (opcode, operands, rest) for r, _, opcode, operands, rest in _instructions(computations[condition][1:])}
    compare = defs.get(_root(computations[condition][1:]))
    if not compare or compare[0] != "compare" or "direction=LT" not in compare[2]:
        return None
    counter, limit = (defs.get(x) for x in compare[1][:2])
    limit_value = _scalar_constants(computations[condition][1:]).get(compare[1][1])
    if not counter or counter[0] != "get-tuple-element" or limit_value is None:
        return None
    index = int(re.search(r"index=(\d+)", counter[2]).group(1))
    start = initial[index] if index < len(initial) else None
    if start is None:
        return None
    body_lines = computations[body][1:]
    body_defs = {r: (opcode, operands, rest) for r, _, opcode, operands, rest in _instructions(body_lines)}
    root = body_defs.get(_root(body_lines))
    if not root or root[0] != "tuple" or index >= len(root[1]):
        return None
    step = body_defs.get(root[1][index])
    constants = _scalar_constants(body_lines)

    def reads_counter(value: str) -> bool:
        while body_defs.get(value, ("",))[0] in ("copy", "bitcast"):
            value = body_defs[value][1][0]
        return body_defs.get(value, ("",))[0] == "get-tuple-element" and f"index={index}" in body_defs[value][2]
    increments = [constants[x] for x in step[1] if x in constants] if step and step[0] == "add" else []
    if len(increments) != 1 or increments[0] <= 0 or not any(reads_counter(x) for x in step[1]):
        return None
    return max(-(-(limit_value - start) // increments[0]), 0)


def _program_loop(opcode: str, rest: str) -> bool:
    """A loop the program wrote (a scan or fori_loop: its op_name ends in /while), not one the compiler made
    (a windowed einsum's, named for its dot)."""
    return opcode == "while" and re.search(r'op_name="[^"]*/while"', rest) is not None


def _has_program_loop(name: str, computations, memo: dict) -> bool:
    key = ("has loop", name)
    if key not in memo:
        memo[key] = False  # a computation is not its own callee; guards a cycle
        memo[key] = any(_program_loop(opcode, rest) or any(
            _has_program_loop(c, computations, memo)
            for c in re.findall(r"(?:to_apply|branch_computations|calls|body)=\{?%([\w.\-]+)", rest) if c in computations)
            for _, _, opcode, _, rest in _instructions(computations[name][1:]))
    return memo[key]


def _count(name: str, computations: dict[str, list[str]], memo: dict, unknown: list,
           innermost: list, made: list) -> tuple[float, float]:
    if name in memo:
        return memo[name]
    lines = computations[name]
    types = _parameter_types(lines[0])
    starts = _scalar_constants(lines[1:])
    tuples: dict[str, list[str]] = {}
    hbm = other = 0.0
    items = memo.setdefault(("items", name), [])  # what `breakdown` walks: (rest, hbm, other) or (callee, times)
    for result, type_text, opcode, operands, rest in _instructions(lines[1:]):
        if items and items[-1][0] == "open":  # the previous instruction's bytes, now that they are added up
            _, rest0, hbm0, other0 = items.pop()
            items.append(("kernel", rest0, hbm - hbm0, other - other0))
        if opcode == "tuple":
            tuples[result] = operands
        if opcode == "get-tuple-element":
            index = int(re.search(r"index=(\d+)", rest).group(1))
            source = types.get(operands[0], type_text)
            types[result] = _tuple_elements(source)[index] if source.startswith("(") else type_text
            continue
        types[result] = type_text
        if opcode in _FREE or 'custom_call_target="AllocateBuffer"' in rest:  # an allocation moves no data
            continue
        if opcode == "while":
            body = re.search(r"body=%([\w.\-]+)", rest).group(1)
            condition = re.search(r"condition=%([\w.\-]+)", rest).group(1)
            known = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
            body_hbm, body_other = _count(body, computations, memo, unknown, innermost, made)
            n = int(known.group(1)) if known else None
            if n is None:
                initial = [starts.get(x) for x in tuples.get(operands[0], [])]
                n = _derived_trip_count(condition, body, initial, computations)
            if n is None:
                unknown.append(body)
            elif _program_loop(opcode, rest) and not _has_program_loop(body, computations, memo):
                innermost.append(n)
            n = 1 if n is None else n
            if not _program_loop(opcode, rest):
                made.append(n)
            hbm, other = hbm + n * body_hbm, other + n * body_other
            items.append(("loop", body, n, _op_name(rest)))
            continue
        if opcode in ("call", "conditional"):
            called = re.findall(r"%([\w.\-]+)", (re.search(r"(?:to_apply|branch_computations)=(\{[^}]*\}|%[\w.\-]+)",
                                                           rest) or re.search(r"()", "")).group(1))
            costs = [_count(c, computations, memo, unknown, innermost, made) for c in called if c in computations]
            if costs:
                best = max(costs, key=sum)
                hbm, other = hbm + best[0], other + best[1]
                items.append(("loop", [c for c in called if c in computations][costs.index(best)], 1, _op_name(rest)))
            continue
        items.append(("open", rest, hbm, other))
        written = _tuple_elements(type_text)[_DESTINATION[opcode]] if opcode in _DESTINATION else type_text
        fused = re.search(r"calls=%([\w.\-]+)", rest) if opcode == "fusion" else None
        fused = fused.group(1) if fused and fused.group(1) in computations else None
        updates, updated = _in_place_updates(fused, computations, memo) if fused else ({}, {})
        if opcode == "scatter" and len(operands) == 3:
            updates = updated = {0: _scattered_bytes(operands, types)}
        for index, element in enumerate(_tuple_elements(written) if written.startswith("(") else [written]):
            h, o = _array_bytes(element)
            if index in updates:  # updated in place: only the update is written
                h, o = (updates[index], 0.0) if h else (0.0, updates[index])
            hbm, other = hbm + h, other + o
        if opcode in _READS_WHAT_IT_WRITES:  # as many bytes as it writes, from where its source lives
            source_hbm, _ = _array_bytes(types.get(operands[0], ""))
            hbm, other = (hbm + h + o, other) if source_hbm else (hbm, other + h + o)
            continue
        partial = _partial_reads(fused, computations, memo) if fused else {}
        if opcode == "gather":
            partial = {0: _gathered_bytes(type_text, types.get(operands[0], ""))}
        partial = {**partial, **updated}  # a buffer updated in place: read at the update's size (a scatter's) or not
        for position, operand in enumerate(operands):
            h, o = _array_bytes(types.get(operand, ""))
            if position in partial:  # only slices of it are read (or rows gathered), from where it lives
                h, o = (partial[position], 0.0) if h else (0.0, partial[position])
            hbm, other = hbm + h, other + o
    if items and items[-1][0] == "open":
        _, rest0, hbm0, other0 = items.pop()
        items.append(("kernel", rest0, hbm - hbm0, other - other0))
    memo[name] = (hbm, other)
    return memo[name]


def traffic(hlo_text: str) -> Traffic:
    """HBM and on-chip bytes of one run of a compiled program (`compiled.as_text()` of a TPU compile)."""
    computations, entry = _computations(hlo_text)
    unknown: list[str] = []
    innermost: list[int] = []
    made: list[int] = []
    memo: dict = {}
    hbm, other = _count(entry, computations, memo, unknown, innermost, made)
    launches = sum(kernels for kernels, _, _ in _walk(entry, memo, computations, lambda *_: "").values())
    return Traffic(hbm=hbm, on_chip=other, loops_counted_once=len(unknown), innermost_trips=tuple(innermost),
                   compiler_loop_trips=tuple(made), launches=launches)


def computation_trips(hlo_text: str) -> dict[str, float]:
    """{computation: its runs in one run of the program} for the entry and every loop body, call and conditional
    branch `traffic` walks (each loop's body times its trips; fusions run with the instruction that calls them and
    are not listed): where bert_jax/plan/collectives.py finds how often each collective runs."""
    computations, entry = _computations(hlo_text)
    memo: dict = {}
    _count(entry, computations, memo, [], [], [])
    runs: dict[str, float] = {}

    def walk(name: str, times: float) -> None:
        runs[name] = runs.get(name, 0.0) + times
        for item in memo.get(("items", name), []):
            if item[0] == "loop":
                walk(item[1], times * item[2])
    walk(entry, 1.0)
    return runs


def breakdown(hlo_text: str, part_of) -> dict[str, tuple[float, float, float]]:
    """{part: (instructions that move data, HBM bytes, other bytes)} of one run of a compiled program, each loop's
    body times its trips, as `traffic` counts them. `part_of(opcode, op_name)` names an instruction's part from
    the JAX op that made it: its own metadata's op_name, else (a fusion) the first in its fused computation, else
    its loop's."""
    computations, entry = _computations(hlo_text)
    memo: dict = {}
    _count(entry, computations, memo, [], [], [])
    return _walk(entry, memo, computations, part_of)


def _op_name(rest: str) -> str:
    found = re.search(r'op_name="([^"]*)"', rest)
    return found.group(1) if found else ""


def _walk(name: str, memo: dict, computations, part_of, times: float = 1.0, out: dict | None = None,
          context: str = "") -> dict:
    out = {} if out is None else out
    for item in memo.get(("items", name), []):
        if item[0] == "loop":
            _walk(item[1], memo, computations, part_of, times * item[2], out, item[3] or context)
        elif item[0] == "kernel":
            rest = item[1]
            op_name = _op_name(rest)
            fused = re.search(r"calls=%([\w.\-]+)", rest)
            if not op_name and fused and fused.group(1) in computations:
                op_name = next(filter(None, map(_op_name, computations[fused.group(1)][1:])), "")
            kernels, hbm, other = out.get(part := part_of(rest.split("(", 1)[0], op_name or context), (0.0, 0.0, 0.0))
            out[part] = (kernels + times, hbm + times * item[2], other + times * item[3])
    return out
