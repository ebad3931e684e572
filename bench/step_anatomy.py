"""Where a train step's time goes, read from what XLA compiles: kernels and bytes by part, step against forward.

    python bench/step_anatomy.py --shape=128:256                   # BERT-base (seq 128, batch 256)
    python bench/step_anatomy.py --shape=128:256 --set=train.dropout_prng=rbg --hlo_dir=/tmp/hlo
    python bench/step_anatomy.py --from_hlo=/tmp/hlo               # re-read dumped HLO, no compile
    python bench/step_anatomy.py --gpu=h100                        # XLA's GPU compiler, on any host (`gpu` extra)
    python bench/step_anatomy.py --gpu=h100 --shapes=base:128:256 --set=train.dropout_prng=rbg

--gpu=CARD compiles with XLA's GPU compiler for that card (bert_jax/plan/gpu_cards.py; no GPU needed) the four
shapes of docs/results/gpu.md (--shapes: base = configs/base.py, large = it at BERT-large's sizes, or a config
file's name in configs/, each with its own family, dropout and remat) and counts, with
bert_jax/plan/hlo_traffic.py (the planner's counter: each loop's body times its trips, a fusion charged only
the slices it reads and the updates it writes), the kernel launches and HBM bytes of the eval forward and of the
train step's forward, backward and update (by op_name: `transpose(jvp(...))` is the backward, `jvp(...)` the
forward, the rest the update: clip, AdamW, the NaN guard, the step's RNG), and the dropout RNG, LayerNorm,
attention and layout parts across them.

It compiles `configs/base.py`'s train step and eval forward for this host's device (a GPU
where one is present), keeps their optimised HLO (`--hlo_dir`), and counts each top-level
instruction once per execution (a scanned layer's body times its trip count): the number of
kernels (fusions, custom calls, copies, dynamic slices; bookkeeping such as tuples and
bitcasts is free) and the bytes each moves (its operands read plus its result written,
the first-order traffic; a fusion that reads a slice of its operand is charged the whole
operand, so loop bodies over stacked weights read high). Instructions are put in parts by
the JAX op that made them (the HLO's `op_name`):

  forward     jvp(...) outside the parts below          backward  transpose(jvp(...)) likewise
  dropout RNG the bits and masks (threefry, bernoulli)  norms     LayerNorm, forward and backward
  attention   softmax, scores and context               layout    copies, transposes, (dynamic) slices
  update      clip, AdamW, the NaN guard (no jvp in its name; also the few top-level copies without a name)

On a CPU, JAX's threefry is a 5-trip loop over [batch, length, hidden] u32 arrays per draw;
on a GPU it is one custom-call kernel (jax_threefry_gpu_kernel), so RNG counts from a CPU
compile overstate it there (docs/results/gpu.md).
"""
import collections
import json
import os
import re
import time

from absl import app, flags

_SHAPE = flags.DEFINE_string("shape", "128:256", "seq:batch of configs/base.py (BERT-base).")
_SET = flags.DEFINE_list("set", [], "key=value config overrides, e.g. train.flat_moments=true.")
_HLO_DIR = flags.DEFINE_string("hlo_dir", "", "Write train.hlo and forward.hlo here.")
_FROM_HLO = flags.DEFINE_string("from_hlo", "", "Read train.hlo and forward.hlo from here instead of compiling.")
_JSON = flags.DEFINE_string("json", "", "Write the counts to this file.")
_GPU = flags.DEFINE_string("gpu", "", "Compile with XLA's GPU compiler for this card (h100, h200, a100_80gb, "
                           "a100_40gb) instead of for this host; counts by bert_jax/plan/hlo_traffic.py.")
_VARIANTS = flags.DEFINE_multi_string("variant", [], "With --gpu: NAME=key=value[;key=value...]: the first shape's "
                                      "train step again with these overrides (after --set), one row each (A/B: "
                                      "bytes are deterministic, no timing).")
