"""A check's refusal is the user's mistake (one line, exit status 2); a fault under it keeps its traceback (issue 76).

Each command that turns ValueErrors into `UserError`s is tried with both: a refusal a check raises on purpose, and a
ValueError the interpreter raises from a bug in the code under it (an unpacking gone wrong), which must come out as
itself, not as a one-line "bad input".
"""
import json
import sys
import types

import pytest

import bert_jax
import bert_jax.configs.tiny
from bert_jax.run.refusal import refusal


def _bug(*args, **kwargs):
    """A bug, as the interpreter reports it: a ValueError no check raised."""
    first, second = [1, 2, 3]  # noqa: F841
    return first


class _XlaError(RuntimeError):
    """What XLA raises (jax.errors.JaxRuntimeError is a RuntimeError): not a message of ours."""


def _caught(function) -> BaseException:
    try:
        function()
    except BaseException as error:  # noqa: BLE001
        return error
    raise AssertionError("nothing raised")


def test_a_raise_in_our_code_is_a_refusal_and_an_interpreter_or_library_error_is_not():
    from bert_jax.train import optimizer

    config = bert_jax.configs.tiny.get_config()
    config.train.optimizer = "sgd_with_typo"
    refused = refusal(_caught(lambda: optimizer.make_optimizer(config.train)))
    assert isinstance(refused, bert_jax.UserError) and "config.train.optimizer" in str(refused)
    assert refusal(_caught(_bug)) is None  # raised by UNPACK_SEQUENCE in a project module
    assert refusal(_caught(lambda: json.loads("{"))) is None  # a library's ValueError
    assert refusal(_caught(lambda: int("x"))) is None
    assert refusal(_caught(lambda: (_ for _ in ()).throw(MemoryError()))) is None
    user = bert_jax.UserError("config.x=1 is wrong")
    assert refusal(user) is user


def test_pretrain_check_config_keeps_a_fault_and_refuses_bad_input_in_one_line(monkeypatch):
    from bert_jax.train import config_validation

    config = bert_jax.configs.tiny.get_config()
    config.model.num_heads = 5
    with pytest.raises(bert_jax.UserError, match=r"config.model.num_heads=5 does not divide"):
        config_validation.check_config(config)
    monkeypatch.setattr(config_validation, "_resolved", _bug)
    with pytest.raises(ValueError, match="too many values to unpack") as raised:
        config_validation.check_config(bert_jax.configs.tiny.get_config())
    assert not isinstance(raised.value, bert_jax.UserError)


def test_a_fault_checking_a_stage_is_not_named_as_the_stage(monkeypatch):
    from bert_jax.train import config_validation

    config = bert_jax.configs.tiny.get_config("two_stage")
    calls = []

    def fails_at_the_second_stage(config, impl):  # stage 0's keys are checked outside the loop over stages
        calls.append(impl)
        return _bug() if len(calls) > 1 else None

    monkeypatch.setattr(config_validation, "check_context", fails_at_the_second_stage)
    with pytest.raises(ValueError, match="too many values to unpack") as raised:
        config_validation.validate_config(config)
    assert len(calls) == 2 and "from step" not in str(raised.value)


def test_finetune_check_config_keeps_a_fault_and_refuses_bad_input_in_one_line(monkeypatch):
    import bert_jax.configs.finetune.classification
    from bert_jax.finetune import config_validation

    config = bert_jax.configs.finetune.classification.get_config()
    config.seeds = "0,one"
    with pytest.raises(bert_jax.UserError, match=r"config.seeds='0,one' is not a comma-separated list"):
        config_validation.check_config(config)
    monkeypatch.setattr(config_validation, "get_task", _bug)
    with pytest.raises(ValueError, match="too many values to unpack") as raised:
        config_validation.check_config(bert_jax.configs.finetune.classification.get_config())
    assert not isinstance(raised.value, bert_jax.UserError)


