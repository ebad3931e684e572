"""What `pip install` puts on a user's machine: bert_jax and data_pipelines, with configs/ and launch/ inside the
library (as bert_jax.configs and bert_jax.launch, never top-level packages whose generic names would collide with
the user's own), and a library whose import leaves the environment alone."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A process as a user starts it: no JAX platform chosen, the repository not on the import path.
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "PYTHONPATH")}


def python(code: str, cwd) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=CLEAN_ENV, capture_output=True, text=True,
                          check=True, timeout=120).stdout


# In another directory: what the library's import changes in the environment, where each name is found, and a config
# file loaded by path as ml_collections loads --config (its own `from bert_jax.configs import base` must resolve).
PROBE = f"""
import importlib.util, json, os
before = dict(os.environ)
import bert_jax, bert_jax.configs.tiny, bert_jax.launch.sweep, bert_jax.run.command_line
changed = sorted(set(os.environ.items()) ^ set(before.items()))
spec = importlib.util.spec_from_file_location("config", {os.path.join(REPO, "configs", "roberta_base.py")!r})
config = importlib.util.module_from_spec(spec)
spec.loader.exec_module(config)
print(json.dumps(dict(changed=changed, family=config.get_config().model.family, origins={{
    name: (importlib.util.find_spec(name) or None) and importlib.util.find_spec(name).origin
    for name in ("configs", "launch", "bert_jax.configs.tiny", "bert_jax.launch.sweep")}})))
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return json.loads(python(PROBE, tmp_path_factory.mktemp("elsewhere")))


def test_configs_and_launch_are_installed_inside_the_library_only(probe):
    origins = {name: origin and origin.replace(os.sep, "/") for name, origin in probe["origins"].items()}
    assert origins["configs"] is None and origins["launch"] is None
    assert origins["bert_jax.configs.tiny"].endswith("configs/tiny.py")
    assert origins["bert_jax.launch.sweep"].endswith("launch/sweep.py")


def test_a_config_file_loads_by_path_from_any_directory(probe):
    assert probe["family"] == "roberta"


def test_importing_the_library_changes_no_environment_variable(probe):
    assert probe["changed"] == []


@pytest.mark.slow  # a command's start-up (seconds)
def test_show_config_takes_a_config_by_absolute_path_from_another_directory(tmp_path):
    shown = subprocess.run([sys.executable, "-m", "bert_jax.commands.show_config",
                            f"--config={os.path.join(REPO, 'configs', 'roberta_base.py')}"],
                           cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "family: roberta" in shown.stdout


def test_a_command_runs_jax_on_the_cpu_on_a_host_with_libtpu_but_no_tpu(tmp_path):
    if importlib.util.find_spec("libtpu") is None or any(os.path.exists(d) for d in ("/dev/accel0", "/dev/vfio/0")):
        pytest.skip("needs libtpu installed on a host without a TPU")
    chosen = python("import os, sys\n"
                    "from bert_jax.run import command_line\n"
                    "sys.argv = ['bert_jax/commands/probe.py']\n"
                    "command_line.run(lambda argv: print(os.environ.get('JAX_PLATFORMS')))\n", cwd=str(tmp_path))
    assert chosen.strip() == "cpu"


@pytest.mark.slow  # builds the wheel (seconds on 2 cores)
def test_the_wheel_holds_the_library_configs_and_launchers_and_no_generic_top_level_package(tmp_path):
    source = tmp_path / "source"  # a copy: setuptools builds in the source tree (build/, *.egg-info)
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "bert_jax", "data_pipelines", "configs", "launch"):
        copy = shutil.copytree if os.path.isdir(os.path.join(REPO, name)) else shutil.copy
        copy(os.path.join(REPO, name), source / name,
             **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "wheel"), str(source)], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "wheel").iterdir()
    files = zipfile.ZipFile(wheel).namelist()
    assert {f.split("/")[0] for f in files} == {"bert_jax", "data_pipelines", wheel.name.split("-")[0] + "-" +
                                                 wheel.name.split("-")[1] + ".dist-info"}
    for needed in ("bert_jax/configs/tiny.py", "bert_jax/configs/suites/smoke.py", "bert_jax/configs/sweeps/tiny_lr.py",
                   "bert_jax/launch/sweep.py", "bert_jax/launch/slurm.sbatch", "bert_jax/commands/sweep.py"):
        assert needed in files, needed
