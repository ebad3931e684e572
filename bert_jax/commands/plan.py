"""Plans a run for hardware you do not have: compiles every stage's train step ahead of time and judges the fit.

    bert-jax plan --config=configs/bert_base.py                          (8 simulated CPU devices, no verdict)
    bert-jax plan --config=configs/bert_base.py --gpu=h100 --num_devices=1   (one H100, by XLA's GPU compiler)
    bert-jax plan --config=configs/bert_large.py --tpu=v5e-16
    bert-jax plan --config=configs/bert_large.py --tpu=v5p-128 --num_slices=2
    bert-jax plan --config=configs/bert_base.py --tpu=v5e-4 --search
    bert-jax plan --config=configs/bert_base.py --gpu=h100 --num_devices=1 --budget=24h   (what a day buys)

Every stage of the run (config.train.stages and those train.batch_size_warmup and data.mask_rate_schedule expand
into, bert_jax/train/stages.py: BERT's seq 512 phase, ModernBERT's batch ramp, say) is planned: the
train step that `bert_jax.train.program.build_program` makes for it (the one `pretrain` runs) is lowered from
abstract shapes (no parameter is ever allocated) and compiled (bert_jax/plan/stage_plans.py). The report ends
with a table of the stages (sequence length, global and per-device batch, parameters, FLOPs per step, peak
memory per device, verdict) and the verdict of the worst stage, naming it; for a stage that does not fit, the
changes that would make it fit, each compiled (bert_jax/plan/stage_fixes.py). Exit status 0 when every stage fits
(or no verdict was asked for), 1 when a stage does not, 2 for a bad flag or config.

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
For a run whose every stage fits, --tpu also prints the run's length, a lower bound: each stage's steps x its
roofline step time (bert_jax/plan/run_length.py), in hours and chip-hours. --search ranks remat x mesh x per-chip
batch x scan for each stage (bert_jax/plan/plan_search.py). --budget (or config.train.budget) adds what the budget
buys, per stage, resolved by the run's own function (bert_jax/plan/budget_plan.py, budget.clock_for): for wall-clock
time an upper bound on steps and tokens (stage 0's step at its roofline bound, collectives counted, a later stage's
scaled by its FLOPs per step as the run scales its measured stage 0), for tokens and FLOPs exact steps.

--gpu=h100|h200|a100_80gb|a100_40gb [--num_devices=N]: by XLA's GPU compiler for N such cards, on any host
(the CUDA plugin, the `gpu` extra; bert_jax/plan/gpu_cards.py, the cards' target configs in
bert_jax/plan/gpu_targets/). Memory per GPU is the compiler's own (memory_analysis); kernel launches and HBM bytes
per step are read from the optimised program, each loop's trips counted (bert_jax/plan/hlo_traffic.py); FLOPs from
the unoptimised program's dots (bert_jax/plan/hlo_flops.py: the GPU compiler gives no cost analysis), plus cuDNN
attention's from the formula; the roofline bound from the card's peak bf16 FLOP/s and HBM bandwidth. A GPU
program may use XLA_PYTHON_CLIENT_MEM_FRACTION (75 %) of the card. --search works as with --tpu. Without the
plugin (or with --cpu), --gpu judges the CPU compiler's figure within the band below, and says so.

--num_devices (alone, or with --target / --hbm_gib, or --gpu without the plugin, for a verdict): N simulated CPU
devices and the XLA CPU compiler. Parameter and optimizer bytes are exact; temporaries are the CPU compiler's schedule, and an
accelerator's peak was measured at 0.64x to more than 1.29x this figure (bert_jax/plan/memory_fit.py). That
verdict is an estimate over the whole band.
"""
import os
import sys

import jax
from absl import flags
from ml_collections import config_flags

from bert_jax import UserError
from bert_jax.parallel import tpu_slices
from bert_jax.plan import budget_plan, gpu_cards, memory_fit, plan_search, stage_report
from bert_jax.plan.compiled_plan import use_simulated_devices
from bert_jax.plan.stage_plans import Judge, StagePlanner, step_config
from bert_jax.run import command_line
from bert_jax.run.refusal import raised_on_purpose, reraise
from bert_jax.train import budget, stages


