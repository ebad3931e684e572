"""The TPU VM and SLURM launchers' dry runs print the exact commands a cluster needs."""
import shlex
import subprocess
import sys

from bert_jax.commands import slurm as slurm_command
from bert_jax.commands import tpu_vm as tpu_vm_command
from bert_jax.launch import local, slurm, tpu_vm

TPU = ["--name=bert-large", "--zone=us-central2-b", "--accelerator_type=v4-32", "--project=proj",
       "--config=configs/bert_large.py", "--workdir=gs://b/run", "--repo_url=https://example.org/bert_jax.git"]


def tpu_commands(action: str, *extra: str) -> list[list[str]]:
    return tpu_vm.commands(action, tpu_vm_command.parse_args([action, *TPU, *extra]))


def test_tpu_create_asks_for_spot_or_queued_capacity():
    [create] = tpu_commands("create", "--spot")
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "bert-large"]
    assert {"--zone=us-central2-b", "--project=proj", "--accelerator-type=v4-32", "--spot"} <= set(create)
    [queued] = tpu_commands("create", "--queued", "--preemptible")
    assert queued[3:6] == ["queued-resources", "create", "bert-large"]
    assert {"--node-id=bert-large", "--runtime-version=tpu-ubuntu2204-base", "--preemptible"} <= set(queued)


def test_tpu_setup_and_run_reach_every_worker_with_the_overrides():
    [setup] = tpu_commands("setup")
    assert "--worker=all" in setup and "pip install -e . 'jax[tpu]" in setup[-1]
    [run] = tpu_commands("run", "--", "--config.mesh.shape=(1,-1,1)")
    assert run[3:6] == ["tpu-vm", "ssh", "bert-large"] and "--worker=all" in run
    remote = run[-1].removeprefix("--command=")
    assert ("python3 -m bert_jax.commands.pretrain --config=configs/bert_large.py --workdir=gs://b/run "
            "'--config.mesh.shape=(1,-1,1)'") in remote
    [logs] = tpu_commands("logs")
    assert "--worker=0" in logs
    assert [c[4] for c in tpu_commands("all")] == ["create", "ssh", "ssh"]
    assert tpu_commands("delete")[0][4] == "delete"


def test_tpu_dry_run_prints_without_running():
    out = subprocess.run([sys.executable, "-m", "bert_jax.commands.tpu_vm", "all", *TPU, "--dry_run"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert [shlex.split(line)[:5] for line in out] == [
        ["gcloud", "compute", "tpus", "tpu-vm", "create"],
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
        ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
    ]


def test_slurm_script_runs_one_task_per_gpu_with_auto_initialisation():
    args = slurm_command.parse_args(["--nodes=2", "--gpus_per_node=8", "--partition=gpu", "--workdir=/shared/r",
                                      "--config=configs/bert_large.py", "--", "--config.mesh.shape=(2,8,1)"])
    script = slurm.sbatch_script(args)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --partition=gpu"):
        assert line in script.splitlines()
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert shlex.split(srun)[2:] == [
        "python", "-m", "bert_jax.commands.pretrain", "--config=configs/bert_large.py", "--workdir=/shared/r",
        "--config.distributed.auto=True", "--config.mesh.shape=(2,8,1)",
    ]
    assert "$" not in script.replace("${", "")  # every template field was filled


def test_local_gives_each_process_its_id_and_the_coordinator():
    cmds = local.process_commands(["python", "-m", "bert_jax.commands.pretrain"], 2, 4321)
    assert [c[-3:] for c in cmds] == [
        ["--config.distributed.coordinator_address=127.0.0.1:4321", "--config.distributed.num_processes=2",
         f"--config.distributed.process_id={i}"] for i in range(2)
    ]
    env = local.process_env(4, {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=/x"})
    assert env["XLA_FLAGS"] == "--xla_dump_to=/x --xla_force_host_platform_device_count=4"