_SHAPES = flags.DEFINE_list("shapes", ["base:128:256", "large:512:32", "modernbert_base:1024:32",
                                       "deberta_v3_base:512:32"],
                            "With --gpu: model:seq:batch, model base, large or a config file's name in configs/.")

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\((.*)$")
_ARRAY = re.compile(r"\b(pred|s8|u8|s16|u16|bf16|f16|s32|u32|f32|s64|u64|f64)\[([0-9,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8}
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "opt-barrier"}
_LAYOUT = {"copy", "transpose", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "reshape",
           "broadcast"}
PARTS = ("forward", "backward", "dropout RNG", "norms", "attention", "layout", "update")


def _bytes(type_text: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(type_text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _ITEMSIZE[dtype]
    return total


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    comps, name, entry = {}, None, None
    for line in text.splitlines():
        header = re.match(r"^(ENTRY )?%(\S+) .*\{\s*$", line)
        if header:
            name = header.group(2)
            comps[name] = [line]
            if header.group(1):
                entry = name
        elif name is not None:
            comps[name].append(line)
            if line.startswith("}"):
                name = None
    return comps, entry


def _first_op_name(lines: list[str]) -> str:
    found = next((m for m in map(re.compile(r'op_name="([^"]*)"').search, lines) if m), None)
    return found.group(1) if found else ""


def _fused_access(lines: list[str]) -> tuple[dict[int, int], tuple[int, int] | None]:
    """In a fused computation: {parameter index: bytes} of the parameters only dynamic-sliced (read: the slice),
    and (parameter index, update bytes) when the root dynamic-update-slices a parameter (written: the update)."""
    types, params, users, root = {}, {}, collections.defaultdict(list), None
    for line in lines[1:]:
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        inst, result_type, opcode, rest = m.groups()
        types[inst] = result_type
        if opcode == "parameter":
            params[inst] = int(re.match(r"(\d+)", rest).group(1))
        for operand in re.findall(r"%([^\s,)]+)", rest.split(")")[0]):
            users[operand].append((inst, opcode, result_type))
        if line.lstrip().startswith("ROOT"):
            root = (inst, opcode, rest)

    def through_bitcasts(name):
        out = []
        for user, opcode, result_type in users[name]:
            out += through_bitcasts(user) if opcode == "bitcast" else [(user, opcode, result_type)]
        return out

    sliced = {}
    for name, index in params.items():
        uses = through_bitcasts(name)
        if uses and all(op == "dynamic-slice" for _, op, _ in uses):
            sliced[index] = sum(_bytes(t) for _, _, t in uses)
    update = None
    if root and root[1] == "dynamic-update-slice":
        buffer, new = re.findall(r"%([^\s,)]+)", root[2])[:2]
        while buffer not in params and buffer in types:  # through a bitcast of the parameter
            line = next(l for l in lines if re.match(rf"^\s*(?:ROOT )?%{re.escape(buffer)} = ", l))
            if " bitcast(" not in line:
                break
            buffer = re.search(r"bitcast\(%([^\s,)]+)", line).group(1)
        if buffer in params:
            update = (params[buffer], 2 * _bytes(types.get(new, "")))  # read-modify-write of the slice
    return sliced, update


def part_of(opcode: str, op_name: str) -> str:
    """The part of the step an instruction belongs to, from the JAX op that made it."""
    if any(s in op_name for s in ("threefry", "_bernoulli", "_uniform", "random_bits", "rng_bit_generator")):
        return "dropout RNG"
    if "jvp(" not in op_name and "eval_step" not in op_name:
        return "update"
    if "norm" in op_name.lower():
        return "norms"
    if any(s in op_name for s in ("attend", "softmax", "Attend")):
        return "attention"
    if opcode in _LAYOUT:
        return "layout"
    return "backward" if "transpose(" in op_name else "forward"


def anatomy(hlo_text: str) -> dict:
    """{part: {"kernels": n, "bytes": b}} per execution of the program, and the loops' trip counts."""
    comps, entry = _computations(hlo_text)
    parts = {p: collections.Counter() for p in PARTS}
    opcodes = collections.Counter()

    def walk(name: str, times: int, context: str):
        types = {}
        for line in comps[name][1:]:
            m = _INSTRUCTION.match(line)
            if not m:
                continue
            inst, result_type, opcode, rest = m.groups()
            types[inst] = result_type
            if opcode == "while":
                trips = re.search(r'known_trip_count":\{"n":"(\d+)"', rest)
                body = re.search(r"body=%([^,\s]+)", rest).group(1)
                loop_name = re.search(r'op_name="([^"]*)"', rest)
                walk(body, times * (int(trips.group(1)) if trips else 1), loop_name.group(1) if loop_name else context)
                continue
            if opcode in ("call", "conditional"):
                for callee in re.findall(r"(?:to_apply|branch_computations=\{?|true_computation|false_computation)"
                                         r"=?%([^,\s}]+)", rest):
                    walk(callee, times, context)
                continue
            if opcode in _FREE:
                continue
            operands = re.findall(r"%([^\s,)]+)", rest.split("),")[0] if ")," in rest else rest)
            sizes = [_bytes(types.get(o, "")) for o in operands]
            written = _bytes(result_type)
            op_name = re.search(r'op_name="([^"]*)"', rest)
            op_name = op_name.group(1) if op_name else ""
            called = re.search(r"calls=%([^,\s]+)", rest)
            if called:  # a fusion: what it slices or updates in place of its operands, and where it came from
                sliced, update = _fused_access(comps[called.group(1)])
                sizes = [sliced.get(i, size) for i, size in enumerate(sizes)]
                if update is not None:  # the buffer operand is neither read nor rewritten, only the update
                    sizes[update[0]], written = 0, update[1]
                op_name = op_name or _first_op_name(comps[called.group(1)])
            op_name = op_name or context  # an instruction of a loop's body without its own: the loop's
            moved = written + sum(sizes)
            part = part_of(opcode, op_name)
            parts[part]["kernels"] += times
            parts[part]["bytes"] += times * moved
            opcodes[opcode] += times

    walk(entry, 1, "")
    return {"parts": {p: dict(c) for p, c in parts.items() if c},
            "kernels": sum(c["kernels"] for c in parts.values()), "bytes": sum(c["bytes"] for c in parts.values()),
            "opcodes": dict(opcodes.most_common(12))}


def compile_hlo(shape: str, overrides: list[str]) -> dict[str, str]:
    import flax.linen as nn
    import jax

    import bert_jax.configs.base as base
    from bert_jax.parallel.mesh import make_mesh
    from bert_jax.train.program import build_program
    from data_pipelines.loader import pipeline

    seq, batch = (int(x) for x in shape.split(":"))
    c = base.get_config()
    c.train.global_batch_size = batch
    c.data.max_seq_length, c.data.max_predictions_per_seq = seq, -(-int(0.15 * seq) // 4) * 4
    for assignment in overrides:
        key, _, text = assignment.partition("=")
        *parents, leaf = key.split(".")
        node = c
        for p in parents:
            node = node[p]
        old = node[leaf]
        node[leaf] = (text.lower() == "true") if isinstance(old, bool) else type(old)(text)
    program = build_program(c, make_mesh(c.mesh, jax.devices()[:1]))
    spec = {k: jax.ShapeDtypeStruct(s, d, sharding=program.data_sharding)
            for k, (s, d) in pipeline.batch_spec(c.data, batch).items()}
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        start = time.perf_counter()
        train = program.train_step.lower(program.abstract_state, spec, None).compile()
        print(f"train step compiled in {time.perf_counter() - start:.0f} s", flush=True)
        forward = program.eval_step.lower(program.abstract_state.params, spec, 0, None).compile()
    return {"train": train.as_text(), "forward": forward.as_text()}


def print_anatomy(name: str, a: dict, reference: dict | None = None) -> None:
    print(f"{name}: {a['kernels']} kernels, {a['bytes'] / 1e9:.1f} GB moved (first order)"
          + (f"; {a['kernels'] / reference['kernels']:.1f}x the forward's kernels, "
             f"{a['bytes'] / reference['bytes']:.1f}x its bytes" if reference else ""))
    for part, c in a["parts"].items():
        print(f"  {part:12} {c['kernels']:6d} kernels {c['bytes'] / 1e9:8.1f} GB")
    print(f"  top opcodes: {a['opcodes']}")


LARGE = dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096)  # BERT-large on configs/base.py


def shape_config(spec: str, overrides: list[str]):
    """configs/base.py (base, large) or configs/<name>.py at (seq, batch), 15 % (the config's rate) predicted."""
    import importlib

    name, seq, batch = spec.split(":")
    c = importlib.import_module(f"bert_jax.configs.{'base' if name in ('base', 'large') else name}").get_config()
    if name == "large":
        c.model.update(**LARGE)
    if "stages" in c.train:
        c.train.stages = ()
    c.train.global_batch_size, c.data.max_seq_length = int(batch), int(seq)
    c.data.max_predictions_per_seq = -(-int(c.data.get("mask_rate", 0.15) * int(seq)) // 4) * 4
    for assignment in overrides:
        key, _, text = assignment.partition("=")
        *parents, leaf = key.split(".")
        node = c
        for p in parents:
            node = node[p]
        old = node[leaf]
        node[leaf] = (text.lower() == "true") if isinstance(old, bool) else type(old)(text)
    return c


def coarse_part(opcode: str, op_name: str) -> str:
    """forward / backward / update of the train step, from the JAX op that made an instruction; instructions no JAX
    op names are the zero-filled buffers a scan's stacked outputs (the forward's saved residuals) start from."""
    del opcode
    if not op_name:
        return "stacks"
    if "transpose(" in op_name:
        return "backward"
    return "forward" if "jvp(" in op_name else "update"


def gpu_anatomy(card: str, spec: str, overrides: list[str], forward_of: dict | None = None) -> dict:
    """One shape's eval forward and train step compiled by XLA's GPU compiler for `card`, counted by part;
    forward_of: an earlier result whose eval forward this one shares (a variant of the train step only)."""
    import flax.linen as nn
    import jax

    from bert_jax.plan import gpu_cards, hlo_traffic, memory_fit
    from bert_jax.parallel.mesh import make_mesh
    from bert_jax.train.program import build_program
    from data_pipelines.loader import pipeline

    c = shape_config(spec, overrides)
    program = build_program(c, make_mesh(c.mesh, gpu_cards.gpu_devices(gpu_cards.parse_gpu(card, 1))))
    batch = c.train.global_batch_size
    abstract = {k: jax.ShapeDtypeStruct(s, d, sharding=program.data_sharding)
                for k, (s, d) in pipeline.batch_spec(c.data, batch).items()}
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        start = time.perf_counter()
        train = program.train_step.lower(program.abstract_state, abstract, program.abstract_frozen).compile()
        seconds = time.perf_counter() - start
        if forward_of is None:
            forward = program.eval_step.lower(program.abstract_state.params, abstract, 0,
                                              program.abstract_frozen).compile()
    texts = {"train": train.as_text()} if forward_of else {"train": train.as_text(), "forward": forward.as_text()}
    if _HLO_DIR.value:
        os.makedirs(_HLO_DIR.value, exist_ok=True)
        for k, text in texts.items():
            with open(os.path.join(_HLO_DIR.value, f"{spec.replace(':', '_')}.{k}.hlo"), "w") as f:
                f.write(text)
    out = {"shape": spec, "set": overrides, "card": card, "kernel": program.attention_kernel,
           "remat": c.model.remat_policy, "compile_s": round(seconds, 1),
           "peak_gib": memory_fit.compiled_peak_bytes(train.memory_analysis()) / 1024**3}
    for name, text in texts.items():
        total = hlo_traffic.traffic(text)
        out[name] = {"launches": total.launches, "bytes": total.hbm + total.on_chip,
                     "parts": {p: {"launches": k, "bytes": h + o}
                               for p, (k, h, o) in hlo_traffic.breakdown(text, coarse_part).items()},
                     "detail": {p: {"launches": k, "bytes": h + o}
                                for p, (k, h, o) in hlo_traffic.breakdown(text, part_of).items()}}
    if forward_of is not None:
        out["forward"] = forward_of["forward"]
    return out


def print_gpu_row(a: dict) -> None:
    f, t = a["forward"], a["train"]
    cell = lambda c: f"{c['launches']:,.0f}, {c['bytes'] / 1e9:.1f}"  # noqa: E731
    parts = [cell(t["parts"].get(p, {"launches": 0, "bytes": 0})) for p in ("forward", "stacks", "backward", "update")]
    print(f"| {a['shape']}{' ' + ' '.join(a['set']) if a['set'] else ''}{' (' + a['variant'] + ')' if 'variant' in a else ''} | {cell(f)} | {' | '.join(parts)} | "
          f"**{cell(t)}** | {t['launches'] / f['launches']:.1f}x, {t['bytes'] / f['bytes']:.2f}x | "
          f"{a['peak_gib']:.1f} |", flush=True)
    print("    detail: " + "; ".join(f"{p} {c['launches']:,.0f} / {c['bytes'] / 1e9:.1f} GB"
                                      for p, c in t["detail"].items()), flush=True)


def main(argv):
    del argv
    if _GPU.value:
        import jax

        jax.config.update("jax_platforms", "cpu")  # the host's backend: the plugin must not look for a driver
        print("| shape (seq, batch) | eval forward: launches, GB | train forward | zero-filled stacks | train backward | "
              "update | train step | step / forward (launches, bytes) | peak GiB |\n|---|---|---|---|---|---|---|---|---|",
              flush=True)
        results = []
        for spec in _SHAPES.value:
            results.append(gpu_anatomy(_GPU.value, spec, _SET.value))
            print_gpu_row(results[-1])
            if spec == _SHAPES.value[0]:
                for variant in _VARIANTS.value:
                    name, _, assignments = variant.partition("=")
                    results.append(gpu_anatomy(_GPU.value, spec, _SET.value + assignments.split(";"), results[0]))
                    results[-1]["variant"] = name
                    print_gpu_row(results[-1])
        if _JSON.value:
            with open(_JSON.value, "w") as f:
                json.dump(results, f, indent=1)
        return
    if _FROM_HLO.value:
        texts = {k: open(os.path.join(_FROM_HLO.value, f"{k}.hlo")).read() for k in ("train", "forward")}
    else:
        texts = compile_hlo(_SHAPE.value, _SET.value)
        if _HLO_DIR.value:
            os.makedirs(_HLO_DIR.value, exist_ok=True)
            for k, text in texts.items():
                with open(os.path.join(_HLO_DIR.value, f"{k}.hlo"), "w") as f:
                    f.write(text)
    result = {k: anatomy(text) for k, text in texts.items()}
    print_anatomy("eval forward", result["forward"])
    print_anatomy("train step", result["train"], result["forward"])
    if _JSON.value:
        with open(_JSON.value, "w") as f:
            json.dump({"shape": _SHAPE.value, "set": _SET.value, **result}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