def _define_flags() -> None:
    """At start, not import: a test may import check_flags beside another command's --config."""
    config_flags.DEFINE_config_file("config", None, command_line.CONFIG_HELP, lock_config=True)
    flags.DEFINE_string("tpu", "", "A TPU slice to compile for with the TPU compiler: v4-32, v5e-16, v5p-128, v6e-8, ...")
    flags.DEFINE_integer("num_slices", 1, "With --tpu: this many such slices (multi-slice over DCN).")
    flags.DEFINE_bool("search", False, "With --tpu or --gpu (the GPU compiler): try remat x mesh x per-chip batch x "
                      "scan for each stage; rank what fits.")
    flags.DEFINE_float("search_enough_mfu", 0.98, "--search stops at the first fit with this MFU bound (nothing left "
                       "can be faster by more than the rest); 0 = try every configuration.")
    flags.DEFINE_integer("num_devices", 8, "Without --tpu: the GPUs (--gpu) or simulated CPU devices to compile for.")
    flags.DEFINE_string("gpu", "", "Without --tpu: a GPU to compile for with XLA's GPU compiler (the `gpu` extra; "
                        "without it, or with --cpu, the CPU compiler's estimate): "
                        + ", ".join(gpu_cards.CARDS) + ".")
    flags.DEFINE_bool("cpu", False, "Plan with the XLA CPU compiler on simulated devices (the default without --tpu "
                      "or the GPU compiler).")
    flags.DEFINE_string("target", "", "Without --tpu: a device kind to estimate the fit on: "
                        + ", ".join(memory_fit.TARGETS) + ".")
    flags.DEFINE_float("hbm_gib", 0.0, "Memory of one device in GiB; 0 = the target's (or no verdict).")
    flags.DEFINE_integer("max_param_rows", 0, "Print at most this many parameter rows; 0 = all.")
    flags.DEFINE_string("budget", "", "What a budget buys per stage (bert_jax/plan/budget_plan.py): wall-clock (24h; "
                        "needs --gpu or --tpu's roofline), tokens (2e9tokens) or FLOPs (3e18flops); default "
                        "config.train.budget.")
    flags.mark_flags_as_required(["config"])


def gpu_compiler(gpu: str, cpu: bool) -> bool:
    """Whether --gpu is planned by XLA's GPU compiler: the CUDA plugin is installed and --cpu was not given."""
    return bool(gpu) and not cpu and gpu_cards.plugin_available()


