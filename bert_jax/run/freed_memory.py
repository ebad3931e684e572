"""glibc's allocator held to what a long run uses, so that its resident memory stays flat (bench/long_haul.py):
two arenas for the whole run, and the memory a one-off task freed given back.

Two arenas: `fewer_arenas`, from each command that trains (its docstring says why).

A downstream probe (bert_jax/finetune/downstream_probe.py) builds, traces and compiles a fine-tuning run inside the
pre-training's process (on a TPU VM the chips belong to it), then drops it. Three things kept what it dropped,
found on configs/tiny.py with a probe every 10-20 steps (docs/results/long-haul.md):

- glibc's allocator keeps freed pages in its arenas, one per thread that allocated (XLA's compile threads, orbax's
  and grain's): after a probe the trainer's RSS stayed ~300 MB above what it used. `malloc_trim(0)` returns the
  free pages of every arena to the kernel.
- jax's per-call jit of `jnp.einsum` (jax/_src/numpy/einsum.py wraps `_einsum` in a new `jax.jit` at each call)
  makes a new entry in pjit's `_infer_params_cached` each time a model is traced: 74 entries, some 2 MB, a probe of
  tiny, LRU-bounded at 2048 entries (about 28 probes). Nothing hits them again: the probe's model is traced anew
  each time. Clearing that cache leaves compiled programs alone (the pre-training's step keeps its executable in
  the jitted function's own cache); `jax.clear_caches()` would drop those too and recompile the step after each
  probe. The cache is jax's private name: where a jax version moves it, the clear is skipped and its LRU bound holds.
- glibc's mmap threshold moves up (to 32 MB) after large frees, so a probe's large buffers come from the arenas,
  beside chunks that stay, and leave pages no trim can return: with the two above alone, an hour with a probe every
  200 steps (66 probes) still grew +98 MB/h, about 1.7 MB a probe. Inside `one_off` the threshold is glibc's
  starting 128 kB, so the probe's large buffers get mappings of their own, unmapped whole when freed; after it, the
  threshold is set to the 32 MB the moving one reaches, so the pre-training's steps keep reusing their buffers from
  the arenas. (A 128 kB threshold for the whole run kept it flat too, but made the CPU step of tiny 25 % slower:
  each step's activations mapped and unmapped.)

Measured over 20 probes of tiny, every 10 steps: +0.82 MB a probe with the first two, +0.05 with all three.
Allocators other than glibc's (tcmalloc, jemalloc, preloaded) keep their own policies: the glibc calls are skipped
or do nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os


# glibc's mallopt parameters (malloc.h); the threshold's starting value and the highest it moves to (64-bit).
M_MMAP_THRESHOLD, START_BYTES, MOVED_MAX_BYTES = -3, 128 * 1024, 32 * 1024 * 1024
M_ARENA_MAX, ARENA_ENV, ARENAS = -8, "MALLOC_ARENA_MAX", 2


def fewer_arenas() -> None:
    """From a command's start, before JAX starts its threads: glibc gives the threads that allocate at most two
    arenas (its default is 8 per core: 16 here, hundreds on a TPU VM's host), and so do the processes the run
    starts (grain's workers, wandb's service: they read the environment variable when they start).

    Each arena keeps what its threads freed, and a freed chunk can be reused only by a thread of that arena: with
    one per thread, XLA's, orbax's and grain's threads each grew their own, and the long haul's trainer grew
    100-180 MB/h with the heap in use flat (docs/results/long-haul.md). Threads created before the call keep the
    arena they have. A MALLOC_ARENA_MAX the user set (glibc read it at start-up) is left as it is."""
    if ARENA_ENV in os.environ:
        return
    mallopt = _libc("mallopt")
    if mallopt is not None:
        mallopt(M_ARENA_MAX, ARENAS)
    os.environ[ARENA_ENV] = str(ARENAS)


@contextlib.contextmanager
def one_off():
    """Around a one-off task (a probe): its large buffers in their own mappings, returned whole when freed; after it,
    the threshold where a long run's own moved it (its step's buffers reused from the arenas, no mmap per step),
    and what the task freed given back."""
    mallopt = _libc("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, START_BYTES)
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(M_MMAP_THRESHOLD, MOVED_MAX_BYTES)
        give_back()


def give_back() -> None:
    """Collect Python's cycles, drop jax's einsum trace entries, return glibc's free pages to the kernel."""
    gc.collect()
    cache = _trace_cache()
    if cache is not None:
        cache.cache_clear()
    trim = _libc("malloc_trim")
    if trim is not None:
        trim(0)


def _trace_cache():
    """pjit's `_infer_params_cached`, or None where a jax version moved or renamed it: a private name, imported here
    and not at module load, so that a move costs the clear and not every command that imports this module."""
    try:
        from jax._src import pjit  # noqa: PLC0415  (private; see the docstring)
    except ImportError:
        return None
    cache = getattr(pjit, "_infer_params_cached", None)
    return cache if hasattr(cache, "cache_clear") else None


@functools.cache
def _libc(name: str):
    """glibc's function `name`, or None on a C library without it (musl, macOS)."""
    library = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(library), name) if library else None
    except (OSError, AttributeError):
        return None
