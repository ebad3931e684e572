"""What `config.deterministic_gpu_ops` costs: train-step tokens/s with --xla_gpu_deterministic_ops off and on.

    python bench/deterministic_ops_cost.py [--shape=base] [--steps=10] [--repeats=2]

XLA reads its flags when JAX starts, so each measurement is a fresh process running
bench/train_step_throughput.py for one shape, with or without the flag in XLA_FLAGS. The two
sides are interleaved (off, on, off, on, ...) so that drift in the machine's speed falls on
both. On a CPU (or TPU) the flag changes nothing: the two columns differ only by noise, which
is itself worth knowing before reading a GPU's figure.
"""
import os
import re
import subprocess
import sys

from absl import app, flags

from bert_jax.run import determinism

_SHAPE = flags.DEFINE_string("shape", "tiny", "A shape of bench/train_step_throughput.py: tiny, mini or base.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per measurement (after one compile step).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Measurements per side, interleaved.")

_BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_step_throughput.py")


def tokens_per_s(deterministic: bool) -> tuple[float, str]:
    """(tokens/s, device line) of one fresh process, with or without the determinism flag."""
    xla_flags = os.environ.get("XLA_FLAGS", "").replace(determinism.FLAG, "").strip()
    if deterministic:
        xla_flags = f"{xla_flags} {determinism.FLAG}".strip()
    root = os.path.dirname(os.path.dirname(_BENCH))
    env = {**os.environ, "XLA_FLAGS": xla_flags, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, _BENCH, f"--shapes={_SHAPE.value}", f"--steps={_STEPS.value}"],
                         env=env, capture_output=True, text=True, check=True).stdout
    row = re.search(rf"^{_SHAPE.value}\s+(?:\S+\s+){{5}}(\S+)", out, re.MULTILINE)
    if row is None:
        raise RuntimeError(f"no row for shape {_SHAPE.value!r} in the benchmark's output:\n{out}")
    return float(row.group(1)), out.splitlines()[0]


def main(_):
    results = {False: [], True: []}
    device = ""
    for repeat in range(_REPEATS.value):
        for deterministic in (False, True):
            value, device = tokens_per_s(deterministic)
            results[deterministic].append(value)
            print(f"repeat {repeat + 1}: deterministic_ops={'on ' if deterministic else 'off'} {value:10.0f} tokens/s",
                  flush=True)
    off, on = (max(results[side]) for side in (False, True))
    print(device)
    print(f"shape {_SHAPE.value}: best of {_REPEATS.value}: off {off:.0f} tokens/s, on {on:.0f} tokens/s "
          f"({on / off - 1:+.1%} with {determinism.FLAG})")
    if "cpu" in device.lower():
        print("no GPU here: the flag does nothing on a CPU, so the difference above is noise")


if __name__ == "__main__":
    app.run(main)
