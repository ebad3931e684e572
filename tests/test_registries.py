"""Registries (bert_jax/registry.py): the one place a name a user writes becomes behaviour.

A family, task kind, tokenizer kind, data source, example builder, masking mode, schedule, optimizer and launch
executor is looked up by name in its registry; nothing else in the library compares its name with a string, so a
new one is one registration, and an unknown one is refused by one message that names the key, the value and what
is known.
"""
import ast
import pathlib

import ml_collections
import pytest

import bert_jax
from bert_jax.registry import Registry
from data_pipelines.sources import documents as sources
from data_pipelines.sources.source import TableSource

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = ("bert_jax", "data_pipelines", "launch")
# The settings that name a registered entry: comparing one with a string literal is a switch the registry replaces.
REGISTERED_NAMES = {"kind", "source", "executor", "example_builder", "masking", "schedule", "optimizer"}


def test_an_unknown_name_is_a_user_error_naming_the_key_the_value_and_the_closest():
    registry = Registry("config.data.example_builder", "example builders")
    for name in ("nsp", "sop", "packed"):
        registry.register(name, object())
    with pytest.raises(bert_jax.UserError) as error:
        registry.get("nps")
    assert str(error.value) == ("config.data.example_builder='nps' is unknown; known example builders: nsp, packed, "
                                "sop; did you mean 'nsp'?")
    with pytest.raises(bert_jax.UserError, match=r"^config.data.mixture.web.source='zzz' is unknown; known [^;]*$"):
        registry.get("zzz", "config.data.mixture.web.source")  # nothing close: no guess
    with pytest.raises(ValueError, match="'nsp' is registered twice"):
        registry.register("nsp", object())


def test_a_temporary_source_is_read_like_a_built_in_one_and_is_gone_after():
    class Letters(TableSource):
        def table(self, stats=None):
            return [["a b"], [], ["c"]]

        def fingerprint(self):
            return {"source": self.name}

    cfg = ml_collections.ConfigDict(dict(source="letters"))
    with sources.SOURCES.temporary("letters", Letters):
        Letters.name = "letters"
        assert sources.is_random_access(cfg)
        assert list(sources.iter_documents(cfg)) == [["a b"], ["c"]]  # the empty one left out
    with pytest.raises(bert_jax.UserError, match="config.data.source='letters' is unknown"):
        sources.check_source(cfg)


def _string_switches(tree: ast.AST) -> list[int]:
    """Lines that compare a registered setting (`x.source`, `kind`, ...) with a string or a tuple of strings."""
    def named(node) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        return name in REGISTERED_NAMES

    def strings(node) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str)
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(map(strings, node.elts))

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            sides = [node.left, *node.comparators]
            if any(named(a) and strings(b) or named(b) and strings(a) for a, b in zip(sides, sides[1:])):
                lines.append(node.lineno)
    return lines


def test_no_registered_name_is_switched_on_outside_its_registry():
    found = [f"{file.relative_to(ROOT)}:{line}: {file.read_text().splitlines()[line - 1].strip()}"
             for package in LIBRARY for file in sorted((ROOT / package).rglob("*.py"))
             for line in _string_switches(ast.parse(file.read_text(), str(file)))]
    assert not found, ("string switches on a registered name (look the name up in its registry, and ask the entry "
                       "what differs):\n" + "\n".join(f"  {f}" for f in found))


def test_the_switch_check_catches_each_form():
    source = 'if cfg.source == "text": pass\nif kind != "packed": pass\nok = args.executor in ("ray", "tpu")\n' \
             'if "nsp" == builder.kind: pass\nif name == "text": pass\nif kind == other: pass\n'
    assert _string_switches(ast.parse(source)) == [1, 2, 3, 4]
