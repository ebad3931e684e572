"""Exports a pre-training workdir's params: a Hugging Face folder (default) or a params-only orbax checkpoint.

    python -m bert_jax.export --workdir=runs/tiny --out=/tmp/bert_tiny_hf [--step=N] [--format=hf|params]

`--format=hf` writes config.json, model.safetensors and the tokenizer files, which
`transformers.AutoModelForMaskedLM.from_pretrained(OUT)` and `AutoTokenizer` load;
`--format=params` writes OUT/params (orbax, params only) and OUT/config.json, for JAX users.
"""
import json

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import app, flags, logging

from bert_jax.checkpoint import manager as ckpt
from bert_jax.log_filter import log_info_quietly
from bert_jax.parallel.mesh import make_mesh
from bert_jax.storage import paths, preflight
from bert_jax.train.program import build_program

FORMATS = ("hf", "params")


def _tuples(value):
    """JSON turns the config's tuples (mesh shape, axis rules) into lists; the code expects tuples."""
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def load_workdir_config(workdir: str) -> ml_collections.ConfigDict:
    """The run's config, rebuilt from DIR/config.json (ml_collections' `to_json_best_effort` output)."""
    path = paths.path(workdir) / "config.json"
    if not path.exists():
        raise ValueError(f"{path} does not exist: --workdir must be a pre-training run's directory")
    return ml_collections.ConfigDict(_tuples(json.loads(path.read_text())))


def restore_params(workdir: str, config, step: int | None = None) -> tuple[dict, int]:
    """Params (numpy, unrolled or scanned as trained) of checkpoint `step` (default: the newest), and the step.

    The state is restored on this host's first device, whatever mesh the run used: the
    abstract target (from the model and optimizer, as in training) carries that placement.
    """
    config = ml_collections.ConfigDict(config.to_dict())
    config.mesh.shape = (1, 1, 1)
    config.train.grad_accum_steps = 1
    config.train.global_batch_size = 1
    if config.get("distill"):
        config.distill.teacher = ""  # checkpoints hold the student alone: restoring it needs no teacher
    program = build_program(config, make_mesh(config.mesh, jax.devices()[:1]))
    directory = paths.absolute(paths.path(workdir) / "checkpoints")
    if not paths.path(directory).is_dir():
        raise ValueError(f"{directory} holds no checkpoint")
    manager = ckpt.make_manager(directory, config.checkpoint)
    steps = manager.all_steps()
    if not steps:
        raise ValueError(f"{directory} holds no checkpoint")
    step = max(steps) if step is None else step
    if step not in steps:
        raise ValueError(f"--step={step}: {directory} holds steps {sorted(steps)}")
    restored = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(program.abstract_state)))
    manager.close()
    return jax.device_get(restored["state"].params), step


def export(workdir: str, out: str, step: int | None = None, fmt: str = "hf") -> int:
    """Writes the export to `out`; returns the step exported."""
    if fmt not in FORMATS:
        raise ValueError(f"--format={fmt!r}; expected one of {FORMATS}")
    config = load_workdir_config(workdir)
    params, step = restore_params(workdir, config, step)
    if fmt == "params":
        preflight.check_checkpoint_store(out)
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(paths.absolute(paths.path(out) / "params"), params, force=True)
        checkpointer.wait_until_finished()
        paths.copy_file(paths.path(workdir) / "config.json", paths.path(out) / "config.json")
        return step
    from bert_jax.families import get_family

    family = get_family(config.model.family)
    if family.hf_export is None:
        raise ValueError(f"config.model.family={family.name!r} has no Hugging Face export; use --format=params")
    tokenizer_dir = paths.path(workdir) / "tokenizer"
    tokenizer = str(tokenizer_dir) if tokenizer_dir.is_dir() else None
    # The main folder and any beside it (ELECTRA's generator, as OUT/generator).
    family.hf_export(params, config.model).write(out, tokenizer, model_max_length=config.data.max_seq_length)
    return step


def _define_flags():
    flags.DEFINE_string("workdir", None, "The pre-training run's directory (config.json, checkpoints/, tokenizer/).")
    flags.DEFINE_string("out", None, "Directory to write the export to.")
    flags.DEFINE_integer("step", None, "Checkpoint step to export; default: the newest.")
    flags.DEFINE_enum("format", "hf", list(FORMATS), "hf: Hugging Face folder; params: params-only orbax checkpoint.")
    flags.mark_flags_as_required(["workdir", "out"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    flag_values = flags.FLAGS
    step = export(flag_values.workdir, flag_values.out, flag_values.step, flag_values.format)
    logging.info("exported step %d of %s to %s (%s)", step, flag_values.workdir, flag_values.out, flag_values.format)


def main() -> None:
    # Flags are defined here, not at import, so importing this module never clashes with other entry points'.
    _define_flags()
    app.run(_main)


if __name__ == "__main__":
    main()
