"""`bert-jax`: the command list, each command's --help, `show-config`, and the commands the docs give.

The docs' commands are what a newcomer copies: every `bert-jax ...` in README.md and docs/ must name a
command and flags that exist, and every one in the recipe pages (README.md, the quick start, the guides)
must show its help and have its config and overrides accepted by `show-config`, so that a renamed flag or
config key fails here rather than in a reader's terminal.

Every command's help runs in one subprocess (commands define absl flags, which would clash with one
another, and with other tests, in the pytest process): the driver runs `bert-jax <args>` in turn as the
console script does, and drops the flags each one defined before the next.
"""
import ast
import glob
import importlib.util
import itertools
import json
import pathlib
import re
import shlex
import subprocess
import sys
import typing

import pytest

from bert_jax import cli

# Runs `bert-jax <args>` for each args in turn, in one process; with a second argument `--track_files`, each result
# also lists the files created and removed under the working directory (tests/test_bad_input.py runs it that way).
DRIVER = r"""
import contextlib, io, json, os, pathlib, sys, traceback
from absl import flags
from bert_jax import cli

track = sys.argv[2:] == ["--track_files"]

def tree():
    return {str(p) for p in pathlib.Path(".").rglob("*")} if track else set()

results = {}
for args in json.loads(sys.argv[1]):
    before, files = set(flags.FLAGS), tree()
    os.environ.pop("MALLOC_ARENA_MAX", None)  # set by the process setup (bert_jax/run/process_setup.py): one per command
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["bert-jax", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
        except SystemExit as e:  # a str code is what Python prints, with status 1
            code = e.code if isinstance(e.code, int) or e.code is None else (print(e.code, file=sys.stderr) or 1)
        except Exception:  # a traceback: recorded as this command's result, not the end of the rest
            traceback.print_exc(file=sys.stderr)
            code = 1
    for name in set(flags.FLAGS) - before:  # the command's own flags and its config's overrides
        module = flags.FLAGS.find_module_defining_flag(name) or ""
        if name.startswith("config") or module.endswith(".py"):
            delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
    now = tree()
    results[" ".join(args)] = {"code": code or 0, "out": out.getvalue(), "err": err.getvalue(),
                               "created": sorted(now - files), "removed": sorted(files - now),
                               "arenas": os.environ.get("MALLOC_ARENA_MAX")}
print(json.dumps(results))
"""

# Each command's help must name these (its flags; for a config file, how to list the config's keys).
HELP_NAMES = {
    "pretrain": ("--config", "--workdir", "bert-jax show-config"),
    "show-config": ("--config",),
    "tokenizer": ("--config", "--out", "--vocab_size", "bert-jax show-config"),
    "prepare": ("--config", "--out", "--num_workers", "--docs_per_shard", "bert-jax show-config"),
    "prepare-beam": ("--config", "--out", "--num_shards", "overwrite", "bert-jax show-config"),
    "export": ("--workdir", "--out", "--step", "--ema", "--format"),
    "average": ("--from", "--weights", "--out"),
    "extend-vocab": ("--from", "--corpus", "--add", "--out"),
    "plan": ("--config", "--tpu", "--num_devices", "--search", "bert-jax show-config"),
    "inspect": ("--from", "--text", "--mode"),
    "finetune": ("--config", "--workdir", "bert-jax show-config"),
    "finetune-export": ("--workdir", "--out"),
    "evaluate": ("--checkpoint", "--suite", "--glue_dir", "--beir_dir", "--tasks", "--seeds", "--out"),
    "mine-pairs": ("--corpus", "--out", "--max_documents"),
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
    # What the run would refuse, show-config refuses (issue 50): the one check both run.
    ["show-config", "--config=configs/tiny.py", "--config.train.optimizer=adamx"],
    ["show-config", "--config=configs/tiny.py", "--config.data.source=txt"],
    ["show-config", "--config=configs/tiny.py", "--config.data.source=text", "--config.data.path=no_such_corpus/*.txt"],
    ["show-config", "--config=configs/finetune/classification.py", "--config.init_from=no_such_run"],
    ["show-config", "--config=configs/tiny.py", "--config.data.mask_rate=1.5"],
    ["show-config", "--config=configs/tiny.py", "--config.data.mixture.books.on_exhausted=stop",
     "--config.data.mixture.books.fraction=0.5"],
    # A mixture from overrides alone, on a config that defines none.
    ["show-config", "--config=configs/tiny.py", "--config.data.mixture.a.source=text",
     "--config.data.mixture.a.path=README.md", "--config.data.mixture.a.weight=0.7",
     "--config.data.mixture.b.source=text", "--config.data.mixture.b.path=docs/guides/runs.md",
     "--config.data.mixture.b.weight=0.3"],
    ["show-config", "--config=configs/tiny.py:two_stage"],
    ["show-config", "--config=configs/tiny.py:nosuch"],  # the config file's own message, not ml_collections' wrapper
]


