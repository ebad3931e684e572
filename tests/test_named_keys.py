"""A message that names a `config.model.<key>` names a key the user can set: the key is in the configs (base's, or
the family's config file), so the `--config.model.<key>=value` it suggests is an override that parses."""
import pathlib
import re
import runpy

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMED = re.compile(r"config\.model\.([a-z_]+)\b(?!\()")  # a key, not a method call (config.model.get(...))


def test_every_config_model_key_a_message_names_is_in_the_configs():
    keys = set()
    for path in sorted((ROOT / "configs").glob("*.py")):
        if path.name != "__init__.py":
            keys |= set(runpy.run_path(str(path))["get_config"]().model.keys())
    named = {}
    for path in (ROOT / "bert_jax").rglob("*.py"):
        for key in NAMED.findall(path.read_text()):
            named.setdefault(key, set()).add(str(path.relative_to(ROOT)))
    absent = {key: sorted(where) for key, where in named.items() if key not in keys}
    assert not absent, f"messages name config.model keys no config has: {absent}"
    # BertConfig.from_config (every family's encoder) names hidden_act: the base config, which every family builds on,
    # has it.
    assert runpy.run_path(str(ROOT / "configs" / "base.py"))["get_config"]().model.hidden_act == "gelu"
