"""`bert-jax`: the command list, each command's --help, and `show-config`.

Every command's help runs in one subprocess (commands define absl flags, which would clash with one
another, and with other tests, in the pytest process): the driver runs `bert-jax <args>` in turn as the
console script does, and drops the flags each one defined before the next.
"""
import importlib.util
import json
import pathlib
import re
import subprocess
import sys

import pytest

from bert_jax import cli

DRIVER = r"""
import contextlib, io, json, sys
from absl import flags
from bert_jax import cli

results = {}
for args in json.loads(sys.argv[1]):
    before = set(flags.FLAGS)
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["bert-jax", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as e:  # a str code is what Python prints, with status 1
            code = e.code if isinstance(e.code, int) or e.code is None else (print(e.code, file=sys.stderr) or 1)
    for name in set(flags.FLAGS) - before:  # the command's own flags and its config's overrides
        module = flags.FLAGS.find_module_defining_flag(name) or ""
        if name.startswith("config") or module.endswith(".py"):
            delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
    results[" ".join(args)] = {"code": code or 0, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps(results))
"""

# Each command's help must name these (its flags; for a config file, how to list the config's keys).
HELP_NAMES = {
    "pretrain": ("--config", "--workdir", "bert-jax show-config"),
    "show-config": ("--config",),
    "tokenizer": ("--config", "--out", "--vocab_size", "bert-jax show-config"),
    "prepare": ("--config", "--out", "--num_workers", "--docs_per_shard", "bert-jax show-config"),
    "prepare-beam": ("--config", "--out", "--num_shards", "overwrite", "bert-jax show-config"),
    "export": ("--workdir", "--out", "--step", "--format"),
    "extend-vocab": ("--from", "--corpus", "--add", "--out"),
    "plan": ("--config", "--tpu", "--num_devices", "--search", "bert-jax show-config"),
    "inspect": ("--from", "--text", "--mode"),
    "finetune": ("--config", "--workdir", "bert-jax show-config"),
    "finetune-export": ("--workdir", "--out"),
    "evaluate": ("--checkpoint", "--suite", "--glue_dir", "--tasks", "--seeds", "--out"),
    "sweep": ("run", "summary"),
    "tpu-vm": ("--zone", "--accelerator_type"),
    "slurm": ("--nodes", "--gpus_per_node"),
    "local": ("--num_processes", "--devices_per_process"),
    "ray-tpu": ("--tpu", "--workdir"),
}
SHOW_CONFIG = [
    ["show-config", "--config=configs/roberta_base.py", "--config.data.mask_rat=0.3"],
    ["show-config", "--config=configs/roberta_base.py", "--config.data.mask_rate=0.25"],
    ["show-config", "--config=configs/roberta_base.py", "--config.model.num_heads=7"],
    ["show-config", "--config=configs/roberta_base.py", "--config.data.mask_rate=many"],
    ["show-config", "--config=configs/no_such_config.py"],
    ["show-config", "--config=configs/finetune/classification.py"],
]


@pytest.fixture(scope="module")
def ran():
    runs = [[name, "--help"] for name in cli.COMMANDS] + SHOW_CONFIG
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_help_lists_every_command_with_what_it_does(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["bert-jax", "--help"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    for name, (_, about) in cli.COMMANDS.items():
        assert any(line.split() and line.split()[0] == name and about in line for line in lines), name


def test_an_unknown_command_is_named_with_the_list(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bert-jax", "pretrian"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert "unknown command 'pretrian'" in exit_.value.code and "pretrain" in exit_.value.code


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_each_commands_help_shows_its_flags(ran, command):
    text = " ".join(ran[f"{command} --help"]["out"].split())  # help wraps long lines
    missing = [name for name in HELP_NAMES[command] if name not in text]
    assert not missing, f"bert-jax {command} --help lacks {missing}:\n{text}"


def test_every_command_has_its_help_checked():
    assert set(HELP_NAMES) == set(cli.COMMANDS)


def test_a_mistyped_override_is_one_line_naming_it_and_the_key_meant(ran):
    result = ran[" ".join(SHOW_CONFIG[0])]
    assert result["code"] != 0
    lines = result["err"].strip().splitlines()
    assert len(lines) == 1 and "mask_rat" in lines[0] and "did you mean 'mask_rate'" in lines[0], result["err"]


def test_show_config_prints_the_resolved_config_with_the_override(ran):
    result = ran[" ".join(SHOW_CONFIG[1])]
    assert result["code"] == 0, result["err"]
    assert "mask_rate: 0.25" in result["out"] and "family: roberta" in result["out"]


@pytest.mark.parametrize("run, says", [(2, "num_heads=7 does not divide"), (3, "mask_rate=many"),
                                       (4, "no_such_config.py"), (5, "config.init_from is empty")])
def test_show_config_refuses_a_bad_value_or_file_in_one_line(ran, run, says):
    result = ran[" ".join(SHOW_CONFIG[run])]
    assert result["code"] != 0 and result["out"] == ""
    lines = result["err"].strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result["err"]


ROOT = pathlib.Path(__file__).resolve().parents[1]
INVOCATION = re.compile(r"(?:bert-jax ([a-z][a-z-]*)|python3? -m ((?:bert_jax|data_pipelines|launch)[\w.]*))"
                                      r"((?: +(?!bert-jax|python)[^ `|\\]+)*)")
FLAG = re.compile(r"(?<![\w.-])--([a-z][a-z0-9_]*)(?=[= ]|$)")


def documented_invocations() -> list[tuple[str, str, str, list[str]]]:
    """(file, command or module, the text after it, its flags) for each command line in README.md and docs/."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for line in path.read_text().splitlines():
            for match in INVOCATION.finditer(line):
                name, rest = match.group(1) or match.group(2), match.group(3)
                found.append((str(path.relative_to(ROOT)), name, rest, FLAG.findall(rest)))
    return found


def test_every_documented_command_exists():
    modules = {module for module, _ in cli.COMMANDS.values()}
    unknown = set()
    for file, name, _, _ in documented_invocations():
        if "." in name or name in ("bert_jax", "data_pipelines", "launch"):
            if name not in modules and importlib.util.find_spec(name) is None:
                unknown.add((file, f"python -m {name}"))
        elif name not in cli.COMMANDS:
            unknown.add((file, f"bert-jax {name}"))
    assert not unknown, f"the docs name commands that do not exist: {sorted(unknown)}"


def test_every_documented_flag_is_in_its_commands_help(ran):
    by_module = {module: command for command, (module, _) in cli.COMMANDS.items()}
    missing = set()
    for file, name, _, flag_names in documented_invocations():
        command = name if name in cli.COMMANDS else by_module.get(name)
        if command is None:
            continue
        text = ran[f"{command} --help"]["out"]
        for flag in flag_names:
            if f"--{flag}" not in text and f"--[no]{flag}" not in text and flag not in ("help", "helpfull"):
                missing.add((file, command, f"--{flag}"))
    assert not missing, f"the docs name flags their command does not have: {sorted(missing)}"