@pytest.fixture(scope="module")
def ran():
    helps, configs = recipe_runs()  # the documented commands' sub-commands and configs, below
    runs = unique([[name, "--help"] for name in cli.COMMANDS] + SHOW_CONFIG + helps + configs)
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
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


@pytest.mark.parametrize("run, says", [
    (2, "num_heads=7 does not divide"), (3, "mask_rate=many"), (4, "no_such_config.py"),
    (5, "config.init_from is empty"), (6, "config.train.optimizer='adamx'"), (7, "config.data.source='txt'"),
    (8, "config.data.path='no_such_corpus/*.txt'"), (9, "config.init_from='no_such_run'"),
    (10, "config.data.mask_rate=1.5 must be in (0, 1)"),  # the key the user set, not the cap derived from it
    (11, "--config.data.mixture.books.fraction=0.5: a mixture source has no key 'fraction'; its keys: weight, "
         "on_exhausted, size, source, path"),
    (14, "show-config: --config=configs/tiny.py:nosuch: the only variant is 'two_stage'")])
def test_show_config_refuses_a_bad_value_or_file_in_one_line(ran, run, says):
    result = ran[" ".join(SHOW_CONFIG[run])]
    assert result["code"] != 0 and result["out"] == ""
    lines = result["err"].strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result["err"]


def test_show_config_resolves_a_mixture_given_by_overrides_alone(ran):
    result = ran[" ".join(SHOW_CONFIG[12])]
    assert result["code"] == 0, result["err"]
    mixture = result["out"].split("  mixture:\n", 1)[1].split("  mixture_alpha:", 1)[0]
    assert mixture.split() == ["a:", "path:", "README.md", "source:", "text", "weight:", "0.7",
                               "b:", "path:", "docs/guides/runs.md", "source:", "text", "weight:", "0.3"]


def test_show_config_prints_what_each_later_stage_changes(ran):
    result = ran[" ".join(SHOW_CONFIG[13])]
    assert result["code"] == 0, result["err"]
    stage = result["out"].split("# stage 1, steps 241 to 300:\n", 1)[1]
    assert stage.split() == ["data.max_predictions_per_seq:", "20", "data.max_seq_length:", "128"]


ROOT = pathlib.Path(__file__).resolve().parents[1]
# The usage lines of the commands' and the configs' docstrings (what `--help` prints, what a config file says runs it).
DOCSTRINGS = [*sorted((ROOT / "bert_jax" / "commands").glob("*.py")), *sorted((ROOT / "configs").rglob("*.py"))]
# The pages whose recipes a reader copies: each command there must show its help and its config must resolve.
RECIPE_PAGES = [ROOT / "README.md", ROOT / "docs" / "quickstart.md", *sorted((ROOT / "docs" / "guides").glob("*.md")),
                *DOCSTRINGS]
ALL_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *DOCSTRINGS]
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
COMMAND_START = re.compile(r"(?<![\w./-])(?:bert-jax|python3? -m)\s")
MODULE_FAMILIES = ("bert_jax", "data_pipelines", "launch")
# What stands for the reader's own data: an upper-case word (X, BUCKET, HF_FOLDER), <...>, or an ellipsis.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]*\b|<[^>]*>|\.\.\.")
# A line of the design's contract naming an interface an open issue will build: not a command yet.
PLANNED = "(planned, issue"