@pytest.fixture
def fresh_flags():
    """Only the flags of the command under test: every command's flags defined before (pretrain marks --config and
    --workdir required when another test imports it) are set aside for the test and put back after, and the ones the
    command defines are deleted again (another command may define the same names)."""
    from absl import flags

    def commands_flags():
        return [(module, f) for module, defined in flags.FLAGS.flags_by_module_dict().items()
                if module.startswith("bert_jax.commands.") for f in defined]

    aside = commands_flags()
    for name in {f.name for _, f in aside}:
        delattr(flags.FLAGS, name)
    yield
    for name in {f.name for _, f in commands_flags()} & set(flags.FLAGS):
        delattr(flags.FLAGS, name)
    for module, flag in aside:
        if flag.name not in flags.FLAGS:
            flags.FLAGS[flag.name] = flag
        flags.FLAGS.register_flag_by_module(module, flag)
    if sys.modules.pop("bert_jax.commands.evaluate", None) is not None:  # it defines its flags at import
        del sys.modules["bert_jax.commands"].evaluate


def _command_status(module, argv, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit) as exited:
        module.main()
    return exited.value.code, capsys.readouterr().err


@pytest.mark.parametrize("fault", [False, True, "compiler_error"])
def test_evaluate_refuses_bad_input_with_status_2_and_keeps_a_fault(fault, monkeypatch, capsys, tmp_path,
                                                                    fresh_flags):
    from bert_jax.commands import evaluate
    from bert_jax.finetune import battery

    def refused(*args, **kwargs):  # a check of the battery's, as it refuses
        battery.seeds_of(None, 0)

    def compiler_error(*args, **kwargs):  # inside a run: not "a run the executor started that did not finish"
        raise _XlaError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4 GiB")

    monkeypatch.setattr(battery, "evaluate", {False: refused, True: _bug, "compiler_error": compiler_error}[fault])
    monkeypatch.setattr(battery, "process_config", lambda suite: None)
    monkeypatch.setattr("bert_jax.run.process_setup.setup_process", lambda *a, **k: None)
    argv = ["evaluate", f"--checkpoint={tmp_path}", "--suite=smoke", f"--out={tmp_path / 'out'}"]
    if fault:
        with pytest.raises(ValueError if fault is True else _XlaError):
            _command_status(evaluate, argv, monkeypatch, capsys)
    else:
        status, err = _command_status(evaluate, argv, monkeypatch, capsys)
        assert status == 2 and "--seeds=0: at least one seed per task" in err and "Traceback" not in err


@pytest.mark.parametrize("fault", [False, True])
def test_extend_vocab_refuses_bad_input_with_status_2_and_keeps_a_fault(fault, monkeypatch, capsys, tmp_path,
                                                                        fresh_flags):
    from bert_jax.commands import extend_vocab
    from bert_jax.finetune import battery

    def refused(request):  # a check of the battery's, as it refuses (extend-vocab's own need a model folder)
        battery.seeds_of(None, 0)

    monkeypatch.setattr(extend_vocab, "extend_vocab", _bug if fault else refused)
    monkeypatch.setattr(extend_vocab.process_setup, "setup_process", lambda *a, **k: None)
    argv = ["extend-vocab", f"--from={tmp_path}", "--corpus=embedded", f"--out={tmp_path / 'out'}"]
    if fault:
        with pytest.raises(ValueError, match="too many values to unpack"):
            _command_status(extend_vocab, argv, monkeypatch, capsys)
    else:
        status, err = _command_status(extend_vocab, argv, monkeypatch, capsys)
        assert status == 2 and "--seeds=0: at least one seed per task" in err and "Traceback" not in err


def _checked_checkpoint(monkeypatch, parse):
    """battery.check_checkpoint over the smoke suite's first task, its encoder and tokenizer stand-ins, the task's
    rows parsed by `parse`."""
    from bert_jax.configs.suites import load_suite
    from bert_jax.finetune import battery

    suite = load_suite("smoke")
    name = next(iter(suite.tasks))
    source = types.SimpleNamespace(family=types.SimpleNamespace(name="bert"), tokenizer_dir="")
    monkeypatch.setattr(battery.init_from, "resolve", lambda checkpoint, model: source)
    monkeypatch.setattr(battery.tokenizer_lib, "load_tokenizer", lambda path: None)
    task = types.SimpleNamespace(parse=parse)
    monkeypatch.setattr(battery, "get_task", lambda kind: task)
    rows = battery.TaskData(train=[{"text_a": "good", "label": "1"}], dev=[], sources={}, skipped=None)
    return lambda: battery.check_checkpoint(suite, [name], "runs/x", {name: rows})


