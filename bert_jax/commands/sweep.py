"""One pre-training run per point of a grid of overrides; downstream batteries and summaries of a sweep.

    bert-jax sweep run --sweep=configs/sweeps/tiny_lr.py --sweep_dir=runs/tiny_lr [--executor=local|ray|tpu]
    bert-jax sweep summary --sweep_dir=runs/tiny_lr
    bert-jax sweep evaluate --sweep_dir=runs/tiny_lr --suite=smoke --glue_dir=/data/glue [--tasks=sst2,rte] \\
        [--seeds=5] [--executor=ray --address=HEAD_IP:6379 --tpu=v4-8]

`run` makes one workdir per point under --sweep_dir and runs (or, with --dry_run, prints) each point's command;
`summary` tabulates and plots the runs of a sweep directory, while they run too; `evaluate` fine-tunes every arm's
final checkpoint on a suite (`bert-jax evaluate`), whose scores `summary` then shows beside the losses.
"""
import argparse

from bert_jax import UserError
from bert_jax.launch import executors, sweep, sweep_downstream
from bert_jax.run import argparse_command
from bert_jax.storage import paths


def parser() -> argparse_command.ArgumentParser:
    p = argparse_command.parser(__file__, description=__doc__, epilog=f"{sweep.__doc__}\n{sweep_downstream.__doc__}")
    sub = p.add_subparsers(dest="subcommand", required=True)

    run = sub.add_parser("run", help="run (or print) every point of a sweep file", description=__doc__)
    run.add_argument("--sweep", required=True, help="the sweep file, e.g. configs/sweeps/tiny_lr.py")
    run.add_argument("--sweep_dir", required=True, help="one workdir per point is made under it")
    run.add_argument("--executor", choices=sweep.EXECUTORS, default="local")
    run.add_argument("--dry_run", action="store_true", help="print the commands only")
    run.add_argument("--parallel", type=int, default=0,
                     help="points at once (local: default 1; ray: default all, each waiting for a slice)")
    run.add_argument("--log_dir", default="", help="parallel points' logs (default <sweep_dir>/logs)")
    executors.add_ray_flags(run)
    run.add_argument("--tpu_name_prefix", default="sweep")
    run.add_argument("--zone", default="us-central2-b")
    run.add_argument("--accelerator_type", default="v4-8")
    run.add_argument("--capacity", choices=("spot", "preemptible", "on_demand"), default="spot")
    run.add_argument("--repo_url", default="", help="tpu: the repository each slice clones")
    run.add_argument("--branch", default="main")
    run.set_defaults(act=_run)

    summary = sub.add_parser("summary", help="tabulate and plot the runs of a sweep directory", description=__doc__)
    summary.add_argument("--sweep_dir", required=True, help="a directory `bert-jax sweep run` made")
    summary.set_defaults(act=_summary)

    evaluate = sub.add_parser("evaluate", help="fine-tune every arm's final checkpoint on a suite (bert-jax evaluate)",
                              description=__doc__)
    evaluate.add_argument("--sweep_dir", default="", help="a directory `bert-jax sweep run` made")
    evaluate.add_argument("sweep_dir_given", nargs="?", default="", metavar="SWEEP_DIR",
                          help="the same as --sweep_dir (the older form)")
    evaluate.add_argument("--suite", default="glue", help="glue, smoke, retrieval, embeddings (configs/suites/) or a "
                          "suite .py file")
    evaluate.add_argument("--glue_dir", default="", help="GLUE's directory layout: SST-2/train.tsv, ...")
    evaluate.add_argument("--beir_dir", default="", help="BEIR-layout datasets, one per subfolder (suites with "
                          "retrieval)")
    evaluate.add_argument("--tfds_data_dir", default="", help="TFDS's prepared glue/*, instead of --glue_dir")
    evaluate.add_argument("--tasks", default="", help="comma-separated tasks of the suite (default: all)")
    evaluate.add_argument("--seeds", default="", help="seeds per task (default: the suite's)")
    evaluate.add_argument("--executor", choices=executors.EXECUTORS, default="local",
                          help="local: each arm's runs here, one after another; ray: each run a `ray-tpu` job")
    executors.add_ray_flags(evaluate)
    evaluate.set_defaults(act=_evaluate)
    return p


def _main(argv: list[str]) -> int | None:
    args = parser().parse_args(argv)
    return args.act(args)


def _run(args: argparse.Namespace) -> int:
    return sweep.run_sweep(args)


def _summary(args: argparse.Namespace) -> None:
    check_sweep_dir(args.sweep_dir)
    table = sweep.summarize(args.sweep_dir)
    print((paths.path(args.sweep_dir) / "summary.md").read_text(), end="")
    print(f"{len(table)} runs; wrote summary.md, summary.csv, curves.png in {args.sweep_dir}")


def _evaluate(args: argparse.Namespace) -> int:
    if args.sweep_dir and args.sweep_dir_given and args.sweep_dir != args.sweep_dir_given:
        raise argparse_command.FlagError(f"two sweep directories: --sweep_dir={args.sweep_dir} and "
                                         f"{args.sweep_dir_given}; give one")
    args.sweep_dir = args.sweep_dir or args.sweep_dir_given
    if not args.sweep_dir:
        raise argparse_command.FlagError("the following arguments are required: --sweep_dir")
    check_sweep_dir(args.sweep_dir)
    return sweep_downstream.evaluate_sweep(args)


def check_sweep_dir(sweep_dir: str) -> None:
    """A directory `sweep run` made (it writes sweep.json before any point starts), or a UserError naming it."""
    if not paths.path(sweep_dir).is_dir():
        raise UserError(f"--sweep_dir={sweep_dir}: no such directory (`bert-jax sweep run --sweep_dir=...` makes one)")
    if not (paths.path(sweep_dir) / "sweep.json").exists():
        raise UserError(f"--sweep_dir={sweep_dir} is not a sweep directory: it holds no sweep.json (`bert-jax sweep "
                        f"run` writes one first)")


def main(argv=None) -> None:
    argparse_command.run(__file__, _main, argv)


if __name__ == "__main__":
    main()