def command_lines(page: pathlib.Path) -> list[str]:
    """The shell lines of a page: lines of its shell code blocks (joined where they end in a backslash) and its
    inline code spans, but for lines that say the interface is planned. A Python file's page is its module
    docstring, whose indented lines are its code block."""
    if page.suffix == ".py":
        text = ast.get_docstring(ast.parse(page.read_text())) or ""
        text = re.sub(r"((?:\n(?: {4}| {2}).*)+)", lambda block: "\n```bash" + block.group(1) + "\n```", text)
    else:
        text = page.read_text()
    lines, fence, pending = [], None, ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip() if fence is None else None
            continue
        if fence is None:
            if PLANNED not in line:
                lines += re.findall(r"`([^`]+)`", line)
        elif fence in SHELL_FENCES:
            pending += stripped.removeprefix("$ ")
            if pending.endswith("\\"):
                pending = pending[:-1] + " "
            else:
                lines.append(pending)
                pending = ""
    return lines


def words(text: str) -> list[str]:
    """Shell words up to the end of the command (a pipe, `&&`, `;`, a redirection or a comment)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out = []
    try:
        for word in lexer:
            if word in ("|", "||", "&&", ";", ">", ">>", "&", "2>&1") or word.startswith(("#", ">", "2>")):
                break
            out.append(word)
    except ValueError:  # an unbalanced quote in a prose fragment: take what was read
        pass
    return out


class Invocation(typing.NamedTuple):
    page: str
    name: str  # the `bert-jax` command, or the module run with `python -m`
    sub: str  # a sub-command word (`sweep run`, `tpu-vm all`), or ""
    words: list[str]  # the flags and arguments after the name (and the sub-command)

    def flags(self) -> list[str]:
        """The names of the command's own flags: those before `--`, `--config.a.b` overrides left out."""
        own = itertools.takewhile(lambda word: word != "--", self.words)
        return [word.lstrip("[")[2:].split("=")[0].rstrip("]") for word in own
                if re.match(r"\[?--[a-z]", word) and not word.lstrip("[").startswith("--config.")]

    def config(self) -> tuple[str, list[str]] | None:
        """(--config's file, its --config.* overrides), or None for a command without --config."""
        given = [word.lstrip("[").rstrip("]") for word in self.words]
        files = [word.split("=", 1)[1] for word in given if word.startswith("--config=")]
        if not files:
            return None
        return files[0], [word for word in given if word.startswith("--config.")]


def documented_invocations(pages=ALL_PAGES) -> list[Invocation]:
    """Each `bert-jax ...` and `python -m <bert_jax|data_pipelines|launch>...` command line of the pages."""
    found = []
    for page in pages:
        for line in command_lines(page):
            starts = [match.start() for match in COMMAND_START.finditer(line)]
            for start, end in zip(starts, [*starts[1:], len(line)]):
                said = words(line[start:end])
                if not said:
                    continue
                console_script = said[0] == "bert-jax"
                said = said[1:] if console_script else said[2:]
                if not said or not (re.fullmatch(r"[a-z][a-z-]*", said[0]) if console_script else is_module(said[0])):
                    continue  # `bert-jax <command>`, `python -m pytest`, `python -m bench.x`
                name, rest = said[0], said[1:]
                sub = rest[0] if rest and re.fullmatch(r"[a-z][a-z_-]*", rest[0]) else ""
                found.append(Invocation(str(page.relative_to(ROOT)), name, sub, rest[1:] if sub else rest))
    return found


def is_module(name: str) -> bool:
    return name.split(".")[0] in MODULE_FAMILIES


def recipe_runs() -> tuple[list[list[str]], list[list[str]]]:
    """The `--help` runs of every command (and sub-command) the recipe pages name, and the `show-config` runs
    of their configs; those whose config file is a placeholder (configs/X.py) or whose overrides name a bucket
    (which this test does not reach) are left out."""
    helps, configs = [], []
    for invocation in documented_invocations(RECIPE_PAGES):
        if is_module(invocation.name):
            continue
        helps.append([invocation.name, *([invocation.sub] if invocation.sub else []), "--help"])
        config = invocation.config()
        if config is None or PLACEHOLDER.search(config[0]) or any("://" in o for o in config[1]):
            continue
        configs.append(["show-config", f"--config={config[0]}", *config[1]])
    return unique(helps), unique(configs)


def unique(runs: list[list[str]]) -> list[list[str]]:
    """The runs without repeats, in order."""
    return [list(run) for run in dict.fromkeys(map(tuple, runs))]