def check_flags(argv, tpu: str, gpu: str, cpu: bool, target: str, search: bool, num_slices: int, num_devices: int,
                hbm_gib: float, enough_mfu: float) -> str:
    """The device kind the CPU-compiler estimate judges against ("" for none; the GPU with the GPU compiler); a
    flag that cannot be honoured is a UserError naming it, before anything is compiled."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments {argv[1:]}: plan takes flags only (--config, --tpu, --gpu, ...)")
    gpus = [k for k, t in memory_fit.TARGETS.items() if t.compiler == "gpu"]
    if gpu and gpu not in gpus:
        raise UserError(f"--gpu={gpu!r} is not a GPU kind the planner knows; known: {', '.join(gpus)}")
    if target and target not in memory_fit.TARGETS:
        raise UserError(f"--target={target!r} is not a device kind the planner knows; known: "
                        f"{', '.join(memory_fit.TARGETS)}")
    if gpu and target and gpu != target:
        raise UserError(f"--gpu={gpu} and --target={target} name two device kinds; give one")
    if hbm_gib < 0:
        raise UserError(f"--hbm_gib={hbm_gib:g} must be >= 0 (0 = the device kind's memory, or no verdict)")
    if not 0 <= enough_mfu <= 1:
        raise UserError(f"--search_enough_mfu={enough_mfu:g} must be in [0, 1] (0 = try every configuration)")
    if tpu:
        if gpu or cpu or target:
            given = " ".join(f"--{n}" for n, v in (("gpu", gpu), ("cpu", cpu), ("target", target)) if v)
            raise UserError(f"--tpu={tpu} compiles for a TPU slice with the TPU compiler; {given} is for the "
                            "CPU compiler's estimate: give one or the other")
        return ""
    if search and not gpu_compiler(gpu, cpu):
        if gpu and not cpu:
            raise UserError(f"--search with --gpu={gpu} needs XLA's GPU compiler, the CUDA plugin: "
                            f"{gpu_cards.GPU_INSTALL_HINT}")
        raise UserError("--search needs --tpu=SLICE or --gpu=CARD: it ranks by that compiler's roofline "
                        "(e.g. --tpu=v5e-16, --gpu=h100)")
    if num_slices != 1:
        raise UserError(f"--num_slices={num_slices} needs --tpu=SLICE: it counts TPU slices")
    if num_devices < 1:
        raise UserError(f"--num_devices={num_devices} must be >= 1")
    if gpu_compiler(gpu, cpu):
        gpu_cards.parse_gpu(gpu, num_devices)  # a count the cards do not come in fails here
    return gpu or target


def _main(argv) -> None:
    f = flags.FLAGS
    target = check_flags(argv, f.tpu, f.gpu, f.cpu, f.target, f.search, f.num_slices, f.num_devices, f.hbm_gib,
                         f.search_enough_mfu)
    try:
        budget.parse(f.budget, "--budget")
    except ValueError as e:
        raise UserError(str(e)) from None
    try:
        fits = _plan(f.config, target)
    except ValueError as e:  # a config the run would refuse, named by the check that refused it; a fault (a bug, the
        reraise(e)  # compiler's own error) keeps its traceback
    except RuntimeError as e:  # the TPU or GPU compiler missing: the message names the install command (an XLA
        if not raised_on_purpose(e):  # error while compiling is no such thing, and keeps its traceback)
            raise
        raise SystemExit(f"bert-jax plan: {e}") from None
    if not fits:
        sys.exit(1)  # the report above names the stage


def _plan(config, target: str) -> bool:
    """Prints the report; whether every stage fits."""
    f = flags.FLAGS
    tpu_slice = None
    if f.tpu:
        try:
            tpu_slice = tpu_slices.parse_slice(f.tpu, f.num_slices)
        except ValueError as e:
            raise UserError(str(e)) from None
        # The host's own backend stays the CPU: on a TPU VM the plan must not take the chips a run may hold;
        # the TPU compiler is reached through the slice's topology.
        if not os.environ.get("JAX_PLATFORMS"):
            jax.config.update("jax_platforms", "cpu")
        if f.search:
            return _search(config, tpu_slice)
    elif gpu_compiler(f.gpu, f.cpu):
        tpu_slice, target = gpu_cards.parse_gpu(f.gpu, f.num_devices), ""  # XLA's GPU compiler, for these cards
        if not os.environ.get("JAX_PLATFORMS"):
            jax.config.update("jax_platforms", "cpu")  # the plugin must not look for a driver on this host
        if f.search:
            return _search(config, tpu_slice)
    else:
        use_simulated_devices(f.num_devices)
        if f.gpu and not f.cpu:
            print(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT}): --gpu={f.gpu} is judged on the "
                  "XLA CPU compiler's figure, within the band measured around it.\n")
    planner = StagePlanner(Judge.of(tpu_slice, target, f.hbm_gib))
    stage_plans = planner.stages(config)
    text, fits = stage_report.report(planner, stage_plans, target, f.max_param_rows)
    print(text)
    bought = budget.parse(f.budget or config.train.get("budget", ""), "--budget" if f.budget else budget.KEY)
    if bought is not None:
        device = planner.judge.device if planner.judge.tpu_slice is not None else "the CPU compiler (no roofline)"
        print(budget_plan.format_buys(bought, budget_plan.buys(bought, stage_plans), device))
    return fits


def _search(config, tpu_slice) -> bool:
    """--search for each stage; whether each has a configuration that fits."""
    f = flags.FLAGS
    every_stage_fits = True
    for stage in stages.plan(config):
        print(f"## stage {stage.index} (steps {stage.start + 1:,}-{stage.end:,}, seq "
              f"{stage.config.data.max_seq_length}, batch {stage.config.train.global_batch_size})\n")
        tried = plan_search.search(step_config(stage.config), tpu_slice, f.hbm_gib, enough_mfu=f.search_enough_mfu,
                                   log=print)
        print(plan_search.format_search(tried, f.tpu, f.num_slices, f.hbm_gib) if f.tpu else
              plan_search.format_search(tried, f.gpu, 1, f.hbm_gib, flag="gpu", num_devices=f.num_devices))
        if stage.declared is not None:
            print(f"\nThis stage's grad_accum_steps goes in config.train.stages[{stage.declared}] "
                  "(train=dict(grad_accum_steps=K)); scan, mesh and remat are the whole run's.")
        elif stage.index:
            print(f"\nThis stage's grad_accum_steps goes in config.train.stages as dict(start={stage.start}, "
                  "train=dict(grad_accum_steps=K)); scan, mesh and remat are the whole run's.")
        print()
        every_stage_fits &= any(t.fits for t in tried)
    return every_stage_fits


def main() -> None:
    _define_flags()
    command_line.run(_main)


if __name__ == "__main__":
    main()
