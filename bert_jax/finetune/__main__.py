"""`python -m bert_jax.finetune --config=configs/finetune/X.py --workdir=DIR` (see bert_jax/finetune/run.py)."""
from absl import app, flags
from ml_collections import config_flags

from bert_jax.log_filter import log_info_quietly
from bert_jax.storage import paths


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    # Loaded once the flags parsed: --help and a bad flag answer without loading JAX and the fine-tuning code.
    import jax

    cache = flags.FLAGS.config.get("compilation_cache_dir")
    if cache and jax.config.jax_compilation_cache_dir is None:  # JAX_COMPILATION_CACHE_DIR, if set, wins
        jax.config.update("jax_compilation_cache_dir", str(paths.path(cache).expanduser()))
    from bert_jax.finetune.run import finetune  # as jax above

    finetune(flags.FLAGS.config, flags.FLAGS.workdir)


def main() -> None:
    config_flags.DEFINE_config_file("config", None, "A configs/finetune/*.py file.", lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory of the run (checkpoints, metrics, predictions).")
    flags.mark_flags_as_required(["config", "workdir"])
    app.run(_main)


if __name__ == "__main__":
    main()