def test_every_documented_command_exists():
    modules = {module for module, _ in cli.COMMANDS.values()}
    unknown = set()
    for invocation in documented_invocations():
        name = invocation.name
        if is_module(name):
            if name not in modules and importlib.util.find_spec(name) is None:
                unknown.add((invocation.page, f"python -m {name}"))
        elif name not in cli.COMMANDS:
            unknown.add((invocation.page, f"bert-jax {name}"))
    assert not unknown, f"the docs name commands that do not exist: {sorted(unknown)}"


def is_beam_pipeline_option(flag: str) -> bool:
    from apache_beam.options.pipeline_options import PipelineOptions  # noqa: PLC0415 (only where the docs use one)
    return bool(PipelineOptions([f"--{flag}=7"]).get_all_options(drop_default=True))


# Commands that hand the flags they do not define on to another program, and the check of those.
PASSED_ON = {"prepare-beam": is_beam_pipeline_option}


def test_every_documented_flag_is_in_its_commands_help(ran):
    by_module = {module: command for command, (module, _) in cli.COMMANDS.items()}
    missing = set()
    for invocation in documented_invocations():
        command = invocation.name if invocation.name in cli.COMMANDS else by_module.get(invocation.name)
        if command is None:
            continue
        help_run = ran.get(" ".join([command, invocation.sub, "--help"])) if invocation.sub else None
        text = (help_run or ran[f"{command} --help"])["out"]
        for flag in invocation.flags():
            if (not re.search(rf"--(\[no\])?{re.escape(flag)}(?![\w-])", text) and flag not in ("help", "helpfull")
                    and not (command in PASSED_ON and PASSED_ON[command](flag))):
                missing.add((invocation.page, command, f"--{flag}"))
    assert not missing, f"the docs name flags their command does not have: {sorted(missing)}"


def test_the_docs_name_each_command_one_way():
    """README.md and the site write `bert-jax <command>`; only the design page's contract table keeps the
    `python -m` names it fixes (aliases that still run)."""
    modules = sorted({f"{inv.page}: python -m {inv.name}" for inv in documented_invocations()
                      if is_module(inv.name) and inv.page != "docs/design.md"})
    assert not modules, f"write these as `bert-jax <command>`: {modules}"


def test_every_command_the_recipes_name_shows_its_help(ran):
    helps, _ = recipe_runs()
    failed = {" ".join(run): ran[" ".join(run)]["code"] for run in helps if ran[" ".join(run)]["code"] != 0}
    assert not failed, f"`bert-jax ... --help` exited non-zero: {failed}"


def test_every_config_the_recipes_name_resolves_in_show_config(ran):
    """A documented config with its overrides passes `show-config`, or is refused only for the reader's own data
    (a path absent here, a placeholder value), named in the refusal: a renamed key or a bad value fails."""
    _, configs = recipe_runs()
    assert configs, "no documented config found"
    refused = {}
    for run in configs:
        result = ran[" ".join(run)]
        file = run[1].split("=", 1)[1].split(":")[0]
        assert (ROOT / file).is_file(), f"the docs name {file}, which does not exist"
        if result["code"] == 0:
            continue
        own_data = [value for value in (o.split("=", 1)[1] for o in run[2:] if "=" in o)
                    if PLACEHOLDER.search(value) or ("/" in value and not glob.glob(str(ROOT / value)))]
        if not any(value in result["err"] for value in own_data) or "has no key" in result["err"]:
            refused[" ".join(run)] = result["err"].strip()[-500:]
    assert not refused, f"documented configs that show-config refuses: {refused}"


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_help_exits_0_with_the_docstring_as_written_and_no_install_path(ran, command):
    result = ran[f"{command} --help"]
    assert result["code"] == 0, result["err"]
    assert str(ROOT) not in result["out"] and "site-packages" not in result["out"], result["out"]
    if "\nflags:\n" in result["out"]:  # an absl command: its module docstring heads the help, line for line
        lines = set(result["out"].splitlines())
        module_file = cli.COMMANDS_DIR / f"{cli.COMMANDS[command][0].rsplit('.', 1)[1]}.py"
        written = ast.get_docstring(ast.parse(module_file.read_text()), clean=False)
        broken = [line for line in written.strip("\n").splitlines() if line.strip() and line.rstrip() not in lines]
        assert not broken, f"bert-jax {command} --help reflows its docstring: {broken}"
