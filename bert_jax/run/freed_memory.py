"""Memory a one-off task freed, given back, so that a long run's resident memory stays flat (bench/long_haul.py).

A downstream probe (bert_jax/finetune/downstream_probe.py) builds, traces and compiles a fine-tuning run inside the
pre-training's process, then drops it. Two things kept what it dropped, measured on configs/tiny.py with a probe every
20 steps (docs/results/long-haul.md):

- glibc's allocator keeps freed pages in its arenas, one per thread that allocated (XLA's compile threads, orbax's
  and grain's): after a probe the trainer's RSS stayed ~300 MB above what it used, and fragmentation raised that
  floor a few MB a probe. `malloc_trim(0)` returns the free pages of every arena to the kernel.
- jax's per-call jit of `jnp.einsum` (jax/_src/numpy/einsum.py wraps `_einsum` in a new `jax.jit` at each call)
  makes a new entry in pjit's `_infer_params_cached` each time a model is traced: 74 entries, some 2 MB, a probe of
  tiny, LRU-bounded at 2048 entries (about 28 probes). Nothing hits them again: the probe's model is traced anew
  each time. Clearing that cache leaves compiled programs alone (the pre-training's step keeps its executable in
  the jitted function's own cache); `jax.clear_caches()` would drop those too and recompile the step after each
  probe. The cache is jax's private name: where a jax version moves it, the clear is skipped and its LRU bound holds.

With give_back after each probe, an hour of tiny with a probe every 200 steps (66 probes) grew +98 MB/h, 1.7 MB a
probe, against 5.5 (micro, tests' config) to 20 MB (tiny, 20 minutes) a probe before (docs/results/long-haul.md). What is left is glibc's fragmentation: its
mmap threshold moves up (to 32 MB) after large frees, so the probes' large buffers come from the arenas and leave
pages the trim cannot return. A fixed threshold (`MALLOC_MMAP_THRESHOLD_=131072` in the environment) made 9 probes
flat (+0.1 MB a probe) but the CPU step of tiny 25 % slower (each step's activations mmapped and unmapped): not a
default; tcmalloc or jemalloc, preloaded, keep their own policies (then the trim is a no-op).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import functools

from jax._src import pjit


def give_back() -> None:
    """Collect Python's cycles, drop jax's einsum trace entries, return glibc's free pages to the kernel."""
    gc.collect()
    cache = getattr(pjit, "_infer_params_cached", None)
    if cache is not None and hasattr(cache, "cache_clear"):
        cache.cache_clear()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None on a C library without it (musl, macOS)."""
    library = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(library).malloc_trim if library else None
    except (OSError, AttributeError):
        return None
