"""A command's process, set up from its main before JAX starts its backend: every command that runs a job (trains,
prepares, tokenizes, mines, extends) starts here, so that what the process is (its allocator, its flags, the run it
joins) is set in one place.

Two arenas for the allocator, always (run/freed_memory.py: a prepare's or a tokenizer's threads and workers grow
theirs as a trainer's do). With a config, XLA's and libtpu's flags from it. A command that trains (`join_run`) then
joins its multi-host run and takes the compilation cache; the data commands (prepare, tokenizer, mine-pairs,
extend-vocab) run on each host alone and compile nothing, so they neither join nor cache.
"""
import jax

from bert_jax.parallel import distributed, tpu_slices
from bert_jax.run import determinism, freed_memory
from bert_jax.storage import paths


def setup_process(config=None, join_run: bool = True) -> None:
    """The allocator's arenas; with `config`, its flags, then (`join_run`) joining the run, then the cache."""
    freed_memory.fewer_arenas()
    if config is None:
        return
    determinism.set_xla_flags(config)
    tpu_slices.set_libtpu_init_args(config)
    if not join_run:
        return
    distributed.initialize(config.distributed)  # before anything touches a device
    cache = config.compilation_cache_dir
    if cache and jax.config.jax_compilation_cache_dir is None:  # JAX_COMPILATION_CACHE_DIR, if set, wins
        jax.config.update("jax_compilation_cache_dir", str(paths.path(cache).expanduser()))
