"""What a downstream probe frees is given back, whole, without costing the pre-training its compiled step, and a
run's threads share two arenas (bert_jax/run/freed_memory.py; the hour that shows the flat RSS is
bench/long_haul.py's)."""
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax._src import pjit

from bert_jax.run import freed_memory


def test_traces_entries_go_and_a_compiled_step_is_not_compiled_again(caplog):
    @jax.jit
    def step(x):
        return jnp.einsum("ij,jk->ik", x, x)

    x = jnp.ones((4, 4))
    expected = step(x)
    for _ in range(3):  # a probe's model traced anew: each einsum call leaves an entry nothing hits again
        jax.jit(lambda y: jnp.einsum("ij,jk->ik", y, y)).lower(x)
    assert pjit._infer_params_cached.cache_info().currsize >= 3

    freed_memory.give_back()
    assert pjit._infer_params_cached.cache_info().currsize == 0
    with caplog.at_level(logging.DEBUG), jax.log_compiles(True):
        again = step(x)
    assert not [r for r in caplog.records if "Compiling" in r.getMessage()], "the step was compiled again"
    assert jnp.array_equal(again, expected)


# In a fresh process, so that no earlier test left free chunks in the arenas for the churn to reuse: 150 buffers of
# 1 MB, each allocated beside a small one that stays (a probe's compile and fine-tuning beside what the run keeps),
# then freed; it prints the MB that went back to the kernel.
CHURN = """
import sys
import numpy as np, psutil
from bert_jax.run import freed_memory

rss = lambda: psutil.Process().memory_info().rss / 2**20
big = np.ones(4 << 20, np.uint8)
del big  # glibc's threshold moves above 1 MB, as a run's first frees move it

def churn():
    big, kept = [], []
    for _ in range(150):
        buffer = np.empty(1 << 20, np.uint8)
        buffer[:] = 1
        big.append(buffer)
        kept.append(np.ones(64))
    peak = rss()
    del big
    print(peak - rss())

if sys.argv[1] == "one_off":
    with freed_memory.one_off():
        churn()
else:
    churn()
"""


@pytest.mark.skipif(freed_memory._libc("mallopt") is None, reason="glibc's allocator only")
@pytest.mark.parametrize("arm,low,high", [("one_off", 140, 1e9), ("control", -1e9, 50)], ids=["one_off", "control"])
def test_a_one_off_tasks_large_buffers_are_given_back_whole_when_freed(arm, low, high):
    out = subprocess.run([sys.executable, "-c", CHURN, arm], capture_output=True, text=True, check=True)
    given_back = float(out.stdout.split()[-1])
    assert low < given_back < high, f"{arm}: {given_back:.0f} MB of the 150 freed went back to the kernel"


# Run as a file in a fresh process, so that no thread allocated before its arm: `control` counts the arenas of 12
# threads that allocate at once; `capped` calls fewer_arenas first, counts the same, and runs itself as a child
# (`control`, which inherits the environment) and prints the child's count too.
ARENAS = """
import ctypes, os, re, subprocess, sys, tempfile, threading
from bert_jax.run import freed_memory

libc = ctypes.CDLL(None)
libc.fdopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]

def arenas_after(threads):
    together = threading.Barrier(threads)
    def allocate():
        kept = [bytearray(100_000) for _ in range(20)]
        together.wait()
    started = [threading.Thread(target=allocate) for _ in range(threads)]
    [thread.start() for thread in started]
    [thread.join() for thread in started]
    with tempfile.TemporaryFile() as out:
        stream = libc.fdopen(os.dup(out.fileno()), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        out.seek(0)
        return len(re.findall(rb"<heap nr=", out.read()))

if sys.argv[1] == "capped":
    freed_memory.fewer_arenas()
    child = subprocess.run([sys.executable, __file__, "control"], capture_output=True, text=True, check=True)
    print(arenas_after(12), child.stdout.strip())
else:
    print(arenas_after(12))
"""


@pytest.mark.skipif(freed_memory._libc("mallopt") is None, reason="glibc's allocator only")
def test_a_capped_process_s_threads_share_two_arenas_and_so_do_its_children_s(tmp_path):
    """After fewer_arenas, 12 threads that allocate at once share two arenas (the main one and one more), in the
    process and in a process it starts; without it, they take more."""
    script = tmp_path / "arenas.py"
    script.write_text(ARENAS)
    env = {k: v for k, v in os.environ.items() if k != freed_memory.ARENA_ENV}

    def arenas(arm: str) -> list[int]:
        out = subprocess.run([sys.executable, str(script), arm], capture_output=True, text=True, check=True, env=env)
        return [int(count) for count in out.stdout.split()]

    (uncapped,) = arenas("control")
    assert uncapped > freed_memory.ARENAS, f"12 threads at once made only {uncapped} arenas: nothing to cap"
    assert arenas("capped") == [freed_memory.ARENAS, freed_memory.ARENAS]


def test_a_moved_private_cache_skips_the_clear_and_not_the_import(monkeypatch):
    """jax._src.pjit is jax's private module: where a version moves it, the module still imports (every training
    command imports it) and give_back skips the clear."""
    import importlib

    import bert_jax.run
    import jax._src

    monkeypatch.delattr(jax._src, "pjit")  # `from jax._src import pjit` reads the attribute first
    monkeypatch.setitem(sys.modules, "jax._src.pjit", None)  # then the import fails, as a moved module's would
    monkeypatch.delitem(sys.modules, "bert_jax.run.freed_memory")
    monkeypatch.setattr(bert_jax.run, "freed_memory", freed_memory)
    moved = importlib.import_module("bert_jax.run.freed_memory")
    assert moved is not freed_memory and moved._trace_cache() is None
    moved.give_back()
