"""Plans a run for hardware you do not have: compiles the exact train step ahead of time.

Plans a run for hardware you do not have: compiles the exact train step ahead of time.

    python -m bert_jax.plan --config=configs/bert_large.py --tpu=v5e-16
    python -m bert_jax.plan --config=configs/bert_large.py --tpu=v5p-128 --num_slices=2
    python -m bert_jax.plan --config=configs/bert_base.py --tpu=v5e-4 --search
    python -m bert_jax.plan --config=configs/bert_large.py --num_devices=1 --gpu=h100   (an estimate)

The train step that `bert_jax.train.program.build_program` makes (the one `pretrain` runs) is
lowered from abstract shapes (no parameter is ever allocated) and compiled.

--tpu: by the TPU compiler itself (libtpu, the `tpu` extra), for the slice's devices
(bert_jax/parallel/tpu_slices.py), with the LIBTPU_INIT_ARGS the run sets. Memory per chip, FLOPs and
bytes accessed are the compiler's own; everything hardware-dependent (the attention kernel,
config checks) is chosen for the TPU, not for this host. The TPU compiler counts a scanned
loop's body once: a scanned step's bytes count each loop's trips, read from the program
(bert_jax/plan/hlo_traffic.py), and its FLOPs add the layers the count missed, one layer's FLOPs
measured by a second compile with two layers per iteration (config.model.scan_unroll=2). A Pallas
kernel's FLOPs (splash attention) are invisible to the compiler's count and are added from the
formula. The compiler's bytes accessed include traffic that stays in on-chip memory; the
roofline bound (bert_jax/plan/roofline.py) divides only the HBM part by HBM bandwidth
(bert_jax/plan/hlo_traffic.py splits the compiled program's bytes by memory space).

For a config that fits, --tpu also prints the run's length, a lower bound: config.train.num_steps x
the roofline step time, per stage (bert_jax/plan/run_length.py), in hours and chip-hours.

--num_devices (with --gpu / --target, or --cpu): N simulated CPU devices and the XLA CPU
compiler. Parameter and optimizer bytes are exact; temporaries are the CPU compiler's
schedule, and an accelerator's peak was measured at 0.64x to more than 1.29x this figure
(bert_jax/plan/memory_fit.py). That verdict is an estimate over the whole band.
"""
import os

import jax
from absl import app, flags
from ml_collections import config_flags

from bert_jax.plan import memory_fit, plan_search, run_length
from bert_jax.parallel import tpu_slices
from bert_jax.plan.compiled_plan import DoesNotFit, fits, format_plan, make_plan, use_simulated_devices
from bert_jax.train import stages
from bert_jax.run import command_line
from bert_jax.train.config_validation import resolve_config

_CONFIG = config_flags.DEFINE_config_file("config", None, command_line.CONFIG_HELP, lock_config=True)
_TPU = flags.DEFINE_string("tpu", "", "A TPU slice to compile for with the TPU compiler: v4-32, v5e-16, v5p-128, v6e-8, ...")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "With --tpu: this many such slices (multi-slice over DCN).")
_SEARCH = flags.DEFINE_bool("search", False, "With --tpu: try remat x mesh x per-chip batch x scan; rank what fits.")
_ENOUGH_MFU = flags.DEFINE_float("search_enough_mfu", 0.98, "--search stops at the first fit with this MFU bound "
                                  "(nothing left can be faster by more than the rest); 0 = try every configuration.")
_NUM_DEVICES = flags.DEFINE_integer("num_devices", 8, "Without --tpu: simulated CPU devices to compile for.")
_GPU = flags.DEFINE_enum("gpu", "", ["", *(k for k, t in memory_fit.TARGETS.items() if t.compiler == "gpu")],
                         "Without --tpu: a GPU kind to estimate the fit on (the CPU compiler's band).")
_CPU = flags.DEFINE_bool("cpu", False, "Plan with the XLA CPU compiler on simulated devices (the default without --tpu).")
_TARGET = flags.DEFINE_enum("target", "", ["", *memory_fit.TARGETS], "Without --tpu: device kind to estimate the fit on.")
_HBM_GIB = flags.DEFINE_float("hbm_gib", 0.0, "Memory of one device in GiB; 0 = the target's (or no verdict).")
_MAX_ROWS = flags.DEFINE_integer("max_param_rows", 0, "Print at most this many parameter rows; 0 = all.")
flags.mark_flags_as_required(["config"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    try:
        _plan(_CONFIG.value)
    except (ValueError, RuntimeError) as e:  # bad input, named: a message, not a traceback
        raise SystemExit(f"bert_jax.plan: {e}") from None


def _plan(config) -> None:
    if _TPU.value:
        if _GPU.value or _CPU.value or _TARGET.value:
            raise app.UsageError("--tpu compiles for a TPU slice; --gpu, --cpu and --target are for the CPU-compiler estimate")
        tpu_slice = tpu_slices.parse_slice(_TPU.value, _NUM_SLICES.value)
        # The host's own backend stays the CPU: on a TPU VM the plan must not take the chips a run may hold;
        # the TPU compiler is reached through the slice's topology.
        if not os.environ.get("JAX_PLATFORMS"):
            jax.config.update("jax_platforms", "cpu")
        if _SEARCH.value:
            tried = plan_search.search(config, tpu_slice, _HBM_GIB.value, enough_mfu=_ENOUGH_MFU.value, log=print)
            print(plan_search.format_search(tried, _TPU.value, _NUM_SLICES.value, _HBM_GIB.value))
            return
        try:
            plan = make_plan(config, tpu_slice)
        except DoesNotFit as e:
            print(f"**{e}** on {tpu_slice.label}.\n\n" + plan_search.suggest_fit(config, tpu_slice, _HBM_GIB.value))
            return
        print(format_plan(plan, hbm_gib=_HBM_GIB.value, max_rows=_MAX_ROWS.value))
        if not fits(plan, _HBM_GIB.value)[0]:
            print("\n" + plan_search.suggest_fit(config, tpu_slice, _HBM_GIB.value))
            return
        print(_run_length(config, tpu_slice, plan))
        return
    if _SEARCH.value or _NUM_SLICES.value != 1:
        raise app.UsageError("--search and --num_slices need --tpu: only the TPU compiler's figures are exact")
    use_simulated_devices(_NUM_DEVICES.value)
    print(format_plan(make_plan(config), _GPU.value or _TARGET.value, _HBM_GIB.value, _MAX_ROWS.value))


def _run_length(config, tpu_slice, plan) -> str:
    """Hours and chip-hours of config.train.num_steps, per stage; a later stage's step is compiled too."""
    lengths = []
    for stage in stages.plan(config):
        stage_plan = plan if stage.index == 0 else make_plan(resolve_config(stage.config), tpu_slice)
        if stage.index and not fits(stage_plan, _HBM_GIB.value)[0]:
            raise ValueError(f"stage {stage.index} (from step {stage.start}) does not fit {tpu_slice.label}")
        lengths.append(run_length.StageLength(
            run_length.stage_label(stage.start, stage.end, stage.config), stage.end - stage.start,
            stage_plan.roofline.step_s, stage_plan.num_devices, stage_plan.step_is_exact))
    return run_length.format_run_length(lengths)


def main() -> None:
    command_line.run(_main)


if __name__ == "__main__":
    main()
