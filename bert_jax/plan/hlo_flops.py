"""The matmul FLOPs of a program, read from its HLO with every loop's trips counted.

XLA's GPU compiler, compiling for a card this host does not have, gives no `cost_analysis()` (None). The
program's FLOPs are almost all in its dots, and the dots are plain in the unoptimised HLO (`lowered.as_text(
dialect="hlo")`, before the compiler turns them into cuBLAS calls or Triton fusions): each `dot` does
2 x (elements of its result) x (the product of its contracted dimensions). A while loop's body counts its trip
count times (the annotated count, else `counter < N` read from the loop, as bert_jax/plan/hlo_traffic.py reads
it), a call once, a conditional its largest branch. Rematerialised layers are in that HLO as the program wrote
them, so their dots count. Elementwise work (softmax, norms, the optimizer) is not counted: a few percent of a
BERT step. A kernel the HLO calls by name (cuDNN's fused attention, a Pallas kernel) is invisible here and is added
by the planner from the formula.
"""
from __future__ import annotations

import math
import re

from bert_jax.plan.hlo_traffic import _ARRAY

# Unoptimised HLO as jax prints it (`lowered.compiler_ir("hlo").as_hlo_text()`): names with or without `%`,
# computation headers with or without their signature.
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+)\s.*\{\s*$|^(ENTRY )?%?([\w.\-]+) \{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")


def _dims(type_text: str) -> list[int]:
    match = _ARRAY.search(type_text)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def _balanced_end(text: str) -> int:
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return i + 1
    return len(text)


def _parse(hlo_text: str) -> tuple[dict[str, list[tuple]], str]:
    """{computation: [(result, type, opcode, operands, rest)]}, the entry's name."""
    computations: dict[str, list[tuple]] = {}
    entry, current = "", None
    for line in hlo_text.splitlines():
        header = _HEADER.match(line) if current is None else None
        if header and " = " not in line:
            current = header.group(2) or header.group(4)
            computations[current] = []
            entry = current if (header.group(1) or header.group(3)) else entry
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None and (match := _INSTRUCTION.match(line)):
            result, text = match.groups()
            type_end = _balanced_end(text) if text.startswith("(") else text.find(" ")
            type_text, text = text[:type_end], text[type_end:].lstrip()
            opcode, _, rest = text.partition("(")
            depth, end = 1, len(rest)
            for i, ch in enumerate(rest):
                depth += (ch == "(") - (ch == ")")
                if depth == 0:
                    end = i
                    break
            operands = [o.strip().lstrip("%").split(" ")[-1] for o in rest[:end].split(",") if o.strip()]
            computations[current].append((result, type_text, opcode, operands, rest[end:]))
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, entry


def _dot_flops(result_type: str, lhs_type: str, rest: str) -> float:
    contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", rest)
    lhs = _dims(lhs_type)
    k = math.prod(lhs[int(i)] for i in contracting.group(1).split(",") if i) if contracting and lhs else 1
    return 2.0 * math.prod(_dims(result_type)) * k


def _constants(instructions: list[tuple]) -> dict[str, int]:
    """Integer scalar constants among these instructions."""
    return {r: int(ops[0]) for r, t, opcode, ops, _ in instructions
            if opcode == "constant" and "[]" in t and ops and re.fullmatch(r"-?\d+", ops[0])}


def _trip_count(condition: list[tuple], body: list[tuple], initial: list[int | None]) -> int | None:
    """ceil((N - start) / k) for a loop whose condition is `counter < N` on a tuple element the body adds the
    constant k > 0 to, as jax's scans and fori_loops are written; None for any other loop."""
    defs = {r: (opcode, operands, rest) for r, _, opcode, operands, rest in condition}
    constants = _constants(condition + body)
    compare = defs.get(condition[-1][0]) if condition else None
    if not compare or compare[0] != "compare" or "direction=LT" not in compare[2] or len(compare[1]) != 2:
        return None
    counter, limit = defs.get(compare[1][0]), constants.get(compare[1][1])
    if not counter or counter[0] != "get-tuple-element" or limit is None:
        return None
    index = int(re.search(r"index=(\d+)", counter[2]).group(1))
    start = initial[index] if index < len(initial) else None
    body_defs = {r: (opcode, operands, rest) for r, _, opcode, operands, rest in body}
    root = body_defs.get(body[-1][0]) if body else None
    if start is None or not root or root[0] != "tuple" or index >= len(root[1]):
        return None
    step = body_defs.get(root[1][index])
    increments = [constants[x] for x in (step[1] if step and step[0] == "add" else []) if x in constants]
    if len(increments) != 1 or increments[0] <= 0:
        return None
    return max(-(-(limit - start) // increments[0]), 0)


def _flops(name: str, computations: dict[str, list[tuple]], memo: dict, unknown: list) -> float:
    if name in memo:
        return memo[name]
    memo[name] = 0.0  # a computation is not its own callee; guards a cycle
    types: dict[str, str] = {}
    constants: dict[str, int] = {}
    tuples: dict[str, list[str]] = {}
    total = 0.0
    for result, type_text, opcode, operands, rest in computations[name]:
        types[result] = type_text
        constants.update(_constants([(result, type_text, opcode, operands, rest)]))
        if opcode == "tuple":
            tuples[result] = operands
        if opcode == "dot" and operands:
            total += _dot_flops(type_text, types.get(operands[0], ""), rest)
        elif opcode == "while":
            body = re.search(r"body=%?([\w.\-]+)", rest).group(1)
            condition = re.search(r"condition=%?([\w.\-]+)", rest).group(1)
            known = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
            n = int(known.group(1)) if known else _trip_count(
                computations.get(condition, []), computations.get(body, []),
                [constants.get(x) for x in tuples.get(operands[0], [])] if operands else [])
            if n is None:
                unknown.append(body)
            total += (1 if n is None else n) * _flops(body, computations, memo, unknown)
        elif opcode in ("call", "fusion", "conditional", "async-start"):
            called = re.findall(r"%?([\w.\-]+)", (re.search(
                r"(?:to_apply|calls|branch_computations)=(\{[^}]*\}|%?[\w.\-]+)", rest) or re.search(r"()", "")).group(1))
            costs = [_flops(c, computations, memo, unknown) for c in called if c in computations]
            total += max(costs, default=0.0)
    memo[name] = total
    return total


def dot_flops(hlo_text: str) -> tuple[float, int]:
    """(FLOPs of every dot in one run of the program, loops whose trip count could not be read: their body
    counted once)."""
    computations, entry = _parse(hlo_text)
    unknown: list[str] = []
    return _flops(entry, computations, {}, unknown), len(unknown)
