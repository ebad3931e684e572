"""One wandb run per run: the id is derived once from the workdir and kept there, so a killed and
relaunched run logs into the same wandb run (wandb's offline mode, no network); launchers pass WANDB_*."""
import os
import subprocess
import sys

import pytest

from bert_jax.storage.workdir import Workdir
from bert_jax.run.metrics_writer import wandb_run_id

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One attempt of a run's metrics writer, as pretrain makes it; "kill" dies by SIGKILL after its first row.
ATTEMPT = """
import os, sys
import bert_jax.configs.tiny
from bert_jax.run.metrics_writer import MetricsWriter
c = bert_jax.configs.tiny.get_config()
c.logging.update(wandb_mode="offline", tensorboard=False, plots=False)
writer = MetricsWriter(sys.argv[1], c, int(sys.argv[2]))
print("ID", writer.wandb_run.id, flush=True)
writer.write(int(sys.argv[2]) + 1, {"train/loss": 1.0})
if sys.argv[3] == "kill":
    os.kill(os.getpid(), 9)
writer.close()
"""


def test_the_wandb_id_is_derived_once_from_the_workdir_and_kept(tmp_path):
    first = wandb_run_id(str(tmp_path / "bert base"))
    assert first.startswith("bert_base-") and len(first) == len("bert_base-") + 12
    assert (tmp_path / "bert base" / "wandb_id").read_text().strip() == first
    assert wandb_run_id(str(tmp_path / "bert base")) == first
    assert wandb_run_id(str(tmp_path / "other")) != first


@pytest.mark.slow  # two Python processes that load jax and wandb: ~12 s on 2 busy cores
def test_a_killed_and_relaunched_run_logs_into_one_offline_wandb_run(tmp_path):
    workdir = str(tmp_path / "run")
    env = {**os.environ, "WANDB_SILENT": "true", "WANDB_MODE": "offline", "JAX_PLATFORMS": "cpu"}
    killed = subprocess.run([sys.executable, "-c", ATTEMPT, workdir, "-1", "kill"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-2000:]
    relaunched = subprocess.run([sys.executable, "-c", ATTEMPT, workdir, "1", "finish"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=300, check=True)
    ids = [line.split()[1] for out in (killed.stdout, relaunched.stdout) for line in out.splitlines()
           if line.startswith("ID ")]
    assert ids == [Workdir(workdir).wandb_id.read_text().strip()] * 2
    attempts = sorted(d for d in os.listdir(os.path.join(workdir, "wandb")) if d.startswith("offline-run-"))
    assert len(attempts) == 2 and all(d.endswith(ids[0]) for d in attempts)  # two attempts, one run id


def test_launchers_pass_wandb_variables_to_the_workers_and_never_print_the_key(monkeypatch):
    from bert_jax.commands import slurm as slurm_command, tpu_vm as tpu_vm_command  # noqa: PLC0415
    from bert_jax.launch import shown, slurm, tpu_vm, wandb_env  # noqa: PLC0415

    monkeypatch.setenv("WANDB_API_KEY", "s3cr3t")
    monkeypatch.setenv("WANDB_ENTITY", "lab")
    assert wandb_env() == {"WANDB_API_KEY": "s3cr3t", "WANDB_ENTITY": "lab"}
    args = tpu_vm_command.parse_args(["run", "--name=n", "--zone=z", "--workdir=gs://b/w", "--", "--config.seed=1"])
    remote = tpu_vm.commands("run", args)[0][-1]
    assert "env WANDB_API_KEY=s3cr3t WANDB_ENTITY=lab python3 -m bert_jax.commands.pretrain" in remote
    assert "s3cr3t" not in shown(remote, wandb_env()) and "WANDB_API_KEY=***" in shown(remote, wandb_env())
    script = slurm.sbatch_script(slurm_command.parse_args(["--config=c.py", "--workdir=w"]))
    assert "#SBATCH --export=ALL" in script and "s3cr3t" not in script