def test_a_fault_building_a_battery_task_is_not_named_the_checkpoint_s(monkeypatch):
    from bert_jax.finetune import battery

    with pytest.raises(ValueError, match="too many values to unpack") as raised:
        _checked_checkpoint(monkeypatch, _bug)()
    assert "--checkpoint" not in str(raised.value)
    check = _checked_checkpoint(monkeypatch, None)
    monkeypatch.setattr(battery.init_from, "resolve", _bug)  # a fault reading the checkpoint itself
    with pytest.raises(ValueError, match="too many values to unpack") as raised:
        check()
    assert "--checkpoint" not in str(raised.value)


def test_a_family_that_refuses_a_battery_task_is_named_with_the_checkpoint(monkeypatch):
    from bert_jax.finetune import battery

    refuses = lambda *args: battery.seeds_of(None, 0)  # noqa: E731 (a check's refusal, as the family's would be)
    with pytest.raises(ValueError, match=r"--checkpoint=runs/x: its family 'bert' cannot fine-tune task \w+ .*"
                                         r"--seeds=0"):
        _checked_checkpoint(monkeypatch, refuses)()



@pytest.mark.parametrize("fault", ["bug", "compiler_error", "compiler_missing"])
def test_plan_names_a_missing_compiler_in_one_line_and_keeps_a_fault(fault, monkeypatch, capsys, fresh_flags):
    from bert_jax.commands import plan
    from bert_jax.plan import gpu_cards

    def compiler_error(*args):
        raise _XlaError("INTERNAL: during context [hlo verifier]: a bug in a compiler pass")

    monkeypatch.setattr(gpu_cards, "plugin_available", lambda: False)
    planned = {"bug": _bug, "compiler_error": compiler_error,
               "compiler_missing": lambda *args: gpu_cards.gpu_devices(None)}[fault]
    monkeypatch.setattr(plan, "_plan", planned)
    argv = ["plan", f"--config={bert_jax.configs.tiny.__file__}"]
    if fault == "compiler_missing":
        status, err = _command_status(plan, argv, monkeypatch, capsys)
        assert status != 0 and "needs the CUDA plugin" in str(status) + err
    else:
        with pytest.raises(ValueError if fault == "bug" else _XlaError):
            _command_status(plan, argv, monkeypatch, capsys)


def _faulty_checks():
    """(name, how to make its check meet a bug, the check): checks that name the user's input around what they call."""
    import bert_jax.configs.tiny as tiny
    from bert_jax.finetune import beir, downstream_probe, init_from, zero_shot
    from bert_jax.vocab import extension

    def probe(monkeypatch):
        monkeypatch.setattr(downstream_probe.battery, "select_tasks", _bug)
        config = tiny.get_config()
        config.eval.downstream_suite, config.eval.downstream_data_dir = "smoke", "glue"
        return lambda: downstream_probe.DownstreamProbe(config, "w", suite=None)

    def retrieval(monkeypatch):
        monkeypatch.setattr(beir, "read", lambda beir_dir, name: None)
        monkeypatch.setattr(init_from, "resolve", _bug)
        suite = types.SimpleNamespace(retrieval=types.SimpleNamespace(finetune=types.SimpleNamespace(model=None)))
        return lambda: zero_shot.prepare("runs/x", suite, "beir", ["scifact"])

    def corpus(monkeypatch):
        monkeypatch.setattr(extension.sources, "check_source", _bug)
        return lambda: extension._check_corpus("domain.txt", None)

    def distillation_teacher(monkeypatch):
        from bert_jax.train import teacher

        config = tiny.get_config()
        frozen = types.SimpleNamespace(model=types.SimpleNamespace(apply=_bug), init_params=lambda data: {},
                                       model_cfg=config.model, path="runs/teacher",
                                       family=types.SimpleNamespace(name="bert"))
        return lambda: teacher._check_outputs(frozen, config)

    return {"downstream_probe": probe, "zero_shot": retrieval, "extend_vocab_corpus": corpus,
            "distillation_teacher": distillation_teacher}


@pytest.mark.parametrize("site", ["downstream_probe", "zero_shot", "extend_vocab_corpus", "distillation_teacher"])
def test_a_fault_under_a_check_that_names_the_input_is_raised_as_itself(site, monkeypatch):
    check = _faulty_checks()[site](monkeypatch)
    with pytest.raises(ValueError) as raised:
        check()
    assert str(raised.value) == "too many values to unpack (expected 2)"  # as it was raised: not named the input's
    assert not isinstance(raised.value, bert_jax.UserError)
